"""DingTalkChannel driven through the dingtalk-stream SDK's frames against
tests/fakes/dingtalk_server.py, and its pure parts (channels/dingtalk/inbound.py, sdk.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from channels.base import (
    Attachment,
    ChannelError,
    FatalChannelError,
    Inbound,
    OutFile,
    PermanentSendError,
    ReplyTarget,
    RetryAfter,
)
from channels.dingtalk.channel import DingTalkChannel
from channels.dingtalk.inbound import to_inbound
from channels.dingtalk.sdk import Unreadable, ack, endpoint_allowed, parse
from tests.fakes.dingtalk_server import FakeDingTalk

ALICE = "alice01"
GROUP = "cidGroupConversation=="


class Sink:
    def __init__(self) -> None:
        self.items: list[Inbound] = []
        self.gate: asyncio.Event | None = None
        self.refuse = False

    async def __call__(self, inbound: Inbound) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.refuse:
            raise ChannelError("shutting down")
        self.items.append(inbound)


def channel_for(fake: FakeDingTalk, secret: str | None = None) -> DingTalkChannel:
    return DingTalkChannel(
        fake.client_id,
        secret or fake.client_secret,
        api_base=fake.base_url,
        oapi_base=fake.base_url,
        keepalive=1,
    )


@contextlib.asynccontextmanager
async def running(
    fake: FakeDingTalk, sink: Sink
) -> AsyncIterator[tuple[DingTalkChannel, asyncio.Task[None]]]:
    channel = channel_for(fake)
    task = asyncio.create_task(channel.run(sink))
    try:
        await fake.wait_for(lambda: fake.ws is not None or task.done(), what="the stream connection")
        yield channel, task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ChannelError):
            await task
        await channel.close()


async def test_a_frame_is_acked_only_after_the_sink_returned(dingtalk: FakeDingTalk) -> None:
    sink = Sink()
    sink.gate = asyncio.Event()
    async with running(dingtalk, sink):
        data = await dingtalk.inject_text("", ALICE, "journal me first")
        await asyncio.sleep(0.5)
        assert dingtalk.pending and not dingtalk.acks, "no ack while the journal has not returned"
        sink.gate.set()
        await dingtalk.wait_for(lambda: not dingtalk.pending, what="the ack")
    assert [i.message_id for i in sink.items] == [data["msgId"]]
    assert (
        sink.items[0].chat_id == ALICE
        and sink.items[0].is_direct
        and sink.items[0].text == "journal me first"
    )


async def test_a_refusing_gateway_leaves_the_frame_unacked_for_redelivery(dingtalk: FakeDingTalk) -> None:
    sink = Sink()
    sink.refuse = True
    async with running(dingtalk, sink) as (_, task):
        await dingtalk.inject_text("", ALICE, "not now")
        await dingtalk.wait_for(lambda: task.done(), what="run to end")
        assert isinstance(task.exception(), ChannelError)
    assert dingtalk.pending and not dingtalk.acks
    sink.refuse = False
    async with running(dingtalk, sink):  # the next connection gets it again
        await dingtalk.wait_for(lambda: sink.items, what="the redelivered frame")
    assert sink.items[0].text == "not now"


async def test_frames_of_one_connection_reach_the_sink_in_order(dingtalk: FakeDingTalk) -> None:
    sink = Sink()
    async with running(dingtalk, sink):
        for i in range(20):
            await dingtalk.inject_text("", ALICE, f"m{i}")
        await dingtalk.wait_for(lambda: len(sink.items) == 20, what="20 messages")
    assert [i.text for i in sink.items] == [f"m{i}" for i in range(20)]


async def test_a_wrong_secret_is_fatal_at_start_without_retrying(dingtalk: FakeDingTalk) -> None:
    channel = channel_for(dingtalk, secret="wrong-secret-value-123")
    with pytest.raises(FatalChannelError) as err:
        await channel.run(Sink())
    await channel.close()
    assert "wrong-secret-value-123" not in str(err.value) and "credentials" in str(err.value)
    assert dingtalk.token_requests == 1 and dingtalk.opens == 0


async def test_a_secret_revoked_while_connected_stops_after_asking_twice(dingtalk: FakeDingTalk) -> None:
    async with running(dingtalk, Sink()) as (_, task):
        dingtalk.revoke()
        await dingtalk.drop()
        await dingtalk.wait_for(lambda: task.done(), timeout=20, what="the channel to give up")
        assert isinstance(task.exception(), FatalChannelError)
    assert dingtalk.opens == 3, "one open at start, two refused ones, then no more"


async def test_sends_map_dingtalk_errors(dingtalk: FakeDingTalk) -> None:
    channel = channel_for(dingtalk)
    try:
        key = await channel.send(ReplyTarget("dingtalk", GROUP), channel.render("# hi\nthere")[0],
                                 idempotency_key="k1")  # fmt: skip
        assert key and dingtalk.messages_to(GROUP)[0].param["title"] == "hi"
        dingtalk.fail_next("send", 403, "Forbidden.AccessDenied.QpsLimitForApi")
        with pytest.raises(RetryAfter):
            await channel.send(ReplyTarget("dingtalk", ALICE), channel.render("x")[0], idempotency_key="k2")
        dingtalk.fail_next("send", 400, "invalidParameter")
        with pytest.raises(PermanentSendError) as err:
            await channel.send(ReplyTarget("dingtalk", ALICE), channel.render("x")[0], idempotency_key="k3")
        assert dingtalk.client_secret not in str(err.value)
    finally:
        await channel.close()


async def test_download_trades_the_code_and_stops_at_the_limit(dingtalk: FakeDingTalk) -> None:
    dingtalk.files["code1"] = b"name,score\nada,3\n"
    dingtalk.files["code2"] = b"x" * 5000
    channel = channel_for(dingtalk)
    try:
        assert await channel.download(Attachment("code1", "s.csv"), 1024) == b"name,score\nada,3\n"
        with pytest.raises(PermanentSendError):
            await channel.download(Attachment("code2", "big.bin"), 1024)
    finally:
        await channel.close()


async def test_a_file_longer_than_one_read_arrives_whole(dingtalk: FakeDingTalk) -> None:
    """A file of a few megabytes comes in many TCP reads: every byte reaches the agent, not the
    first buffer's worth (the download used one ``read(n)``, which returns what is buffered)."""
    data = bytes(range(256)) * 12_000  # 3 MB
    dingtalk.files["big"] = data
    channel = channel_for(dingtalk)
    try:
        got = await channel.download(Attachment("big", "big.bin"), 20 * 1024 * 1024)
        assert len(got) == len(data) and got == data
    finally:
        await channel.close()


