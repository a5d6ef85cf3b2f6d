"""WeCom field reliability, through WeComChannel against FakeWeCom with the real gateway (journal,
notices, metrics) and an echo harness: every malformed callback is skipped and counted, never
stops the connection, is logged without its text, and its sender is told where the callback still
names them; the messages around it are answered."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from channels.base import ChannelState
from channels.wecom.channel import WeComChannel
from tests.fakes.gateway_rig import Rig, running
from tests.fakes.malformed import SECRET, Case, leaked, malformed_total, put, variants
from tests.fakes.wecom_server import FakeWeCom

ALICE = "alice"


@pytest.fixture
def allowed_users() -> list[str]:
    return [f"wecom:{ALICE}"]


IDS = ("missing", "null", "number", "object", "list", "huge id", "control chars")
TABLE: dict[tuple[str, ...], tuple[tuple[str, ...], bool]] = {
    ("msgid",): (IDS, False),
    ("from",): (("missing", "null", "number", "string", "list"), False),
    ("from", "userid"): (IDS, False),
    ("chattype",): (("number", "object", "string"), True),
    ("msgtype",): (("missing", "null", "number", "object", "list"), True),
    ("text",): (("missing", "null", "number", "string", "list"), True),
    ("text", "content"): (("missing", "null", "number", "object", "list", "huge list", "nested nulls"), True),
}


def good_body() -> dict[str, Any]:
    return {"msgid": "m-good-1", "aibotid": "aib", "chattype": "single", "from": {"userid": ALICE},
            "msgtype": "text", "text": {"content": SECRET}}  # fmt: skip


def texts(fake: FakeWeCom, needle: str) -> list[str]:
    return [m.text for m in fake.bot_messages(ALICE) if needle in m.text and m.finished]


@pytest.mark.parametrize("case", variants(TABLE), ids=lambda c: c.id)
async def test_malformed_callback_is_skipped_counted_and_told(
    case: Case, wecom: FakeWeCom, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    channel = WeComChannel(wecom.bot_id, wecom.secret, ws_url=wecom.url, heartbeat_interval=5.0)
    async with running(channel, adapter_rig):
        wecom.inject_text(ALICE, "first good one")
        wecom.inject_body(put(good_body(), case.path, case.value), chat=ALICE)
        wecom.inject_text(ALICE, "second good one")
        await wecom.wait_for(lambda: texts(wecom, "echo: second good one"), what="second answered")
        assert texts(wecom, "echo: first good one")
        if case.told:
            await wecom.wait_for(lambda: texts(wecom, "couldn't read that message"), what="the note")
        assert channel.state is ChannelState.CONNECTED
    assert channel.unreadable_events == 1
    assert malformed_total(adapter_rig, "wecom") == 1
    assert len(texts(wecom, "couldn't read")) == (1 if case.told else 0)
    assert not leaked(caplog.records), "the callback's text reached a log line"
    assert all(SECRET not in m.text for m in wecom.bot_messages(ALICE))
