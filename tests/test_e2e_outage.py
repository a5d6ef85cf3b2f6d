"""Replies whose delivery failed are retried in-process: nothing waits for a restart.

Through `chital run` and the fake Telegram: the Bot API answers 502 to sends for a while (polls go on,
so messages keep arriving); when it recovers every answer goes out within seconds, each exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, answered, replies_to, telegram_config

SENDS = {"sendMessage", "editMessageText", "sendChatAction", "setMessageReaction"}


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = telegram_config(tmp_path, tg, model)
    cfg["agent"]["tools"] = False
    async with started_daemon(tmp_path, cfg) as d:
        yield d


async def test_twelve_502s_in_a_row_do_not_park_the_answer(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(Reply(text="the answer after the storm"))
    tg.fail_next("sendMessage", 502, times=12)
    up = tg.inject_message(OWNER, OWNER, "hello?")
    await answered(tg, OWNER, up, "the answer after the storm", timeout=60)
    assert len(replies_to(tg, OWNER, up["message"]["message_id"])) == 1
    assert "chital_delivery_retries_total" in await daemon.metrics()


async def test_sends_down_for_a_while_then_every_answer_within_seconds_once(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    n = 6
    model.script(*[Reply(text=f"answer number {i}") for i in range(n)])
    tg.down_methods |= SENDS
    ups = [tg.inject_message(OWNER, OWNER, f"question {i}") for i in range(n)]
    # Long enough that every message was received, run and parked, and backoff reached its cap.
    await tg.wait_for(lambda: len(model.requests) >= n, timeout=60, what="every turn ran")
    await asyncio.sleep(20)
    assert not tg.bot_messages(OWNER)
    tg.down_methods.clear()
    back = time.monotonic()
    for up in ups:
        await answered(tg, OWNER, up, "answer number", timeout=25)
    took = time.monotonic() - back
    assert took < 20, f"answers took {took:.1f}s after the platform came back"
    for up in ups:
        assert len(replies_to(tg, OWNER, up["message"]["message_id"])) == 1
    texts = sorted(m.text for m in tg.bot_messages(OWNER))
    assert texts == sorted(f"answer number {i}" for i in range(n))
