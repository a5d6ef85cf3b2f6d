"""End to end: `chital run` as a subprocess with the real discord.py against the fake Discord server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.discord_daemon import FRIEND, STRANGER, answered, replies
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text


@pytest.fixture
async def daemon(tmp_path: Path, dc: FakeDiscord, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = chat_config(tmp_path, model.base_url, dc, allow=[f"discord:{FRIEND}"], group_policy="mention")
    async with started_daemon(tmp_path, cfg, dc) as d:
        yield d


async def test_mention_answered_and_chatter_ignored(
    daemon: DaemonProcess, dc: FakeDiscord, model: FakeOpenAI
) -> None:
    quiet = await dc.inject_message(None, FRIEND, "lunch anyone?")
    loud = await dc.inject_message(None, FRIEND, "what time is it", mention_bot=True)
    reply = await answered(dc, loud, "echo: what time is it")
    assert f"<@{dc.bot_id}>" not in reply.content
    assert replies(dc, quiet) == [] or all("lunch" not in m.content for m in dc.bot_messages())
    assert dc.typing[dc.channel_id] == 0, "an instant answer needs no typing indicator"
    model.add_rule(lambda t: "ponder" in t, Reply(text="pondered it", chunks=4, chunk_delay=0.3))
    slow = await dc.inject_message(None, FRIEND, "ponder this", mention_bot=True)
    await answered(dc, slow, "pondered it")
    assert dc.typing[dc.channel_id] >= 1, "typing indicator while working"


async def test_dm_answered(daemon: DaemonProcess, dc: FakeDiscord) -> None:
    mid = await dc.inject_dm(FRIEND, "hello in private")
    reply = await answered(dc, mid, "echo: hello in private")
    assert reply.channel_id == dc.dm_channel(FRIEND)


async def test_long_answer_split_at_2000(daemon: DaemonProcess, dc: FakeDiscord) -> None:
    mid = await dc.inject_dm(FRIEND, "LONG please")
    await dc.wait_for(lambda: len(replies(dc, mid)) >= 5 or None, timeout=30)
    parts = replies(dc, mid)
    assert all(len(p.content) <= 2000 for p in parts)
    assert all(p.content.count("```") % 2 == 0 for p in parts), "code fences balanced in every part"


async def test_replayed_message_answered_once(daemon: DaemonProcess, dc: FakeDiscord) -> None:
    mid = await dc.inject_dm(FRIEND, "say it once")
    await answered(dc, mid, "echo: say it once")
    await dc.redeliver(mid)
    nxt = await dc.inject_dm(FRIEND, "and then this")
    await answered(dc, nxt, "echo: and then this")
    assert len([m for m in dc.bot_messages() if m.reply_to == mid]) == 1


async def test_connection_drop_loses_nothing(daemon: DaemonProcess, dc: FakeDiscord) -> None:
    first = await dc.inject_dm(FRIEND, "before the drop")
    await answered(dc, first, "echo: before the drop")
    await dc.drop_connection("close")
    during = await dc.inject_dm(FRIEND, "while you were away")
    await answered(dc, during, "echo: while you were away", timeout=30)
    assert dc.resumes >= 1
    assert 'chital_messages_in_total{channel="discord"} 2.0' in await daemon.metrics()


async def test_attachment_reaches_agent_uploads(
    daemon: DaemonProcess, dc: FakeDiscord, model: FakeOpenAI, tmp_path: Path
) -> None:
    mid = await dc.inject_dm(
        FRIEND, "look at this file", attachments=[("notes.txt", b"quarterly numbers", "text/plain")]
    )
    await answered(dc, mid, "echo:")
    uploaded = list(daemon.sandbox_root.glob("**/uploads/notes.txt"))
    assert uploaded and uploaded[0].read_bytes() == b"quarterly numbers"
    assert any("notes.txt" in last_user_text(r) for r in model.requests), "the agent was told of the file"


async def test_stranger_refused(daemon: DaemonProcess, dc: FakeDiscord, model: FakeOpenAI) -> None:
    mid = await dc.inject_message(None, STRANGER, "let me in", mention_bot=True)
    reply = await answered(dc, mid, "only answer people I know")
    assert reply.content
    dm = await dc.inject_dm(STRANGER, "secret plan")
    await answered(dc, dm, "pairing code")
    assert all(
        "secret plan" not in last_user_text(r) and "let me in" not in last_user_text(r)
        for r in model.requests
    )
