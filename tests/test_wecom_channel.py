"""WeComChannel against tests/fakes/wecom_server.py, alone (a plain sink), and its pure parts
(channels/wecom/inbound.py, render.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from channels.base import (
    Attachment,
    ChannelState,
    FatalChannelError,
    Inbound,
    NotModified,
    PermanentSendError,
    Rendered,
    ReplyTarget,
)
from channels.wecom.inbound import AT, REQ_ID, to_inbound
from channels.wecom.render import MAX_PART_BYTES, is_final, render, render_stream
from tests.fakes.wecom_server import FakeWeCom
from tests.wecom_channel_rig import Sink, channel_for, running

ALICE = "alice"
GROUP = "wrgroup42"


async def got(fake: FakeWeCom, sink: Sink, n: int) -> list[Inbound]:
    return await fake.wait_for(lambda: sink.items if len(sink.items) >= n else None, what=f"{n} inbound")


# -- inbound ------------------------------------------------------------------------------------
async def test_messages_arrive_in_order_with_their_reply_handle(wecom: FakeWeCom) -> None:
    sink = Sink()
    async with running(wecom, sink):
        first = wecom.inject_text(ALICE, "one")
        wecom.inject_text(ALICE, "@Chital two", group=GROUP)
        items = await got(wecom, sink, 2)
    dm, grp = items
    assert (dm.chat_id, dm.sender_id, dm.text, dm.is_direct, dm.addressed) == (
        ALICE,
        ALICE,
        "one",
        True,
        True,
    )
    assert dm.message_id == first["body"]["msgid"]
    assert dm.extra[REQ_ID] == first["headers"]["req_id"] and abs(dm.extra[AT] - time.time()) < 60
    assert (grp.chat_id, grp.is_direct, grp.addressed, grp.text) == (GROUP, False, True, "two")
    secrets = [f for f in wecom.received if f.get("cmd") == "aibot_subscribe"]
    assert secrets and secrets[0]["body"]["bot_id"] == wecom.bot_id


async def test_bad_frames_are_counted_and_never_stop_the_connection(wecom: FakeWeCom) -> None:
    sink = Sink()
    async with running(wecom, sink) as channel:
        for raw in ("not json", "[1, 2]", '{"cmd": "aibot_unknown_cmd", "headers": {}}', "x" * (5 * 1024 * 1024),
                    '{"cmd": "aibot_event_callback", "headers": {"req_id": "e1"}, "body": {}}'):  # fmt: skip
            wecom.send_raw(raw)
        wecom.inject_body({"msgid": "m-bad", "chattype": "single", "from": {"userid": ALICE}, "msgtype": 5})
        wecom.inject_text(ALICE, "fine")
        items = await got(wecom, sink, 2)
        assert channel.state is ChannelState.CONNECTED
    marker, ok = items
    assert marker.unreadable and marker.message_id == "m-bad" and marker.chat_id == ALICE
    assert ok.text == "fine"
    assert channel.unreadable_events == 6


def test_pure_parsing() -> None:
    body = {"msgid": "m1", "chattype": "single", "from": {"userid": "u"}, "msgtype": "location"}
    assert to_inbound("r", body).unsupported == "locations"
    with pytest.raises((TypeError, ValueError)):
        to_inbound("r", {**body, "chattype": "group"})  # a group without chatid
    img = {**body, "msgtype": "image", "image": {"url": "https://x.test/f", "aeskey": "k"}}
    assert to_inbound("r", img).attachments[0].kind == "image"


def test_render_parts_fit_the_stream_limit_and_say_which_is_final() -> None:
    parts = render("😀" * 20_000)
    assert len(parts) > 1 and all(len(p.text.encode()) <= MAX_PART_BYTES and is_final(p) for p in parts)
    assert not is_final(render_stream("partial"))
    assert "<@" not in render("hi <@boss>")[0].text


# -- outbound -----------------------------------------------------------------------------------
def target_of(frame: dict[str, object], **extra: object) -> ReplyTarget:
    body = frame["body"]
    assert isinstance(body, dict)
    ext = {REQ_ID: frame["headers"]["req_id"], AT: time.time(), **extra}  # type: ignore[index]
    return ReplyTarget("wecom", body["from"]["userid"], reply_to=body["msgid"], extra=ext)


async def test_reply_streams_then_finishes_then_later_parts_are_proactive(wecom: FakeWeCom) -> None:
    async with running(wecom, Sink()) as channel:
        up = wecom.inject_text(ALICE, "hi")
        target = target_of(up)
        mid = await channel.send(target, render_stream("thinking"), idempotency_key="k#0")
        await channel.edit(target, mid, render_stream("thinking more"))
        await channel.edit(target, mid, Rendered("done", {"final": True}))
        with pytest.raises(NotModified):
            await channel.edit(target, mid, Rendered("done", {"final": True}))  # a retried final
        two = await channel.send(target, Rendered("part two", {"final": True}), idempotency_key="k#1")
        with pytest.raises(NotModified):
            await channel.edit(target, two, Rendered("part two", {"final": True}))
        await channel.edit(target, mid, Rendered("a new text", {"final": True}))  # cannot change: anew
    (stream,) = wecom.replies_to(up)
    assert (stream.content, stream.finished, stream.updates) == ("done", True, 2)
    proactive = [m for m in wecom.messages if m.kind == "markdown"]
    assert [(m.chat, m.content) for m in proactive] == [(ALICE, "part two"), (ALICE, "a new text")]


async def test_after_the_window_only_the_final_text_goes_out_proactively(wecom: FakeWeCom) -> None:
    async with running(wecom, Sink()) as channel:
        up = wecom.inject_text(ALICE, "slow one")
        target = target_of(up)
        mid = await channel.send(target, render_stream("working"), idempotency_key="s#0")
        wecom.expire(up)  # past WeCom's 6 minutes
        with pytest.raises(NotModified):
            await channel.edit(target, mid, render_stream("still working"))
        await channel.edit(target, mid, Rendered("the answer", {"final": True}))
        old = target_of(up, **{AT: time.time() - 3600})  # a turn resumed long after the message
        pending = await channel.send(old, render_stream("resumed"), idempotency_key="o#0")
        await channel.edit(old, pending, Rendered("resumed answer", {"final": True}))
    assert [m.content for m in wecom.replies_to(up)] == ["working"]
    assert [m.content for m in wecom.messages if m.kind == "markdown"] == ["the answer", "resumed answer"]


async def test_half_open_connection_is_dropped_and_dialled_again(wecom: FakeWeCom) -> None:
    sink = Sink()
    async with running(wecom, sink):
        wecom.half_open()
        wecom.inject_text(ALICE, "during the silence")
        await got(wecom, sink, 1)
        assert wecom.subscribes >= 2


async def test_a_refused_secret_is_fatal_after_a_second_refusal(wecom: FakeWeCom) -> None:
    await wecom.revoke()
    channel = channel_for(wecom)
    with pytest.raises(FatalChannelError) as err:
        await asyncio.wait_for(channel.run(Sink()), 20)
    await channel.close()
    assert wecom.refusals == 2 and "40001" in str(err.value) and wecom.secret not in str(err.value)


async def test_download_decrypts_and_stops_at_the_limit(wecom: FakeWeCom) -> None:
    media = wecom.add_media(b"hello file" * 100)
    async with running(wecom, Sink()) as channel:
        good = Attachment(file_id=f"{media['aeskey']} {media['url']}", name="f.txt")
        assert await channel.download(good, 10_000) == b"hello file" * 100
        with pytest.raises(PermanentSendError):
            await channel.download(good, 100)  # announced nothing, sent more
        short_key = "c2hvcnQga2V5IG9mIDE2IGI"  # not the 32 bytes AES-256 needs
        with pytest.raises(PermanentSendError):
            await channel.download(Attachment(file_id=f"{short_key} {media['url']}", name="f.txt"), 10_000)
