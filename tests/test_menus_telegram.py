"""Telegram's native command menu, end to end: ``chital run`` on the fake Bot API publishes the
command registry with setMyCommands per scope (private chats, groups, each known admin's private
chat), keeps admin-only commands out of the public scopes, masks secrets and neutralises untrusted
text in skill lines, refreshes when a skill goes away, and survives a refused setMyCommands. A
command picked from the menu is the text ``/name``: it meets the same registry row and the same
permission checks as a typed one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon import chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram
from tests.skill_archives import skill_md

ADMIN, USER, SILENT_ADMIN = 7101, 7102, 7103
"""SILENT_ADMIN never opened the bot: Telegram does not know a private chat with them."""
ADMIN_ONLY = {"approve", "deny", "revoke"}


def config(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> dict[str, Any]:
    cfg = chat_config(
        tmp_path, model.base_url, tg, allow=[f"telegram:{ADMIN}", f"telegram:{USER}"],
        access={"admins": [f"telegram:{ADMIN}", f"telegram:{SILENT_ADMIN}", "telegram:*x"]},
    )  # fmt: skip
    cfg["agent"]["skills"] = {"custom_dir": str(tmp_path / "custom"), "reload_seconds": 0}
    return cfg


def add_skill(tmp_path: Path, name: str, description: str) -> None:
    folder = tmp_path / "custom" / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_bytes(skill_md(name, description))


async def reply(tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str) -> str:
    mid = update["message"]["message_id"]

    def check() -> str | None:
        return next((m.text for m in tg.bot_messages(chat) if m.reply_to == mid and needle in m.text), None)

    return await tg.wait_for(check, timeout=30, what=f"a reply with {needle!r}")


async def test_menus_per_scope_admin_only_hidden_and_refreshed(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    # A skill whose description carries the bot token and a right-to-left override: neither may
    # reach Telegram's menu (the menu is public: anyone in a group reads it).
    add_skill(tmp_path, "house-style", f"Write in the house style \u202e{tg.token} now.")
    tg.inject_message(ADMIN, ADMIN, "hello")  # the admin's private chat exists on Telegram
    async with started_daemon(tmp_path, config(tmp_path, model, tg)):
        private = await tg.wait_for(lambda: tg.menu("all_private_chats"), what="the private-chat menu")
        groups = await tg.wait_for(lambda: tg.menu("all_group_chats"), what="the group menu")
        admin = await tg.wait_for(lambda: tg.menu("chat", ADMIN), what="the admin's menu")
        for public in (private, groups):
            assert {"new", "stop", "status", "model", "help", "skills", "house_style"} <= set(public)
            assert not ADMIN_ONLY & set(public), "admin-only commands stay out of the public scopes"
        assert ADMIN_ONLY <= set(admin) and set(private) <= set(admin)
        assert private.index("new") < private.index("help") < private.index("house_style"), "/help order"
        assert tg.menu("default") == [], "the default scope (BotFather's) is left alone"
        assert (("chat", SILENT_ADMIN, "")) not in tg.my_commands, "an unknown chat is skipped"
        published = str(tg.my_commands)
        assert tg.token not in published and "\u202e" not in published
        style = next(
            c for c in tg.my_commands[("all_private_chats", None, "")] if c["command"] == "house_style"
        )
        assert style["description"].startswith("skill: Write in the house style")
        for commands in tg.my_commands.values():
            assert len(commands) <= 100
            assert all(1 <= len(c["description"]) <= 256 for c in commands)
        # A menu command is typed text: /approve from a non-admin is refused as when typed.
        up = tg.inject_message(USER, USER, "/approve")
        assert "only an admin" in await reply(tg, USER, up, "admin")
        # The admin removes the skill: the menus follow without a restart.
        up = tg.inject_message(ADMIN, ADMIN, "/skills remove house-style")
        await reply(tg, ADMIN, up, "Removed")
        for scope, chat in (("all_private_chats", None), ("all_group_chats", None), ("chat", ADMIN)):
            await tg.wait_for(
                lambda s=scope, c=chat: "house_style" not in tg.menu(s, c), what=f"{scope} refreshed"
            )
        assert "new" in tg.menu("all_private_chats"), "the refresh replaced the list, not emptied it"


async def test_refused_menu_leaves_typed_commands_working(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    """setMyCommands failing (Telegram's 500s) costs the menu, never the channel: typed commands
    answer, the operator reads why in the log (no token), and the next start publishes it."""
    tg.fail_next("setMyCommands", 500, times=10)
    cfg = config(tmp_path, model, tg)
    async with started_daemon(tmp_path, cfg) as daemon:
        await tg.wait_for(lambda: tg.calls_to("setMyCommands"), what="a menu attempt")
        up = tg.inject_message(USER, USER, "/help")
        assert "/model" in await reply(tg, USER, up, "Commands")
        assert tg.my_commands == {}
        await tg.wait_for(lambda: "command menu not published" in daemon.logs(), what="the log line")
        assert tg.token not in daemon.logs()
        await daemon.terminate()
    tg._failures.clear()
    async with started_daemon(tmp_path, cfg):
        await tg.wait_for(lambda: tg.menu("all_private_chats"), what="the menu after a restart")
