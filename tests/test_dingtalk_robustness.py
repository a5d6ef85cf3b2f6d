"""DingTalk field reliability, through the adapter against FakeDingTalk with the real gateway
(journal, notices, metrics) and an echo harness: every malformed robot message is skipped, counted
and acknowledged (never redelivered forever), never stops the stream, is logged without its text,
and its sender is told where the frame still names them; the messages around it are answered."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from channels.base import ChannelState
from channels.dingtalk.channel import DingTalkChannel
from tests.fakes.dingtalk_server import FakeDingTalk
from tests.fakes.gateway_rig import Rig, running
from tests.fakes.malformed import SECRET, Case, leaked, malformed_total, put, variants

ALICE = "alice01"

IDS = ("missing", "null", "number", "object", "list", "huge id", "control chars")
VALUES = ("missing", "null", "number", "object", "list", "huge list", "nested nulls")
TABLE: dict[tuple[str, ...], tuple[tuple[str, ...], bool]] = {
    ("msgId",): (IDS, False),
    ("senderStaffId",): (IDS, False),  # a 1:1 chat's id is the staff id: nobody to tell
    ("conversationType",): (("missing", "null", "number", "object", "string"), False),
    ("msgtype",): (("missing", "null", "number", "object", "list"), True),
    ("text",): (("missing", "null", "number", "string", "list"), True),
    ("text", "content"): (VALUES, True),
}


@pytest.fixture
def allowed_users() -> list[str]:
    return [ALICE]


def good(fake: FakeDingTalk) -> dict[str, Any]:
    return fake.message("", ALICE, SECRET)


def texts(fake: FakeDingTalk, needle: str) -> list[str]:
    return [m.text for m in fake.messages_to(ALICE) if needle in m.text]


@pytest.mark.parametrize("case", variants(TABLE), ids=lambda c: c.id)
async def test_malformed_message_is_skipped_counted_acked_and_told(
    case: Case, dingtalk: FakeDingTalk, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    channel = DingTalkChannel(
        dingtalk.client_id, dingtalk.client_secret, api_base=dingtalk.base_url, keepalive=1
    )
    async with running(channel, adapter_rig):
        await dingtalk.wait_for(lambda: dingtalk.ws is not None, what="the stream connection")
        await dingtalk.inject_text("", ALICE, "first good one")
        mid = await dingtalk.inject(put(good(dingtalk), case.path, case.value))
        await dingtalk.inject_text("", ALICE, "second good one")
        await dingtalk.wait_for(lambda: texts(dingtalk, "echo: second good one"), what="second answered")
        assert texts(dingtalk, "echo: first good one")
        if case.told:
            await dingtalk.wait_for(lambda: texts(dingtalk, "couldn't read that message"), what="the note")
        assert channel.state is ChannelState.CONNECTED
        assert dingtalk.acked(mid), "a malformed frame is acknowledged, so it is not sent again"
    assert channel.unreadable_events == 1
    assert malformed_total(adapter_rig, "dingtalk") == 1
    assert len(texts(dingtalk, "couldn't read")) == (1 if case.told else 0)
    assert not leaked(caplog.records), "the message's text reached a log line"
    assert all(SECRET not in m.text for m in dingtalk.sent)
