"""A hostile network and hostile callbacks against WeComChannel and tests/fakes/wecom_server.py:
media URLs that point inside (or bounce there), a busy or garbled subscription answer, callbacks
naming a chat they do not call a group, a message kind whose name is Markdown.
What is asserted is what reaches the sink (the gateway), what the fake served, and the errors
the gateway would show the user."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from channels.base import (
    Attachment,
    ChannelState,
    NotModified,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    TransientSendError,
)
from channels.wecom import media
from channels.wecom.inbound import AT, REQ_ID, to_inbound
from channels.wecom.render import render_stream
from tests.fakes.wecom_server import FakeWeCom
from tests.wecom_channel_rig import Sink, running

ALICE = "alice"


def texts(sink: Sink) -> list[str]:
    return [i.text for i in sink.items if not i.unreadable]


# -- resource bounds: where a media download may go ---------------------------------------------
INSIDE = (
    "http://localhost:{port}/media/{mid}",  # plain http, loopback by another name than the home
    "https://localhost:{port}/media/{mid}",
    "https://127.0.0.1/media/{mid}",  # https, but loopback (another origin: no port)
    "https://0x7f000001/x",  # loopback in a legacy spelling
    "https://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
    "https://[::ffff:169.254.169.254]/x",  # the same inside IPv6
    "https://10.20.30.40/x",
    "https://[fd00::1]/x",
    "http://example.com/x",  # public, but not https
    "https://0177.0.0.1/x",  # octal loopback
    "https://127.1/x",  # short loopback
    "https://[::ffff:7f00:1]/x",  # loopback inside IPv6
    "https://openws.work.weixin.qq.com\\@127.0.0.1:{port}/media/{mid}",  # parsers disagree on it
    "https://openws.work.weixin.qq.com@127.0.0.1:{port}/media/{mid}",  # a userinfo posing as host
)


@pytest.mark.parametrize("shape", INSIDE)
async def test_media_url_inside_or_not_https_is_refused_before_any_fetch(
    wecom: FakeWeCom, shape: str
) -> None:
    media = wecom.add_media(b"internal data")
    url = shape.format(port=wecom.port, mid=media["url"].rsplit("/", 1)[-1])
    async with running(wecom, Sink(), heartbeat=5.0) as channel:
        with pytest.raises(PermanentSendError) as err:
            await channel.download(Attachment(file_id=f"{media['aeskey']} {url}", name="f.bin"), 10_000)
    assert "refused" in str(err.value) or "not a WeCom media url" in str(err.value), str(err.value)
    assert wecom.downloads == 0


async def test_a_redirect_is_checked_like_the_first_url(wecom: FakeWeCom) -> None:
    media = wecom.add_media(b"secret of the intranet")
    inside = media["url"].replace("127.0.0.1", "localhost")  # the same file, another origin
    async with running(wecom, Sink(), heartbeat=5.0) as channel:
        bounce = Attachment(file_id=f"{media['aeskey']} {wecom.add_redirect(inside)}", name="f.bin")
        with pytest.raises(PermanentSendError, match="refused"):
            await channel.download(bounce, 10_000)
        assert wecom.downloads == 1, "only the redirect was fetched, not where it pointed"
        home = Attachment(file_id=f"{media['aeskey']} {wecom.add_redirect(media['url'])}", name="f.bin")
        assert await channel.download(home, 10_000) == b"secret of the intranet"
        chain = media["url"]
        for _ in range(5):
            chain = wecom.add_redirect(chain)
        with pytest.raises(PermanentSendError, match="redirects"):
            await channel.download(Attachment(file_id=f"{media['aeskey']} {chain}", name="f.bin"), 10_000)


class Rebinding(AbstractResolver):
    """A name server an attacker runs: the first answer is a public address, every later one
    loopback (DNS rebinding), whatever the name."""

    def __init__(self, port: int) -> None:
        self.answers = ["93.184.216.34"]
        self.port = port

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        ip = self.answers.pop(0) if self.answers else "127.0.0.1"
        return [
            ResolveResult(hostname=host, host=ip, port=self.port, family=socket.AF_INET, proto=0, flags=0)
        ]

    async def close(self) -> None:
        return None


async def test_a_name_rebound_inside_after_the_check_gets_no_connection() -> None:
    """The URL's name resolves to a public address when it is checked and to loopback when the
    download connects: the connection's own resolution is judged, so nothing connects (a socket on
    loopback counts every connection made to it)."""
    connections: list[int] = []

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        bait = Attachment(file_id=f" https://media.rebind.example:{port}/x", name="f.bin")
        with pytest.raises(TransientSendError):
            await media.download(
                bait, 10_000, home="wss://openws.work.weixin.qq.com", resolver=Rebinding(port)
            )
        assert connections == [], "the download connected to the rebound address"
    finally:
        server.close()
        await server.wait_closed()


# -- faults and malformed frames around the subscription ----------------------------------------
async def test_a_busy_subscription_answer_is_retried_not_fatal(wecom: FakeWeCom) -> None:
    wecom.subscribe_errors = [(-1, "system busy"), (45009, "api freq out of limit"), (-1, "busy")]
    sink = Sink()
    async with running(wecom, sink, heartbeat=5.0) as channel:
        wecom.inject_text(ALICE, "after the busy spell")
        await wecom.wait_for(lambda: texts(sink), what="the message")
        assert channel.state is ChannelState.CONNECTED
    assert wecom.subscribes == 4 and texts(sink) == ["after the busy spell"]


async def test_frames_before_the_subscription_answer_are_read_not_lost_nor_fatal(wecom: FakeWeCom) -> None:
    early = {"cmd": "aibot_msg_callback", "headers": {"req_id": "cb-early"},
             "body": {"msgid": "m-early", "chattype": "single", "from": {"userid": ALICE},
                      "msgtype": "text", "text": {"content": "sent before the answer"}}}  # fmt: skip
    wecom.before_subscribe_answer = [
        "[" * 200_000 + "]" * 200_000,  # nested past the decoder's depth
        '{"a":' * 100_000 + "1" + "}" * 100_000,
        json.dumps(early),
        "not json",
    ]
    sink = Sink()
    async with running(wecom, sink, heartbeat=5.0) as channel:
        wecom.inject_text(ALICE, "still here")
        await wecom.wait_for(lambda: len(texts(sink)) >= 2, what="both messages")
        assert channel.state is ChannelState.CONNECTED
    assert wecom.subscribes == 1 and texts(sink) == ["sent before the answer", "still here"]
    assert channel.unreadable_events == 3, "the three bad frames are counted, as after the answer"


# -- provenance ---------------------------------------------------------------------------------
async def test_a_chat_not_called_a_group_is_not_taken_for_the_senders_own(wecom: FakeWeCom) -> None:
    sink = Sink()
    async with running(wecom, sink, heartbeat=5.0):
        sneaky = wecom.inject_text(ALICE, "which chat?", chatid="wrgroup-7")
        del sneaky["body"]["chattype"]  # already pushed: push it again without chattype
        wecom.inject_body(sneaky["body"], chat=ALICE)
        wecom.inject_text(ALICE, "plain", group="wrgroup-7")
        await wecom.wait_for(lambda: len(sink.items) >= 3, what="three inbound")
    first, second, third = sink.items
    assert first.text == "which chat?" and first.is_direct  # chattype single: the chatid is ignored
    assert second.unreadable and second.chat_id == ALICE, "missing chattype with a chatid: unreadable"
    assert (third.chat_id, third.is_direct) == ("wrgroup-7", False)


# -- untrusted text shown to people -------------------------------------------------------------
@pytest.mark.parametrize("kind", ["[tap here](https://evil.example/x)", "<@boss>", "a" * 41, "Ｉｍａｇｅ"])
async def test_an_unknown_kind_is_named_only_when_its_name_is_plain(wecom: FakeWeCom, kind: str) -> None:
    sink = Sink()
    async with running(wecom, sink, heartbeat=5.0):
        wecom.inject_text(ALICE, "", msgtype=kind)
        wecom.inject_text(ALICE, "", msgtype="vote_poll")
        await wecom.wait_for(lambda: len(sink.items) >= 2, what="two inbound")
    odd, plain = sink.items
    assert odd.unsupported == "messages of this kind"
    assert plain.unsupported == "vote_poll messages"


# -- faults at the worst moment -----------------------------------------------------------------
async def test_a_final_frame_whose_answer_was_lost_is_not_shown_twice(wecom: FakeWeCom) -> None:
    """The gateway retries an edit that failed with ``maybe_sent`` (gateway/delivery/pacing.py)
    and sends anew when the retry is refused: neither may make a second copy of the answer."""
    async with running(wecom, Sink(), heartbeat=5.0) as channel:
        up = wecom.inject_text(ALICE, "hi")
        target = ReplyTarget("wecom", ALICE, reply_to=up["body"]["msgid"],
                             extra={REQ_ID: up["headers"]["req_id"], AT: time.time()})  # fmt: skip
        mid = await channel.send(target, render_stream("thinking"), idempotency_key="k#0")
        wecom.lose_finish_answer = True
        with pytest.raises(TransientSendError) as err:
            await channel.edit(target, mid, Rendered("the answer", {"final": True}))
        assert err.value.maybe_sent
        await wecom.wait_connected()
        await channel.edit(target, mid, Rendered("the answer", {"final": True}))  # the pacer's retry
        with pytest.raises(NotModified):
            await channel.edit(target, mid, Rendered("the answer", {"final": True}))
    assert [(m.kind, m.content, m.finished) for m in wecom.bot_messages(ALICE)] == [
        ("stream", "the answer", True)
    ]


@pytest.mark.parametrize("aeskey", ["A" * 200, "\u202eQUJD", "a key with spaces", "QUJD/../..", 42, ""])
async def test_a_file_whose_key_is_unusable_is_refused_never_handed_on_encrypted(
    wecom: FakeWeCom, aeskey: object
) -> None:
    media = wecom.add_media(b"plain text the model should see")
    body = {"msgid": "m-img", "chattype": "single", "from": {"userid": ALICE}, "msgtype": "file",
            "file": {"url": media["url"], "aeskey": aeskey, "filename": "notes.txt"}}  # fmt: skip
    (att,) = to_inbound("r", body).attachments
    async with running(wecom, Sink(), heartbeat=5.0) as channel:
        with pytest.raises(PermanentSendError, match="key cannot be read"):
            await channel.download(att, 10_000)
    assert wecom.downloads == 0


@pytest.mark.parametrize("errcode", [None, "0", [0], {"code": 0}, True, 1.5])
async def test_an_unreadable_answer_is_a_maybe_sent_retry_never_a_crash(
    wecom: FakeWeCom, errcode: object
) -> None:
    async with running(wecom, Sink(), heartbeat=5.0) as channel:
        up = wecom.inject_text(ALICE, "hi")
        target = ReplyTarget("wecom", ALICE, reply_to=up["body"]["msgid"],
                             extra={REQ_ID: up["headers"]["req_id"], AT: time.time()})  # fmt: skip
        wecom.garbled_answers = [errcode]
        with pytest.raises(TransientSendError) as err:
            await channel.send(target, render_stream("thinking"), idempotency_key="k#0")
        assert err.value.maybe_sent
        mid = await channel.send(target, render_stream("thinking"), idempotency_key="k#0")  # the retry
        await channel.edit(target, mid, Rendered("done", {"final": True}))
        late = ReplyTarget("wecom", ALICE, extra={})  # no message to answer: proactive
        wecom.garbled_answers = [errcode]
        with pytest.raises(TransientSendError) as err:
            await channel.send(late, Rendered("later", {"final": True}), idempotency_key="l#0")
        assert err.value.maybe_sent
    shown = [(m.kind, m.content, m.finished) for m in wecom.bot_messages(ALICE)]
    assert shown == [("stream", "done", True), ("markdown", "later", True)]


# -- specific errors ----------------------------------------------------------------------------
async def test_a_failed_download_says_what_to_do(wecom: FakeWeCom) -> None:
    media = wecom.add_media(b"data")
    gone = media["url"].rsplit("/", 1)[0] + "/m-expired"
    async with running(wecom, Sink(), heartbeat=5.0) as channel:
        with pytest.raises(PermanentSendError) as err:
            await channel.download(Attachment(file_id=f"{media['aeskey']} {gone}", name="f.bin"), 10_000)
    assert "HTTP 404" in str(err.value) and "send the file again" in str(err.value)


# -- untrusted text shown to people: mentions on every path -------------------------------------
async def test_a_mention_in_a_part_built_without_render_pings_nobody(wecom: FakeWeCom) -> None:
    """The gateway sends some parts it built itself (a queued sign, a status): the adapter breaks
    ``<@…>`` in whatever it sends, stream or proactive, not only in what its render() made."""
    async with running(wecom, Sink(), heartbeat=5.0) as channel:
        up = wecom.inject_text(ALICE, "hi")
        target = ReplyTarget("wecom", ALICE, reply_to=up["body"]["msgid"],
                             extra={REQ_ID: up["headers"]["req_id"], AT: time.time()})  # fmt: skip
        await channel.send(target, Rendered("queued for <@boss>", {"final": True}), idempotency_key="q#0")
        late = ReplyTarget("wecom", ALICE, extra={})
        await channel.send(late, Rendered("<@all> look", {"final": True}), idempotency_key="l#0")
    shown = [m.content for m in wecom.bot_messages(ALICE)]
    assert len(shown) == 2 and all("<@" not in text for text in shown), shown


async def test_a_compressed_download_is_not_inflated(wecom: FakeWeCom) -> None:
    """A gzip bomb is read as the bytes sent (capped), never inflated first: a file served
    gzip-encoded (though asked for ``identity``) is refused as not WeCom's encryption."""
    media = wecom.add_media(b"\0" * 200_000)
    wecom.gzip_media = True
    async with running(wecom, Sink(), heartbeat=5.0) as channel:
        att = Attachment(file_id=f"{media['aeskey']} {media['url']}", name="f.bin")
        with pytest.raises(PermanentSendError, match="encryption|decrypt"):
            await channel.download(att, 3_000_000)


# -- many frames --------------------------------------------------------------------------------
async def test_a_flood_of_bad_frames_is_counted_each_but_logged_a_few_times(
    wecom: FakeWeCom, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="channels.wecom")
    sink = Sink()
    async with running(wecom, sink, heartbeat=5.0) as channel:
        for n in range(40):
            wecom.send_raw(f"garbage {n}" if n % 2 else '{"cmd": "aibot_what", "headers": {}}')
        wecom.inject_text(ALICE, "after the flood")
        await wecom.wait_for(lambda: texts(sink), what="the message")
    assert channel.unreadable_events == 40
    lines = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert 1 <= len(lines) <= 5, len(lines)
    assert all("garbage" not in r.getMessage() for r in caplog.records)
