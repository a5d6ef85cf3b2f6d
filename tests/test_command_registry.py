"""The command registry is the one list of commands: ``/help`` (a user's, an admin's, the terminal
chat's) and the parser are derived from its rows, so a command added or removed there is added or
removed everywhere, and a ``/word`` no row names is not a command (gateway/commands/registry.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.cli.chat import Chat
from gateway.cli.chat import help_text as terminal_help
from gateway.commands.builtin import REGISTRY, parse_command
from gateway.commands.registry import CommandSpec, Registry, Who
from tests.fakes.fake_harness import FakeHarness
from tests.fakes.gateway_rig import ADMIN, USER, Rig, make_config, store_at, until

LISTED = re.compile(r"^/([a-z0-9_]+) — ", re.MULTILINE)
"""A command's line in a help text."""
NOT_COMMANDS = ("quit", "exit", "frob", "newx", "helpme", "stops", "admin", "commands", "start")


async def _ask(rig: Rig, sender: int, text: str) -> str:
    msg = rig.channel.message(sender, text)
    await rig.channel.deliver(msg)
    (reply,) = await until(lambda: rig.channel.replies_to(msg.message_id), what=text)
    return reply


async def test_help_lists_exactly_the_commands_the_asker_may_run(rig: Rig) -> None:
    anyone, admin = REGISTRY.names(Who.ANYONE), REGISTRY.names(Who.ADMIN)
    assert {"new", "stop", "status", "help"} <= set(anyone) and {"approve", "deny", "revoke"} <= set(admin)

    users = await _ask(rig, USER, "/help")
    assert LISTED.findall(users) == anyone, users
    assert "Admin:" not in users

    admins = await _ask(rig, ADMIN, "/help")
    assert LISTED.findall(admins) == anyone + admin, admins
    before, _, after = admins.partition("\nAdmin:\n")
    assert LISTED.findall(before) == anyone and LISTED.findall(after) == admin
    assert admins.endswith("Anything else you write goes to the agent.")


async def test_every_registry_name_is_a_command_and_no_other_word_is(rig: Rig) -> None:
    for row in REGISTRY.rows:
        reply = await _ask(rig, USER, f"/{row.name}")
        assert not reply.startswith("Unknown command"), (row.name, reply)
        if row.who is Who.ADMIN:  # who may run it comes from the row as well
            assert reply == f"Sorry, only an admin of this bot can use /{row.name}.", reply
    for word in NOT_COMMANDS:
        reply = await _ask(rig, USER, f"/{word} now")
        assert reply.startswith(f"Unknown command /{word}."), reply
    assert rig.harness.calls == [], "a command never reaches the agent"


def test_the_parser_accepts_exactly_the_registry_names() -> None:
    for row in REGISTRY.rows:
        for typed in (f"/{row.name}", f"/{row.name.upper()}@chital_bot  x y", f"  /{row.name}\n"):
            parsed = parse_command(typed)
            assert parsed is not None and parsed.known and parsed.name == row.name, typed
    for word in NOT_COMMANDS:
        parsed = parse_command(f"/{word}")
        assert parsed is not None and not parsed.known, word


async def _noop(*_: object) -> str:
    return ""


def test_a_registry_derives_its_parser_and_help_from_its_rows() -> None:
    """Another table, another parser and help: nothing about the commands is kept elsewhere."""
    own = Registry(
        [
            CommandSpec("ping", "answer pong", _noop, aliases=("p",)),
            CommandSpec("wipe", "wipe it all", _noop, who=Who.ADMIN),
        ]
    )
    assert own.parse("/ping").known and own.parse("/wipe x").known  # type: ignore[union-attr]
    alias = own.parse("/P@bot now")
    assert alias is not None and alias.known and alias.name == "ping" and alias.args == "now"
    assert not own.parse("/new").known  # type: ignore[union-attr]  # the real table's, not this one's
    assert own.help_lines() == ["Commands:", "/ping — answer pong"]
    assert own.help_lines(admin=True) == ["Commands:", "/ping — answer pong", "Admin:", "/wipe — wipe it all"]
    with pytest.raises(ValueError, match="twice"):
        Registry([CommandSpec("ping", "", _noop), CommandSpec("ping", "", _noop)])
    with pytest.raises(ValueError, match="cannot be typed"):
        Registry([CommandSpec("data-analysis", "", _noop)])  # Telegram takes no hyphen in a command


async def test_the_terminal_chat_offers_and_answers_the_rows_marked_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    here = [row.name for row in REGISTRY.rows if row.terminal]
    assert {"new", "status", "help"} <= set(here) and "stop" not in here and "approve" not in here
    assert LISTED.findall(terminal_help()) == here

    store = await store_at(tmp_path / "gateway.sqlite")
    try:
        chat = Chat(make_config(), store, FakeHarness(), None, [])
        chat.thread_id = await store.thread_for(chat.user)
        for row in REGISTRY.rows:
            parsed = parse_command(f"/{row.name}")
            assert parsed is not None
            assert await chat.command(parsed)
            shown = capsys.readouterr().out
            elsewhere = "works in the chats the daemon" in shown
            assert elsewhere is not (row.terminal or row.who is Who.ADMIN or row.name == "stop"), (
                row.name,
                shown,
            )
    finally:
        await store.close()
