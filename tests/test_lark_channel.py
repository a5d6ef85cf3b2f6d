"""LarkChannel driven through the real lark-oapi SDK against FakeLark (tests/fakes/lark_server.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from channels.base import (
    Attachment,
    ChannelState,
    FatalChannelError,
    Inbound,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
)
from channels.lark import LarkChannel, LarkConnectionError, LarkSettings
from channels.lark import render as _format
from gateway.ops.logs import RedactingFilter, redact_loggers
from gateway.ops.supervisor import run_once
from tests.fakes.gateway_rig import until
from tests.fakes.lark_server import FakeLark

LIVENESS = 2.0


@pytest.fixture
def lark_ping() -> int:
    return 30  # no pings among the frames these tests count


def make_channel(lark: FakeLark, liveness_timeout: float = LIVENESS) -> LarkChannel:
    return LarkChannel(lark.app_id, lark.app_secret, domain=lark.base_url, liveness_timeout=liveness_timeout)


class Sink:
    """Collects inbound messages; can be made to fail or to wait for a gate."""

    def __init__(self) -> None:
        self.got: list[Inbound] = []
        self.fail: int = 0
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def __call__(self, msg: Inbound) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            self.fail -= 1
            raise RuntimeError("journal unavailable")
        self.got.append(msg)


@contextlib.asynccontextmanager
async def running(
    channel: LarkChannel, sink: Callable[[Inbound], Awaitable[None]]
) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(run_once(channel, sink))
    try:
        await until(lambda: channel.state is ChannelState.CONNECTED or task.done())
        if task.done():
            task.result()
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await channel.close()


def lark_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("lark-ws-") and t.is_alive()]


# -- inbound -----------------------------------------------------------------------------------


async def test_direct_message_is_acked_only_after_the_sink_returned(lark: FakeLark) -> None:
    channel, sink = make_channel(lark), Sink()
    sink.gate = asyncio.Event()
    async with running(channel, sink):
        event = lark.inject_message("oc_dm", "ou_alice", "hello there")
        await asyncio.wait_for(sink.entered.wait(), 10)
        assert lark.acks_for(event) == []  # the SDK thread is still inside our handler
        sink.gate.set()
        await lark.wait_for_async(lambda f: f.acks_for(event))
        assert lark.acks_for(event) == [200]
    [msg] = sink.got
    assert (msg.platform, msg.chat_id, msg.message_id) == ("lark", "oc_dm", event.message_id)
    assert (msg.sender_id, msg.text, msg.is_direct, msg.addressed) == ("ou_alice", "hello there", True, True)
    assert msg.thread_id is None


async def test_group_messages_are_addressed_only_by_mention(lark: FakeLark) -> None:
    channel, sink = make_channel(lark), Sink()
    async with running(channel, sink):
        plain = lark.inject_message("oc_group", "ou_bob", "just chatting", chat_type="group")
        mentioned = lark.inject_message(
            "oc_group",
            "ou_bob",
            "what is up",
            chat_type="group",
            mention_bot=True,
            mentions=[("ou_carol", "Carol")],
        )
        other = lark.inject_message(
            "oc_group", "ou_bob", "ping", chat_type="group", mentions=[("ou_carol", "Carol")]
        )
        await lark.wait_for_async(lambda f: all(f.acks_for(e) for e in (plain, mentioned, other)))
    by_id = {m.message_id: m for m in sink.got}
    assert by_id[plain.message_id].addressed is False
    assert by_id[plain.message_id].is_direct is False
    assert by_id[mentioned.message_id].addressed is True
    assert by_id[mentioned.message_id].text == "what is up @Carol"
    assert by_id[other.message_id].addressed is False
    assert by_id[other.message_id].text == "ping @Carol"
    assert channel.bot_open_id == lark.bot_open_id


async def test_failing_sink_acks_500_and_redelivery_keeps_the_key(lark: FakeLark) -> None:
    channel, sink = make_channel(lark), Sink()
    sink.fail = 1
    async with running(channel, sink):
        event = lark.inject_message("oc_dm", "ou_alice", "important")
        await lark.wait_for_async(lambda f: f.acks_for(event))
        assert lark.acks_for(event) == [500]
        assert sink.got == []
        lark.redeliver(event)
        await lark.wait_for_async(lambda f: len(f.acks_for(event)) == 2)
        lark.redeliver(event)  # a second, already journaled, delivery: same key
        await lark.wait_for_async(lambda f: len(f.acks_for(event)) == 3)
    assert lark.acks_for(event) == [500, 200, 200]
    assert [m.key for m in sink.got] == [f"lark:oc_dm:{event.message_id}"] * 2


async def test_topic_messages_form_their_own_conversation(lark: FakeLark) -> None:
    channel, sink = make_channel(lark), Sink()
    async with running(channel, sink):
        event = lark.inject_message(
            "oc_topics", "ou_bob", "in a topic", chat_type="group", mention_bot=True, thread_id="omt_1"
        )
        await until(lambda: sink.got)
        msg = sink.got[0]
        assert msg.thread_id == "omt_1" and msg.conversation == "lark:oc_topics:omt_1"
        await channel.send(msg.target, channel.render("answer")[0], idempotency_key="t1")
    [reply] = lark.bot_messages("oc_topics")
    assert reply.parent_id == event.message_id and reply.thread_id == "omt_1"


async def test_post_and_file_messages(lark: FakeLark) -> None:
    channel, sink = make_channel(lark), Sink()
    post = {
        "title": "Report",
        "content": [
            [
                {"tag": "at", "user_id": "@_user_1", "user_name": "Chital"},
                {"tag": "text", "text": " see "},
                {"tag": "a", "text": "docs", "href": "https://example.com"},
            ],
            [{"tag": "img", "image_key": "img_in_post"}],
        ],
    }
    mention = {"key": "@_user_1", "id": {"open_id": lark.bot_open_id}, "name": "Chital"}
    async with running(channel, sink):
        lark.inject_event("oc_g", "ou_bob", "post", post, chat_type="group", mentions=[mention])
        sent = lark.inject_file("oc_dm", "ou_alice", "notes.txt", b"file body")
        await until(lambda: len(sink.got) == 2)
        rich, filed = sink.got
        assert rich.addressed and rich.text == "Report\nsee docs (https://example.com)"
        assert [a.name for a in rich.attachments] == ["image.png"]
        [att] = filed.attachments
        assert att.name == "notes.txt" and sent.message_id in att.file_id
        assert await channel.download(att, 1024) == b"file body"
        with pytest.raises(PermanentSendError):
            await channel.download(att, 4)
        with pytest.raises(PermanentSendError):
            await channel.download(Attachment(f"{sent.message_id}|file|nope", "x"), 1024)


# -- connection health ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["close", "abort"])
async def test_sdk_reconnects_after_a_drop(lark: FakeLark, mode: str) -> None:
    channel, sink = make_channel(lark, liveness_timeout=5.0), Sink()
    async with running(channel, sink) as task:
        lark.drop_connection(mode)
        await lark.wait_for_async(lambda f: f.connections >= 2 and f.live_connections)
        event = lark.inject_message("oc_dm", "ou_alice", "after the drop")
        await lark.wait_for_async(lambda f: f.acks_for(event) == [200])
        assert not task.done()
        await until(lambda: channel.state is ChannelState.CONNECTED)
    assert [m.text for m in sink.got] == ["after the drop"]


async def test_half_open_connection_is_noticed_by_the_watchdog(lark: FakeLark) -> None:
    channel, sink = make_channel(lark), Sink()
    async with running(channel, sink) as task:
        lark.drop_connection("stall")
        started = time.monotonic()
        with pytest.raises(LarkConnectionError, match="no frame"):
            await asyncio.wait_for(task, LIVENESS * 3 + 5)
        assert time.monotonic() - started < LIVENESS * 2 + 2
        assert channel.state is ChannelState.RECONNECTING
    await until(lambda: not lark_threads(), 10)
    # What the supervisor does next: run the same channel again; the stalled socket stays unused.
    async with running(channel, sink):
        event = lark.inject_message("oc_dm", "ou_alice", "after the restart")
        await lark.wait_for_async(lambda f: f.acks_for(event) == [200])
    assert [m.text for m in sink.got] == ["after the restart"]


async def test_endpoint_error_that_ends_the_sdk_client_is_noticed(lark: FakeLark) -> None:
    channel, sink = make_channel(lark, liveness_timeout=30.0), Sink()
    async with running(channel, sink) as task:
        lark.endpoint_error(1000040350)  # a client error code: the SDK's reconnect gives up
        lark.drop_connection("close")
        started = time.monotonic()
        with pytest.raises(LarkConnectionError, match="1000040350"):
            await asyncio.wait_for(task, 15)
        assert time.monotonic() - started < 10  # noticed at once, not after the liveness timeout
    # Restarted while the endpoint still refuses: start() itself fails, and that is noticed too.
    with pytest.raises(LarkConnectionError, match="1000040350"):
        await asyncio.wait_for(run_once(channel, sink), 15)


async def test_retryable_endpoint_error_is_ridden_out_by_the_sdk(lark: FakeLark) -> None:
    channel, sink = make_channel(lark, liveness_timeout=30.0), Sink()
    async with running(channel, sink) as task:
        lark.endpoint_error(1)  # "system busy": the SDK retries every ReconnectInterval
        lark.drop_connection("close")
        await lark.wait_for_async(lambda f: f.endpoint_calls >= 3)
        lark.endpoint_error(None)
        event = lark.inject_message("oc_dm", "ou_alice", "still here")
        await lark.wait_for_async(lambda f: f.acks_for(event) == [200])
        assert not task.done()


async def test_bad_app_secret_is_fatal_and_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "s3cr3t-value-never-logged"
    with FakeLark(app_id="cli_wrong_secret") as server:
        channel = LarkChannel(server.app_id, secret, domain=server.base_url, liveness_timeout=LIVENESS)
        with pytest.raises(FatalChannelError) as info:
            await asyncio.wait_for(run_once(channel, Sink()), 15)
        await channel.close()
    assert "10014" in str(info.value)
    assert secret not in str(info.value) and secret not in caplog.text and secret not in repr(channel)


async def test_sdk_log_lines_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    redact_loggers(LarkSettings.sdk_loggers, RedactingFilter())  # as gateway/ops/logs.py's set-up does
    caplog.set_level(logging.DEBUG)
    logging.getLogger("Lark").warning("connected to wss://x/ws?device_id=1&access_key=AK123&ticket=TK456")
    logging.getLogger("websockets.client").debug("> GET %s HTTP/1.1", "/ws?service_id=2&ticket=TK789")
    assert "device_id=1" in caplog.text and "service_id=2" in caplog.text
    assert not any(s in caplog.text for s in ("AK123", "TK456", "TK789"))


async def test_cancel_winds_down_and_a_new_channel_takes_over(lark: FakeLark) -> None:
    first, first_sink = make_channel(lark), Sink()
    async with running(first, first_sink):
        assert len(lark_threads()) == 1
    assert first.state is ChannelState.STOPPED
    await until(lambda: not lark_threads() and not lark.live_connections, 10)
    second, second_sink = make_channel(lark), Sink()
    async with running(second, second_sink):
        event = lark.inject_message("oc_dm", "ou_alice", "for the new one")
        await lark.wait_for_async(lambda f: f.acks_for(event) == [200])
    assert first_sink.got == [] and [m.text for m in second_sink.got] == ["for the new one"]
    await until(lambda: not lark_threads(), 10)


# -- outbound ------------------------------------------------------------------------------------


async def test_send_edit_split_and_uuid_dedupe(lark: FakeLark) -> None:
    channel, sink = make_channel(lark), Sink()
    async with running(channel, sink):
        lark.inject_message("oc_dm", "ou_alice", "write a lot")
        await until(lambda: sink.got)
        target = sink.got[0].target
        first = channel.render_stream("Working on it")
        mid = await channel.send(target, first, idempotency_key="turn1:0")
        assert await channel.send(target, first, idempotency_key="turn1:0") == mid  # a retry
        await channel.edit(target, mid, channel.render_stream("Working on it, **half** done\n```py\nx = 1"))
        [shown] = lark.bot_messages("oc_dm")
        assert shown.edits == 1 and "**half** done" in shown.text and shown.text.endswith("```")
        answer = "# Result\n\n" + "\n\n".join(f"Paragraph {i} " + "word " * 60 for i in range(60))
        answer += "\n\n```python\n" + "print('x')\n" * 400 + "```\n"
        parts = channel.render(answer)
        assert len(parts) >= 3
        assert all(len(p.payload["content"].encode()) < 30 * 1024 for p in parts)
        await channel.edit(target, mid, parts[0])
        for i, part in enumerate(parts[1:], 1):
            await channel.send(target, part, idempotency_key=f"turn1:{i}")
    shown = lark.bot_messages("oc_dm")
    assert len(shown) == len(parts)
    assert shown[0].text.startswith("# Result")
    assert all(m.parent_id == sink.got[0].message_id for m in shown)
    code_parts = [m.text for m in shown if "print('x')" in m.text]
    assert all(t.count("```") % 2 == 0 for t in code_parts)


async def test_send_without_a_message_to_reply_to_posts_into_the_chat(lark: FakeLark) -> None:
    channel = make_channel(lark)
    mid = await channel.send(
        ReplyTarget("lark", "oc_notice"), Rendered("Restarted, **back** now"), idempotency_key="notice-1"
    )
    [msg] = lark.bot_messages("oc_notice")
    assert msg.message_id == mid and msg.msg_type == "interactive" and "**back**" in msg.text
    await channel.close()


async def test_api_errors_are_mapped(lark: FakeLark) -> None:
    channel = make_channel(lark)
    target = ReplyTarget("lark", "oc_x")
    part = channel.render("hi")[0]
    lark.rate_limit_next("POST", r"/im/v1/messages$", reset=3)
    with pytest.raises(RetryAfter) as limited:
        await channel.send(target, part, idempotency_key="a")
    assert limited.value.seconds == 3
    lark.fail_next("POST", r"/im/v1/messages$", status=503)
    with pytest.raises(TransientSendError):
        await channel.send(target, part, idempotency_key="a")
    lark.fail_next("POST", r"/im/v1/messages$", status=400, code=230002, msg="bot not in chat")
    with pytest.raises(PermanentSendError, match="230002"):
        await channel.send(target, part, idempotency_key="a")
    with pytest.raises(PermanentSendError):
        await channel.edit(target, "om_missing", part)
    await channel.send(target, part, idempotency_key="a")  # and then it works
    assert len(lark.bot_messages("oc_x")) == 1
    await channel.close()


async def test_send_file_and_react(lark: FakeLark, tmp_path: Path) -> None:
    channel, sink = make_channel(lark), Sink()
    report = tmp_path / "report.pdf"
    report.write_bytes(b"%PDF-1.4 fake")
    chart = tmp_path / "chart.png"
    chart.write_bytes(b"\x89PNG fake")
    async with running(channel, sink):
        event = lark.inject_message("oc_dm", "ou_alice", "make a report")
        await until(lambda: sink.got)
        target = sink.got[0].target
        await channel.react(target, "👍")
        file_mid = await channel.send_file(
            target,
            OutFile(report.name, report.read_bytes()),
            caption="Here is the report",
            idempotency_key="k#1",
        )
        image_mid = await channel.send_file(
            target, OutFile(chart.name, chart.read_bytes()), idempotency_key="k#2"
        )
    kinds = {m.message_id: m for m in lark.bot_messages("oc_dm")}
    assert kinds[file_mid].msg_type == "file" and kinds[image_mid].msg_type == "image"
    file_key = json.loads(kinds[file_mid].content)["file_key"]
    assert lark.uploads[file_key] == ("report.pdf", b"%PDF-1.4 fake")
    assert lark.uploads[json.loads(kinds[image_mid].content)["image_key"]][1] == b"\x89PNG fake"
    assert any("Here is the report" in m.text for m in kinds.values())
    assert lark.reactions == [(event.message_id, "THUMBSUP")]


# -- formatting ----------------------------------------------------------------------------------


def test_card_markdown_neutralises_markup_outside_code() -> None:
    md = "Hi <at id=all></at> ![chart](https://x.test/c.png)\n```html\n<at id=all></at>\n```\n"
    out = _format.card_markdown(md)
    assert "<at id=all>" not in out.split("```")[0]
    assert "[chart](https://x.test/c.png)" in out and "![" not in out
    assert "```html\n<at id=all></at>\n```" in out  # code stays as written
    card = json.loads(_format.card_content("x"))
    assert card["config"]["update_multi"] is True and card["body"]["elements"][0]["tag"] == "markdown"


def test_render_keeps_cjk_cards_under_the_size_limit() -> None:
    parts = _format.render("汉字" * 12000)
    assert len(parts) >= 3
    assert all(len(p.payload["content"].encode()) <= _format.MAX_CARD_BYTES for p in parts)
    assert "".join(p.text for p in parts).replace("\n", "") == "汉字" * 12000
