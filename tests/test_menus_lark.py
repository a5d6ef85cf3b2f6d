"""Lark's bot menu, end to end: ``chital run`` with the real lark-oapi websocket client on the fake
Lark takes ``application.bot.menu_v6`` events, maps the ``event_key`` to the command it names, and
answers in the person's one-to-one chat through the normal reply path, with the same registry rows
and access checks as typed text. Malformed menu events are acked, counted and (where the person is
named) answered, never a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon import chat_config, started_daemon
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI
from tests.lark_daemon import FRIEND, P2P, STRANGER

ADMIN = "ou_admin"


def config(tmp_path: Path, model: FakeOpenAI, lark: FakeLark) -> dict[str, Any]:
    cfg = chat_config(
        tmp_path, model.base_url, lark, allow=[f"lark:{FRIEND}", f"lark:{ADMIN}"],
        group_policy="mention", access={"admins": [f"lark:{ADMIN}"]},
    )  # fmt: skip
    cfg["access"]["pairing"] = True
    return cfg


async def shows(lark: FakeLark, chat: str, needle: str, timeout: float = 20) -> str:
    def check(f: FakeLark) -> str | None:
        return next((m.text for m in f.bot_messages(chat) if needle in m.text), None)

    return await lark.wait_for_async(check, timeout=timeout)


async def test_menu_events_run_commands_like_typed_text(
    tmp_path: Path, lark: FakeLark, model: FakeOpenAI
) -> None:
    async with started_daemon(tmp_path, config(tmp_path, model, lark)) as daemon:
        # Before the person ever wrote: answered by open_id, into their one-to-one chat.
        inj = lark.inject_menu(FRIEND, "help")
        text = await shows(lark, P2P, "Commands:")
        assert "/approve" not in text, "a non-admin's /help"
        # The ack travels on the websocket, the answer over HTTP: either may reach the fake first.
        await lark.wait_for_async(lambda f: f.acks_for(inj), timeout=20)
        assert lark.acks_for(inj) == [200]
        # After a message in the DM, the menu's commands act on that same conversation.
        lark.inject_message(P2P, FRIEND, "hello")
        await shows(lark, P2P, "echo: hello")
        lark.inject_menu(FRIEND, "/status")
        await shows(lark, P2P, "Thread:")
        # A key with arguments, a key no command has, an admin-only one from a non-admin.
        lark.inject_menu(FRIEND, "model no-such-model")
        await shows(lark, P2P, "no-such-model")
        lark.inject_menu(FRIEND, "bogus")
        await shows(lark, P2P, "Unknown command /bogus")
        lark.inject_menu(FRIEND, "approve ABCD1234")
        await shows(lark, P2P, "only an admin")
        lark.inject_menu(ADMIN, "approve")
        answer = await lark.wait_for_async(lambda f: f.bot_messages(lark.p2p_chat(ADMIN)), timeout=20)
        assert all("only an admin" not in m.text for m in answer)
        # A stranger gets the pairing path, never the agent.
        before = len(model.requests)
        lark.inject_menu(STRANGER, "help")
        pairing = await lark.wait_for_async(lambda f: f.bot_messages(lark.p2p_chat(STRANGER)), timeout=20)
        assert "Commands:" not in pairing[0].text
        assert len(model.requests) == before
        # The same event again (a redelivery) is answered once.
        lark.redeliver(inj)
        lark.inject_menu(FRIEND, "plan")
        await shows(lark, P2P, "plan")
        helps = [m for m in lark.bot_messages(P2P) if "Commands:" in m.text and "Unknown" not in m.text]
        assert len(helps) == 1
        assert daemon.proc is not None and daemon.proc.returncode is None


async def test_malformed_menu_events_are_acked_and_counted(
    tmp_path: Path, lark: FakeLark, model: FakeOpenAI
) -> None:
    def drop(*path: str) -> Any:
        def mutate(body: dict[str, Any]) -> None:
            node = body
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = None

        return mutate

    def other_app(body: dict[str, Any]) -> None:
        body["header"]["app_id"] = "cli_someone_else"

    async with started_daemon(tmp_path, config(tmp_path, model, lark)) as daemon:
        told = [
            lark.inject_menu(FRIEND, None),  # no key
            lark.inject_menu(FRIEND, {"k": 1}),  # a key that is not a string
            lark.inject_menu(FRIEND, "!! no command"),  # not a command's shape
            lark.inject_menu(FRIEND, "help", mutate=other_app),  # another app's: forged
        ]
        silent = [
            lark.inject_menu(FRIEND, "help", mutate=drop("event", "operator")),  # nobody to tell
            lark.inject_menu("ou_" + "x" * 400, "help"),  # an id no platform sends
        ]
        for inj in told + silent:
            await lark.wait_for_async(lambda f, i=inj: f.acks_for(i), timeout=20)
            assert lark.acks_for(inj) == [200], "acked: Lark would redeliver it forever"
        await shows(lark, P2P, "couldn't read")
        metrics = await daemon.metrics()
        assert 'chital_malformed_events_total{kind="command",platform="lark"} 6.0' in metrics
        # Still serving.
        lark.inject_menu(FRIEND, "help")
        await shows(lark, P2P, "Commands:")
        assert not model.requests
