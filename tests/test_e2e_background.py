"""Background tasks end to end: `chital run` against the fake Telegram, the fake Slack and the fake
model (docs/background-tasks.md). Asserted is what people see in the chat and what the model was
asked: ``/bg`` and the agent's ``start_background_task`` start a task that works while the chat is
answered; ``/tasks`` lists it with its progress, its text inert and masked; the result is a reply to
the request, once, also across a kill -9; ``/tasks stop`` is its owner's or an admin's; the per-user
cap refuses with a note; a revoked owner's task ends without a word; ``/stop`` leaves tasks alone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.gateway_rig import daemon_rows
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.slack_daemon import DM, FRIEND
from tests.telegram_daemon import replies_to

ADMIN = 1001
MEMBER = 1002
GROUP = -100500600
SECRET = "sk-test-backgroundsecret-9f8e7d6c5b4a"
NO_MEMORY = {"memory": {"enabled": False}}
"""No memory extraction: every model call is a turn's."""


def tg_config(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, **sections: Any) -> dict[str, Any]:
    sections.setdefault("agent", NO_MEMORY)
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[str(MEMBER)], **sections)
    cfg["access"].update(admins=[str(ADMIN)], pairing=True, group_policy="mention")
    cfg["models"][0]["api_key"] = SECRET  # a secret of the daemon's: never shown in chat
    return cfg


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, tg_config(tmp_path, tg, model)) as d:
        yield d


def say(tg: FakeTelegram, user: int, text: str, chat: int | None = None) -> dict[str, Any]:
    chat = user if chat is None else chat
    kind = "private" if chat == user else "supergroup"
    if text.startswith("/"):
        name, _, args = text[1:].partition(" ")
        return tg.inject_command(chat, user, name, args, chat_type=kind, at=None if kind == "private" else "")
    if kind != "private":
        return tg.inject_mention(chat, user, text)
    return tg.inject_message(chat, user, text)


async def reply(tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str, timeout: float = 20) -> Any:
    """The bot's message replying to ``update`` once it shows ``needle``."""
    mid = update["message"]["message_id"]

    def check() -> Any:
        return next((m for m in replies_to(tg, chat, mid) if needle in m.text), None)

    return await tg.wait_for(check, timeout=timeout, what=f"reply with {needle!r}")


def asked(model: FakeOpenAI, needle: str) -> list[dict[str, Any]]:
    """The model requests whose last user message holds ``needle``."""
    return [r for r in model.requests if needle in last_user_text(r)]


def held_task(model: FakeOpenAI, needle: str, answer: str) -> asyncio.Event:
    """A model whose answer to a request carrying ``needle`` waits until the returned event is set."""
    held = asyncio.Event()
    model.add_rule(lambda t: needle in t, Reply(text=answer, hold=held))
    return held


# -- /bg: the chat stays free, the result is a reply to the request --------------------------------
async def test_bg_runs_while_the_chat_is_answered_and_reports_once_as_a_reply(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    held = held_task(model, "BGJOB", "The report is compiled: 42 rows.")
    ask = say(tg, MEMBER, "/bg BGJOB compile the quarterly report")
    started = await reply(tg, MEMBER, ask, "Started background task #1")
    assert "/tasks stop 1" in started.text and started.spans("code") == ["BGJOB compile the quarterly report"]
    await tg.wait_for(lambda: asked(model, "BGJOB") or None, what="the task's model call")

    chat = say(tg, MEMBER, "what is the capital of France")
    await reply(tg, MEMBER, chat, "echo: what is the capital of France")  # while the task still runs
    assert not held.is_set()

    listing = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    assert "1 running" in listing.text and "#1 ⏳ running for" in listing.text, listing.text
    assert "0 step(s)" in listing.text, "progress: the steps its thread has taken so far"
    assert "BGJOB compile the quarterly report" in listing.spans("code")

    held.set()
    result = await reply(tg, MEMBER, ask, "The report is compiled")
    assert result.text.startswith("🧵 Background task #1:"), result.text
    request = asked(model, "BGJOB")[0]
    text = last_user_text(request)
    assert "[Background task #1" in text and text.endswith("BGJOB compile the quarterly report")
    assert "what is the capital" not in json.dumps(request["messages"]), "its own thread, not the chat's"

    done = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    assert "#1 ✅ finished" in done.text and "0 running" in done.text
    await asyncio.sleep(0)
    results = [m for m in replies_to(tg, MEMBER, ask["message"]["message_id"]) if "42 rows" in m.text]
    assert len(results) == 1
    assert len(asked(model, "BGJOB")) == 1
