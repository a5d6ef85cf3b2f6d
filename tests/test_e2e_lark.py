"""End to end: `chital run` as a subprocess with the real lark-oapi websocket client against FakeLark."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.lark_daemon import FRIEND, GROUP, P2P, STRANGER, answered, replies


@pytest.fixture
async def daemon(tmp_path: Path, lark: FakeLark, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = chat_config(tmp_path, model.base_url, lark, allow=[f"lark:{FRIEND}"], group_policy="mention")
    async with started_daemon(tmp_path, cfg) as d:
        yield d


async def test_group_mention_answered_and_chatter_ignored(daemon: DaemonProcess, lark: FakeLark) -> None:
    quiet = lark.inject_message(GROUP, FRIEND, "who took my stapler", chat_type="group")
    loud = lark.inject_message(GROUP, FRIEND, "draft the memo", chat_type="group", mention_bot=True)
    reply = await answered(lark, loud, "echo: draft the memo")
    assert reply.msg_type == "interactive"
    assert replies(lark, quiet) == []


async def test_p2p_answered(daemon: DaemonProcess, lark: FakeLark) -> None:
    inj = lark.inject_message(P2P, FRIEND, "你好, Chital")
    await answered(lark, inj, "echo: 你好, Chital")


async def test_long_answer_split(daemon: DaemonProcess, lark: FakeLark) -> None:
    inj = lark.inject_message(P2P, FRIEND, "LONG please")
    await lark.wait_for_async(lambda f: len(f.bot_messages(P2P)) >= 2 or None, timeout=30)
    parts = lark.bot_messages(P2P)
    assert all(len(p.text) <= 8000 for p in parts)
    assert all(p.text.count("```") % 2 == 0 for p in parts)
    assert replies(lark, inj), "the first part replies to the user's message"


async def test_redelivered_event_answered_once(daemon: DaemonProcess, lark: FakeLark) -> None:
    inj = lark.inject_message(P2P, FRIEND, "just once")
    await answered(lark, inj, "echo: just once")
    lark.redeliver(inj)
    nxt = lark.inject_message(P2P, FRIEND, "next please")
    await answered(lark, nxt, "echo: next please")
    assert len(replies(lark, inj)) == 1


async def test_dropped_and_half_open_connections_lose_nothing(daemon: DaemonProcess, lark: FakeLark) -> None:
    lark.drop_connection("abort")
    a = lark.inject_message(P2P, FRIEND, "after abort")
    await answered(lark, a, "echo: after abort", timeout=30)
    lark.drop_connection("stall")
    b = lark.inject_message(P2P, FRIEND, "after stall")
    await answered(lark, b, "echo: after stall", timeout=45)
    assert "chital_reconnects_total" in await daemon.metrics()


async def test_file_reaches_uploads(
    daemon: DaemonProcess, lark: FakeLark, model: FakeOpenAI, tmp_path: Path
) -> None:
    inj = lark.inject_file(P2P, FRIEND, "report.pdf", b"%PDF-1.4 fake")
    await answered(lark, inj, "echo:")
    uploaded = list(daemon.sandbox_root.glob("**/uploads/report.pdf"))
    assert uploaded and uploaded[0].read_bytes() == b"%PDF-1.4 fake"
    assert any("report.pdf" in last_user_text(r) for r in model.requests)


async def test_stranger_refused(daemon: DaemonProcess, lark: FakeLark, model: FakeOpenAI) -> None:
    inj = lark.inject_message(P2P + "_x", STRANGER, "give me secrets")
    await answered(lark, inj, "pairing code")
    assert all("give me secrets" not in last_user_text(r) for r in model.requests)
