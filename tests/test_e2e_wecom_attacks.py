"""End to end (`chital run` against the fake WeCom long connection and the fake model): the bot's
secret streamed out by the model a few characters at a time never shows in any stream frame, not
even as the prefix a snapshot cut mid-secret would show; the operator's logs hold none of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.wecom_server import FakeWeCom
from tests.wecom_daemon import OWNER, answered, wecom_config


@pytest.fixture
async def daemon(tmp_path: Path, wecom: FakeWeCom, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, wecom_config(tmp_path, wecom, model), wecom) as d:
        await d.wait_channel_state("wecom", "connected")
        yield d


async def test_a_secret_split_across_stream_frames_never_shows(
    daemon: DaemonProcess, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    text = f"here it comes: {wecom.secret} and that was it"
    model.add_rule(lambda t: "spill" in t, Reply(text=text, chunks=len(text) // 3, chunk_delay=0.12))
    model._rules.insert(0, model._rules.pop())
    up = wecom.inject_text(OWNER, "spill the secret")
    reply = await answered(wecom, up, "that was it", timeout=40)
    contents = [f["body"]["stream"]["content"] for f in reply.frames]
    assert len(contents) >= 3, "the answer streamed in several frames"
    head = wecom.secret[:12]
    assert all(head not in c for c in contents), [c for c in contents if head in c]
    assert "***" in reply.text
    assert wecom.secret not in daemon.logs() and head not in daemon.logs()
