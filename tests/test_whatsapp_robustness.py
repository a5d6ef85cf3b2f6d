"""WhatsApp field reliability, through the adapter's webhook against FakeWhatsApp with the real
gateway (journal, notices, metrics) and an echo harness: every malformed message of a signed
delivery is skipped and counted, the delivery is still acknowledged (else Meta redelivers it
forever), it is logged without its text, and its sender is told where the message still names
them; the messages around it, in the same delivery, are answered."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from channels.base import ChannelState
from channels.whatsapp.channel import WhatsAppChannel
from tests.fakes.gateway_rig import Rig, running
from tests.fakes.malformed import SECRET, Case, leaked, malformed_total, put, variants
from tests.fakes.whatsapp_server import PHONE_NUMBER_ID, VERSION, FakeWhatsApp, webhook_listener

ALICE = "15550002222"


@pytest.fixture
def allowed_users() -> list[str]:
    return [f"whatsapp:{ALICE}"]


IDS = ("missing", "null", "number", "object", "list", "huge id", "control chars")
TABLE: dict[tuple[str, ...], tuple[tuple[str, ...], bool]] = {
    ("id",): (IDS, False),
    ("from",): ((*IDS, "string"), False),  # "secret words" is no phone number
    ("type",): (("missing", "null", "number", "object"), True),
    ("text",): (("missing", "null", "number", "string", "list"), True),
    ("group_id",): (("number", "object", "list", "huge id", "control chars"), False),
    ("text", "body"): (("missing", "null", "number", "object", "list", "huge list", "nested nulls"), True),
}


def channel_for(wa: FakeWhatsApp) -> WhatsAppChannel:
    return WhatsAppChannel(PHONE_NUMBER_ID, wa.token, wa.app_secret, wa.verify_token, graph_url=wa.base_url,
                           api_version=VERSION, read_seconds=2)  # fmt: skip


def texts(wa: FakeWhatsApp, needle: str) -> list[str]:
    return [m.text for m in wa.to(ALICE) if needle in m.text]


@pytest.mark.parametrize("case", variants(TABLE), ids=lambda c: c.id)
async def test_malformed_message_is_skipped_counted_and_told(
    case: Case, whatsapp: FakeWhatsApp, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    channel = channel_for(whatsapp)
    async with running(channel, adapter_rig), webhook_listener(channel, whatsapp):
        first = whatsapp.message(ALICE, "text", text={"body": "first good one"})
        bad: Any = put(whatsapp.message(ALICE, "text", text={"body": SECRET}), case.path, case.value)
        second = whatsapp.message(ALICE, "text", text={"body": "second good one"})
        assert await whatsapp.deliver(whatsapp.payload(first, bad, second)) == 200
        await whatsapp.wait_for(lambda: texts(whatsapp, "echo: second good one"), what="second answered")
        assert texts(whatsapp, "echo: first good one")
        if case.told:
            await whatsapp.wait_for(lambda: texts(whatsapp, "couldn't read that message"), what="the note")
        assert channel.state is ChannelState.CONNECTED
    assert channel.unreadable_events == 1
    assert malformed_total(adapter_rig, "whatsapp") == 1
    assert len(texts(whatsapp, "couldn't read")) == (1 if case.told else 0)
    assert not leaked(caplog.records), "the message's text reached a log line"
    assert all(SECRET not in m.text for m in whatsapp.sent)


async def test_slow_body_gets_408_and_the_channel_goes_on(whatsapp: FakeWhatsApp, adapter_rig: Rig) -> None:
    """A slow-loris sends headers and then a byte now and then: cut off after ``read_seconds``."""
    channel = channel_for(whatsapp)
    async with running(channel, adapter_rig), webhook_listener(channel, whatsapp) as url:
        host, port = url.split("/")[2].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /channels/whatsapp/webhook HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 30)
        writer.close()
        assert b" 408 " in status, status
        up = await whatsapp.inject_text(ALICE, "after the slow one")
        await whatsapp.wait_for(lambda: whatsapp.replies_to(up["id"]), what="answered")


async def test_parallel_unsigned_bodies_cannot_hold_unbounded_memory(
    whatsapp: FakeWhatsApp, adapter_rig: Rig
) -> None:
    """The webhook is on the internet and a body is read whole before its signature can be checked:
    many callers each holding a nearly full body in flight are bounded together (the one that
    would pass the shared budget gets 503, Meta's way to say retry), and a small signed delivery
    sent meanwhile still fits and is answered."""
    cap = 64 * 1024
    channel = WhatsAppChannel(PHONE_NUMBER_ID, whatsapp.token, whatsapp.app_secret, whatsapp.verify_token,
                              graph_url=whatsapp.base_url, api_version=VERSION, read_seconds=20,
                              max_body_bytes=cap)  # fmt: skip
    async with running(channel, adapter_rig), webhook_listener(channel, whatsapp) as url:
        host, port = url.split("/")[2].split(":")
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        for _ in range(6):  # 6 x 60 KiB in flight: over the budget of 4 largest bodies
            reader, writer = await asyncio.open_connection(host, int(port))
            head = f"POST /channels/whatsapp/webhook HTTP/1.1\r\nHost: x\r\nContent-Length: {cap}\r\n\r\n"
            writer.write(head.encode() + b"x" * (cap - 4096))
            await writer.drain()
            held.append((reader, writer))
        try:
            first = await asyncio.wait_for(
                asyncio.wait([asyncio.ensure_future(r.readline()) for r, _ in held],
                             return_when=asyncio.FIRST_COMPLETED), 15)  # fmt: skip
            lines = [t.result() for t in first[0]]
            assert any(b" 503 " in line for line in lines), lines
            up = await whatsapp.inject_text(ALICE, "small and signed")
            await whatsapp.wait_for(lambda: whatsapp.replies_to(up["id"]), what="answered")
        finally:
            for _, writer in held:
                writer.close()


async def test_a_flood_of_forged_requests_is_counted_not_logged_line_by_line(
    whatsapp: FakeWhatsApp, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone on the internet can call the webhook: unsigned, badly signed and oversized deliveries
    and wrong verification requests are refused, counted by kind, and logged once a minute per kind
    with the count (a log line each would let a stranger grow the operator's logs at wire speed);
    a signed delivery after them is answered."""
    caplog.set_level(logging.INFO)
    channel = WhatsAppChannel(PHONE_NUMBER_ID, whatsapp.token, whatsapp.app_secret, whatsapp.verify_token,
                              graph_url=whatsapp.base_url, api_version=VERSION, max_body_bytes=1024)  # fmt: skip
    async with running(channel, adapter_rig), webhook_listener(channel, whatsapp):
        body = b'{"object": "whatsapp_business_account", "entry": []}'
        for _ in range(25):
            assert (await whatsapp.post(body))[0] == 401
            assert (await whatsapp.post(body, {"X-Hub-Signature-256": "sha256=" + "0" * 64}))[0] == 403
            assert (await whatsapp.post(b"x" * 2048))[0] == 413
            assert (await whatsapp.verify(token="wrong"))[0] == 403
        up = await whatsapp.inject_text(ALICE, "after the flood")
        await whatsapp.wait_for(lambda: whatsapp.replies_to(up["id"]), what="answered")
    refusals = [
        r for r in caplog.records if r.name.startswith("channels.whatsapp") and "refused" in r.getMessage()
    ]
    assert 1 <= len(refusals) <= 4, [r.getMessage() for r in refusals]
    assert channel.refused == {"unsigned": 25, "bad signature": 25, "too large": 25, "verification": 25}


async def test_a_signed_message_replayed_after_metas_redelivery_window_is_not_answered(
    whatsapp: FakeWhatsApp, adapter_rig: Rig
) -> None:
    """Meta redelivers for at most 7 days; the journal that drops repeats is pruned after
    ``retention_days``. A captured, validly signed delivery replayed later (its message's signed
    ``timestamp`` older than Meta's window) is acknowledged, counted and not run again; a message
    with its timestamp in the window, and one without a usable timestamp, still are."""
    channel = channel_for(whatsapp)
    async with running(channel, adapter_rig), webhook_listener(channel, whatsapp):
        old = whatsapp.message(ALICE, "text", text={"body": "replayed order"})
        old["timestamp"] = str(int(time.time()) - 8 * 86400)
        assert await whatsapp.deliver(whatsapp.payload(old)) == 200
        late = whatsapp.message(ALICE, "text", text={"body": "late but in the window"})
        late["timestamp"] = str(int(time.time()) - 6 * 86400)
        odd = whatsapp.message(ALICE, "text", text={"body": "no usable timestamp"})
        odd["timestamp"] = "soon"
        assert await whatsapp.deliver(whatsapp.payload(late, odd)) == 200
        await whatsapp.wait_for(lambda: texts(whatsapp, "echo: no usable timestamp"), what="answered")
        assert texts(whatsapp, "echo: late but in the window")
    assert not texts(whatsapp, "replayed order")
    assert channel.ignored["expired"] == 1
