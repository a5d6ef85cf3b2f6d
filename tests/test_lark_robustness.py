"""Lark field reliability, through lark-oapi against FakeLark: an event that cannot be read is acked
and skipped, non-text messages get a visible outcome, a token endpoint blip is not fatal.

Outcomes are asserted as the user sees them, with the real gateway and an echo harness.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from channels.base import ChannelState
from channels.lark import LarkChannel
from gateway.ops.metrics import Metrics
from gateway.ops.supervisor import Backoff, ChannelSupervisor
from tests.fakes.gateway_rig import Rig, running
from tests.fakes.lark_server import FakeLark, Injected
from tests.fakes.malformed import SECRET, Case, leaked, malformed_total, put, variants

ALICE = "ou_alice"


@pytest.fixture
def lark_ping() -> int:
    return 30  # no pings among the frames these tests count


@pytest.fixture
def allowed_users() -> list[str]:
    return [ALICE]


CHAT = "oc_alice"


@pytest.fixture
def channel(lark: FakeLark) -> LarkChannel:
    return LarkChannel(lark.app_id, lark.app_secret, domain=lark.base_url, liveness_timeout=5.0)


def says(needle: str) -> Callable[[FakeLark], list[Any]]:
    return lambda f: [m for m in f.bot_messages(CHAT) if needle in m.text]


async def acked(lark: FakeLark, *events: Injected) -> None:
    await lark.wait_for_async(lambda f: all(f.acks_for(e) for e in events))


def drop_sender(body: dict[str, Any]) -> None:
    del body["event"]["sender"]


# -- unreadable events ---------------------------------------------------------------------------
BAD_CONTENT: dict[str, tuple[str, str]] = {
    "content is not JSON": ("text", '{"text": "secret words'),
    "content is a list": ("text", '["secret words"]'),
    "text is an object": ("text", '{"text": {"secret": "words"}}'),
}


@pytest.mark.parametrize("shape", list(BAD_CONTENT))
async def test_bad_content_is_skipped_acked_and_its_sender_told(
    shape: str, lark: FakeLark, channel: LarkChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    msg_type, content = BAD_CONTENT[shape]
    async with running(channel, adapter_rig):
        first = lark.inject_message(CHAT, ALICE, "first good one")
        bad = lark.inject_event(CHAT, ALICE, msg_type, content)
        second = lark.inject_message(CHAT, ALICE, "second good one")
        await lark.wait_for_async(says("echo: second good one"))
        (note,) = await lark.wait_for_async(says("couldn't read that message"))
        assert await lark.wait_for_async(says("echo: first good one"))
        await acked(lark, first, bad, second)
        assert channel.state is ChannelState.CONNECTED
    assert lark.acks_for(bad) == [200], "acked as handled: never redelivered"
    assert note.parent_id == bad.message_id
    assert adapter_rig.metric("chital_messages_ignored_total", channel="lark", reason="malformed") == 1
    critical = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert critical and bad.message_id in critical[0] and CHAT in critical[0]
    for record in caplog.records:
        assert "secret" not in record.getMessage() + (record.exc_text or ""), record.getMessage()


async def test_unparseable_frames_are_acked_and_counted(
    lark: FakeLark, channel: LarkChannel, adapter_rig: Rig
) -> None:
    other_type = {"schema": "2.0", "header": {"event_id": "ev_read", "event_type": "im.message.message_read_v1"},
                  "event": {}}  # fmt: skip
    async with running(channel, adapter_rig):
        not_json = lark.inject_payload(b"secret words, not JSON")
        no_header = lark.inject_payload(json.dumps({"schema": "2.0", "event": {}}).encode())
        no_sender = lark.inject_event(CHAT, ALICE, "text", {"text": "who am I"}, mutate=drop_sender)
        read_receipt = lark.inject_payload(json.dumps(other_type).encode())
        after = lark.inject_message(CHAT, ALICE, "after them")
        await lark.wait_for_async(says("echo: after them"))
        await acked(lark, not_json, no_header, no_sender, read_receipt, after)
        assert channel.state is ChannelState.CONNECTED
    for event in (not_json, no_header, no_sender, read_receipt):
        assert lark.acks_for(event) == [200]
    assert not says("couldn't read")(lark), "no sender could be recovered: nobody to tell"
    # the read receipt is another event type: acked and ignored, not counted as malformed
    assert adapter_rig.metric("chital_messages_ignored_total", channel="lark", reason="malformed") == 3


async def test_lone_surrogate_is_replaced_and_answered(
    lark: FakeLark, channel: LarkChannel, adapter_rig: Rig
) -> None:
    async with running(channel, adapter_rig):
        lark.inject_event(CHAT, ALICE, "text", '{"text": "bad \\ud800 char"}')
        (reply,) = await lark.wait_for_async(says("echo: "))
    assert reply.text == "echo: bad \ufffd char"


# -- non-text messages ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("msg_type", "content", "agent_reads"),
    [
        ("location", {"name": "Tower", "latitude": "39.9", "longitude": "116.4"}, "📍 location: 39.9, 116.4 (Tower)"),
        ("vote", {"topic": "Lunch?", "options": ["noodles", "rice"]}, "📊 poll: Lunch?\n- noodles\n- rice"),
        ("share_calendar_event", {"summary": "Standup", "start_time": "1700000000000", "end_time": "1700000900000"},
         "📅 event: Standup (2023-11-14 22:13 UTC – 2023-11-14 22:28 UTC)"),
        ("video_chat", {"topic": "Retro", "start_time": "1700000000000"}, "📹 meeting: Retro (2023-11-14 22:13 UTC)"),
    ],
    ids=["location", "vote", "calendar", "video_chat"],
)  # fmt: skip
async def test_usable_kinds_become_text(
    msg_type: str,
    content: dict[str, Any],
    agent_reads: str,
    lark: FakeLark,
    channel: LarkChannel,
    adapter_rig: Rig,
) -> None:
    async with running(channel, adapter_rig):
        lark.inject_event(CHAT, ALICE, msg_type, content)
        await lark.wait_for_async(says("echo: "))
    assert adapter_rig.harness.seen == [(agent_reads, [])]


@pytest.mark.parametrize(
    ("msg_type", "content", "kind"),
    [
        ("sticker", {"file_key": "sticker_v2_1"}, "stickers"),
        ("share_chat", {"chat_id": "oc_other"}, "shared group chats"),
        ("merge_forward", {"content": "Merged and Forwarded Message"}, "forwarded chat histories"),
        ("brand_new_kind", {"x": 1}, "messages of this kind"),
    ],
    ids=["sticker", "share_chat", "merge_forward", "unknown"],
)
async def test_unusable_kinds_get_a_plain_note(
    msg_type: str, content: dict[str, Any], kind: str, lark: FakeLark, channel: LarkChannel, adapter_rig: Rig
) -> None:
    async with running(channel, adapter_rig):
        sent = lark.inject_event(CHAT, ALICE, msg_type, content)
        (note,) = await lark.wait_for_async(says("I can't use"))
    assert note.text == f"I can't use {kind} yet; please describe what you need in words."
    assert note.parent_id == sent.message_id and adapter_rig.harness.seen == []


# -- fatal vs transient ---------------------------------------------------------------------------
async def test_token_endpoint_blip_is_retried_and_bad_secret_is_fatal() -> None:
    # Own app ids: lark-oapi caches tenant tokens per app id across clients in the process.
    token_path = "/open-apis/auth/v3/tenant_access_token/internal"
    with FakeLark(app_id="cli_blip_once") as server:
        server.fail_next("POST", "tenant_access_token", status=500, code=1, msg="busy")
        channel = LarkChannel(server.app_id, server.app_secret, domain=server.base_url, liveness_timeout=5.0)
        sup = ChannelSupervisor(channel, lambda _i: asyncio.sleep(0), Metrics(), Backoff(base=0.05, cap=0.1))
        sup.start()
        try:
            await server.wait_for_async(lambda _f: channel.state is ChannelState.CONNECTED, 15)
            assert [p for _m, p in server.requests].count(token_path) >= 2, "the failed fetch was retried"
        finally:
            await sup.stop()

    with FakeLark(app_id="cli_secret_revoked") as server:
        channel = LarkChannel(server.app_id, "revoked-secret", domain=server.base_url, liveness_timeout=5.0)
        sup = ChannelSupervisor(channel, lambda _i: asyncio.sleep(0), Metrics(), Backoff(base=0.05, cap=0.1))
        sup.start()
        try:
            await server.wait_for_async(lambda _f: channel.state is ChannelState.FAILED, 15)
            assert "10014" in (channel.reason or "") and "revoked-secret" not in (channel.reason or "")
        finally:
            await sup.stop()


# -- table-driven malformed variants (channels/malformed.py) ---------------------------------------
MSG, SENDER = ("event", "message"), ("event", "sender")
EVENT_CASES = variants({
    (*MSG, "content"): (("number", "object", "list", "null", "string"), True),
    (*MSG, "message_type"): (("number", "object"), True),
    (*MSG, "mentions"): (("string", "object", "nested nulls"), True),
    (*MSG, "message_id"): (("missing", "null", "number", "huge id"), False),
    (*MSG, "chat_id"): (("missing", "number", "object"), False),
    SENDER: (("missing", "null", "string"), False),
    (*SENDER, "sender_id"): (("null", "string"), False),
    (*SENDER, "sender_id", "open_id"): (("number", "null", "huge id"), False),
    MSG: (("null", "string", "list"), False),
    ("event",): (("null", "string", "list", "missing"), False),
    ("header",): (("null", "string", "missing"), True),  # the event still names chat and sender
    ("header", "event_type"): (("null", "number"), True),
})  # fmt: skip
PRESS = ("event",)
PRESS_CASES = variants({
    (*PRESS, "action"): (("null", "string", "missing"), True),
    (*PRESS, "action", "value"): (("null", "string", "list", "number"), True),
    (*PRESS, "operator"): (("null", "string", "missing"), True),
    (*PRESS, "context"): (("null", "string"), True),
    (*PRESS, "context", "open_chat_id"): (("number", "null", "huge id"), True),
})  # fmt: skip
FRAMES: dict[str, tuple[bytes, dict[str, str | None]]] = {
    "old card callback": (b'{"secret": "words"}', {"type": "card"}),
    "unknown frame type": (b'{"secret": "words"}', {"type": "secret words"}),
    "no sum header": (b'{"secret": "words"}', {"sum": None}),
    "sum is words": (b'{"secret": "words"}', {"sum": "secret words"}),
    "no seq header": (b'{"secret": "words"}', {"seq": None}),
    "payload not UTF-8": (b"\xff\xfe secret words", {}),
}


def breaking(case: Case) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        broken = put(body, case.path, case.value)
        body.clear()
        body.update(broken)

    return mutate


async def serves_after(lark: FakeLark) -> None:
    lark.inject_message(CHAT, ALICE, "still there?")
    await lark.wait_for_async(says("echo: still there?"))


@pytest.mark.parametrize("case", EVENT_CASES, ids=lambda c: c.id)
async def test_every_malformed_event_is_acked_counted_and_answered(
    case: Case, lark: FakeLark, channel: LarkChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(channel, adapter_rig):
        bad = lark.inject_event(CHAT, ALICE, "text", {"text": SECRET}, mutate=breaking(case))
        await acked(lark, bad)
        if case.told:
            await lark.wait_for_async(says("couldn't read that message"))
        await serves_after(lark)
        assert channel.state is ChannelState.CONNECTED
    assert lark.acks_for(bad) == [200], "acked as handled: never redelivered"
    assert malformed_total(adapter_rig, "lark") == 1
    assert bool(says("couldn't read")(lark)) is case.told
    assert not leaked(caplog.records)


@pytest.mark.parametrize("case", PRESS_CASES, ids=lambda c: c.id)
async def test_every_malformed_card_press_is_acked_counted_and_refused(
    case: Case, lark: FakeLark, channel: LarkChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    body = lark.card_press_body("om_card", CHAT, ALICE, {"chital": "chital:approve:ZZ", "note": SECRET})
    async with running(channel, adapter_rig):
        bad = lark.inject_payload(json.dumps(put(body, case.path, case.value)).encode())
        await acked(lark, bad)
        await serves_after(lark)
    assert lark.acks_for(bad) == [200]
    toast = (lark.ack_data(bad) or {}).get("toast") or {}
    assert toast.get("type") == "error" and "couldn't read that button" in toast.get("content", "")
    assert malformed_total(adapter_rig, "lark") == 1
    assert not leaked(caplog.records)


@pytest.mark.parametrize("frame", list(FRAMES))
async def test_frames_the_sdk_would_drop_are_acked_and_counted(
    frame: str, lark: FakeLark, channel: LarkChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    payload, headers = FRAMES[frame]
    async with running(channel, adapter_rig):
        bad = lark.inject_frame(payload, headers)
        await acked(lark, bad)
        await serves_after(lark)
        assert channel.state is ChannelState.CONNECTED
    assert lark.acks_for(bad) == [200]
    assert malformed_total(adapter_rig, "lark") == 1
    assert not leaked(caplog.records)