@pytest.mark.parametrize(
    ("base", "endpoint", "ok"),
    [
        ("https://api.dingtalk.com", "wss://wss-open-connection.dingtalk.com:443/connect", True),
        ("https://api.dingtalk.com", "ws://wss-open-connection.dingtalk.com/connect", False),
        ("https://api.dingtalk.com", "https://wss-open-connection.dingtalk.com/connect", False),
        ("https://api.dingtalk.com", "wss://user:pw@evil.example/connect", False),
        ("https://api.dingtalk.com", "wssx://evil.example/connect", False),
        ("https://api.dingtalk.com", "wss:///connect", False),
        ("http://127.0.0.1:8080", "ws://127.0.0.1:8080/connect", True),
    ],
)
def test_a_stream_endpoint_is_never_plaintext_under_an_https_api(base: str, endpoint: str, ok: bool) -> None:
    """The ticket and every message travel on the socket ``connections/open`` names: under an https
    API it must be wss:// (ws:// was taken: ``startswith(("ws", "wss"))``)."""
    assert endpoint_allowed(base, endpoint) is ok


def test_inbound_shapes(dingtalk: FakeDingTalk) -> None:
    group = to_inbound(dingtalk.message(GROUP, ALICE, "hi", group=True, at=False))
    assert group is not None and group.chat_id == GROUP and not group.is_direct and not group.addressed
    pic = dingtalk.message("", ALICE, "", msgtype="picture", content={"downloadCode": "dc1"})
    inbound = to_inbound(pic)
    assert (
        inbound is not None
        and inbound.attachments[0].file_id == "dc1"
        and inbound.attachments[0].kind == "image"
    )
    voice = to_inbound(dingtalk.message("", ALICE, "", msgtype="audio", content={"recognition": "said this"}))
    assert voice is not None and voice.text == "said this"
    video = to_inbound(dingtalk.message("", ALICE, "", msgtype="video", content={}))
    assert video is not None and video.unsupported == "videos"
    for bad in ({**dingtalk.message("", ALICE, "x"), "conversationType": "9"},
                {**dingtalk.message("", ALICE, "x"), "msgId": None},
                {**dingtalk.message("", ALICE, "x"), "text": {"content": ["x"]}}):  # fmt: skip
        with pytest.raises((TypeError, ValueError, KeyError)):
            to_inbound(bad)


def test_frames_parse_and_ack_as_the_sdk_builds_them() -> None:
    ping = parse(
        '{"type":"SYSTEM","headers":{"topic":"ping","messageId":"p1"},"data":"{\\"opaque\\":\\"o\\"}"}', 100
    )
    out = ack(ping)
    assert '"messageId": "p1"' in out and "opaque" in out and '"code": 200' in out
    with pytest.raises(Unreadable):
        parse("[]", 100)
    with pytest.raises(Unreadable) as err:
        parse('{"type":"CALLBACK","headers":{"messageId":"m2"},"data":"not json"}', 100)
    assert err.value.message_id == "m2"
    assert (
        parse('{"type":"CALLBACK","headers":{"messageId":"m3"},"data":"' + "a" * 200 + '"}', 100).data is None
    )


def test_a_part_never_exceeds_the_documented_15000_bytes(dingtalk: FakeDingTalk) -> None:
    channel = channel_for(dingtalk)
    for text in ("😀" * 9000, "汉" * 9000, "a\n" * 9000, "x" * 20_000):
        parts = channel.render(text)
        assert "".join(p.text for p in parts).replace("\n", "") == text.replace("\n", "")
        assert all(len(p.text) <= 4000 for p in parts)
        assert all(len(json.dumps({"title": "t" * 30, "text": p.text}, ensure_ascii=False).encode()) <= 15_000
                   for p in parts)  # fmt: skip


async def test_cjk_long_answer_is_delivered_in_parts(dingtalk: FakeDingTalk) -> None:
    channel = channel_for(dingtalk)
    try:
        for i, part in enumerate(channel.render("汉" * 9000)):
            await channel.send(ReplyTarget("dingtalk", GROUP), part, idempotency_key=f"k{i}")
    finally:
        await channel.close()
    assert "".join(m.text for m in dingtalk.messages_to(GROUP)) == "汉" * 9000


async def test_send_file_uploads_then_sends_image_or_file(dingtalk: FakeDingTalk) -> None:
    channel = channel_for(dingtalk)
    try:
        await channel.send_file(ReplyTarget("dingtalk", ALICE), OutFile("chart.png", b"\x89PNG..."), "the chart",
                                idempotency_key="f1")  # fmt: skip
        dingtalk.tokens.clear()  # the cached token expired early: renewed once for the upload
        await channel.send_file(
            ReplyTarget("dingtalk", GROUP), OutFile("r.pdf", b"%PDF"), idempotency_key="f2"
        )
    finally:
        await channel.close()
    image, caption = dingtalk.messages_to(ALICE)
    assert image.key == "sampleImageMsg" and dingtalk.uploads[image.param["photoURL"]] == (
        "chart.png",
        b"\x89PNG...",
    )
    assert caption.text == "the chart"
    (doc,) = dingtalk.messages_to(GROUP)
    assert doc.key == "sampleFile" and doc.param["fileType"] == "pdf" and doc.param["fileName"] == "r.pdf"


async def test_a_secret_revoked_under_a_send_fails_it_and_then_stops_the_channel(
    dingtalk: FakeDingTalk,
) -> None:
    async with running(dingtalk, Sink()) as (channel, task):
        dingtalk.revoke()  # the cached token is gone too: the send must ask for a new one
        with pytest.raises(PermanentSendError) as err:
            await channel.send(ReplyTarget("dingtalk", ALICE), channel.render("x")[0], idempotency_key="k")
        assert "credentials" in str(err.value) and dingtalk.client_secret not in str(err.value)
        await dingtalk.inject_text("", ALICE, "anyone there")
        await dingtalk.wait_for(lambda: task.done(), timeout=20, what="the channel to stop")
        assert isinstance(task.exception(), FatalChannelError)


async def test_cards_stream_by_edits_and_a_final_send_finishes_its_card(dingtalk: FakeDingTalk) -> None:
    channel = DingTalkChannel(dingtalk.client_id, dingtalk.client_secret, api_base=dingtalk.base_url,
                              card_template_id="tpl.schema")  # fmt: skip
    try:
        assert channel.capabilities.can_edit and not DingTalkChannel.capabilities.can_edit
        target = ReplyTarget("dingtalk", GROUP)
        out = await channel.send(target, channel.render_stream("part"), idempotency_key="r#0")
        assert not dingtalk.cards[out].final and dingtalk.cards[out].chat_id == GROUP
        await channel.edit(target, out, channel.render_stream("part more"))
        await channel.edit(target, out, channel.render("part more done")[0])
        assert dingtalk.cards[out].final and dingtalk.cards[out].text == "part more done"
        notice = await channel.send(
            ReplyTarget("dingtalk", ALICE), channel.render("note")[0], idempotency_key="n#0"
        )
        assert dingtalk.cards[notice].final and dingtalk.cards[notice].chat_id == ALICE
        with pytest.raises(PermanentSendError):
            await channel.edit(target, "pq123", channel.render("x")[0])  # a text message: not editable
    finally:
        await channel.close()
