"""SlackChannel driven through the real slack-bolt / slack_sdk against tests/fakes/slack_server.py."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from channels.base import (
    Attachment,
    ChannelError,
    ChannelState,
    FatalChannelError,
    OutFile,
    PermanentSendError,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
)
from channels.slack import SlackChannel
from gateway.ops.supervisor import run_once
from tests.fakes.slack_server import FakeSlack
from tests.slack_channel_rig import Sink, make_channel, running


async def acked(fake: FakeSlack, *envelopes: dict) -> None:
    await fake.wait_for(lambda: all(fake.is_acked(e) for e in envelopes), 5)


# -- inbound ------------------------------------------------------------------------------------
async def test_mention_arrives_twice_with_one_key(slack: FakeSlack) -> None:
    sink = Sink()
    async with running(slack, sink) as channel:
        post = await slack.inject_mention("C1", "U_ALICE", "what is up?")
        await acked(slack, *post.envelopes)
    assert len(sink.items) == 2  # message + app_mention: the journal dedupes on the key
    assert len(set(sink.keys())) == 1
    first = sink.items[0]
    assert first.key == f"slack:C1:{post.ts}"
    assert first.text == "what is up?"
    assert first.addressed and not first.is_direct
    assert first.thread_id == post.ts and first.extra["thread_ts"] == post.ts
    assert channel.bot_user_id == "U_BOT"
    assert sink.items[0].conversation == sink.items[1].conversation


async def test_thread_reply_and_unmentioned_message(slack: FakeSlack) -> None:
    sink = Sink()
    async with running(slack, sink):
        root = await slack.inject_mention("C1", "U_ALICE", "start")
        reply = await slack.inject_thread_reply("C1", "U_BOB", "more context", root.ts)
        mentioned = await slack.inject_thread_reply("C1", "U_BOB", "and you?", root.ts, mention=True)
        loose = await slack.inject_message(
            "C2", "U_BOB", "just chatting, <https://x.io|see> &amp; <#C9|random>"
        )
        await acked(slack, *root.envelopes, *reply.envelopes, *mentioned.envelopes, *loose.envelopes)
    by_ts = {i.message_id: i for i in sink.items}
    assert by_ts[reply.ts].thread_id == root.ts and not by_ts[reply.ts].addressed
    assert by_ts[mentioned.ts].thread_id == root.ts and by_ts[mentioned.ts].addressed
    assert by_ts[mentioned.ts].text == "and you?"
    assert by_ts[reply.ts].conversation == by_ts[root.ts].conversation
    unaddressed = by_ts[loose.ts]
    assert not unaddressed.addressed and unaddressed.thread_id == loose.ts
    assert unaddressed.text == "just chatting, see (https://x.io) & #random"


async def test_direct_message(slack: FakeSlack) -> None:
    sink = Sink()
    slack.users["U_ALICE"] = {"id": "U_ALICE", "name": "alice", "profile": {"display_name": "Alice"}}
    async with running(slack, sink):
        dm = await slack.inject_dm("D1", "U_ALICE", "hello bot")
        await acked(slack, dm.envelope)
    [msg] = sink.items
    assert msg.is_direct and msg.addressed and msg.thread_id is None
    assert msg.text == "hello bot" and msg.sender_name == "Alice" and msg.user == "slack:U_ALICE"


async def test_own_posts_edits_and_subtypes_are_ignored(slack: FakeSlack) -> None:
    sink = Sink()
    async with running(slack, sink) as channel:
        user_post = await slack.inject_mention("C1", "U_ALICE", "hi")
        await acked(slack, *user_post.envelopes)
        target = sink.items[0].target
        ts = await channel.send(target, channel.render("hello *there*")[0], idempotency_key="k#0")
        await channel.edit(target, ts, channel.render("hello again")[0])
        joined = await slack.inject_message("C1", "U_CAROL", "has joined", subtype="channel_join")
        other_bot = await slack.inject_message("C1", "U_OTHER", "beep", extra={"bot_id": "B_OTHER"})
        # the echo of the post and the message_changed event of the edit are acked, not delivered
        await slack.wait_for(lambda: len(slack.sent) >= 6 and all(slack.is_acked(e) for e in slack.sent))
        await acked(slack, joined.envelope, other_bot.envelope)
    assert len(sink.items) == 2 and len(set(sink.keys())) == 1
    assert slack.thread("C1", user_post.ts) == {ts: "hello again"}


async def test_ack_waits_for_sink_and_failed_sink_is_not_acked(slack: FakeSlack) -> None:
    sink = Sink()
    sink.gate = asyncio.Event()
    async with running(slack, sink):
        first = await slack.inject_dm("D1", "U_ALICE", "one")
        await asyncio.wait_for(sink.entered.wait(), 5)
        assert not slack.is_acked(first.envelope)  # the sink holds it: not journaled, not acked
        sink.gate.set()
        await acked(slack, first.envelope)

        sink.fail_next = 1
        failed = await slack.inject_dm("D1", "U_ALICE", "two")
        after = await slack.inject_dm("D1", "U_ALICE", "three")
        await acked(slack, after.envelope)  # the sink is serialized: "two" was decided before
        assert not slack.is_acked(failed.envelope)

        retry = await slack.redeliver(failed.envelope)
        await acked(slack, retry)
    assert [i.text for i in sink.items] == ["one", "three", "two"]
    assert sink.items[2].key == f"slack:D1:{failed.ts}"


async def test_redelivered_envelope_has_same_key(slack: FakeSlack) -> None:
    sink = Sink()
    async with running(slack, sink):
        post = await slack.inject_message("C1", "U_ALICE", "<@U_BOT> deploy it")
        again = await slack.redeliver(post.envelope, retry_attempt=2)
        await acked(slack, post.envelope, again)
    assert len(sink.items) == 2 and sink.items[0].key == sink.items[1].key
    assert sink.items[0].addressed and sink.items[0].text == "deploy it"


async def test_unacked_event_is_replayed_after_reconnect() -> None:
    async with FakeSlack(redeliver_unacked_on_reconnect=True) as slack:
        sink = Sink()
        sink.fail_next = 1
        async with running(slack, sink):
            lost = await slack.inject_dm("D1", "U_ALICE", "survive me")
            await asyncio.wait_for(sink.entered.wait(), 5)
            await slack.close_ws()  # Slack replays what was not acked on the new connection
            await slack.wait_for(lambda: len(sink.items) == 1, 10)
            await slack.wait_for(lambda: len(slack.acks) == 1)
        assert not slack.is_acked(lost.envelope)
        assert sink.items[0].key == f"slack:D1:{lost.ts}" and sink.items[0].text == "survive me"
        assert slack.sent[-1]["retry_attempt"] == 1


async def test_reconnects_after_close_disconnect_abort_and_stall(slack: FakeSlack) -> None:
    sink = Sink()
    states: list[ChannelState] = []
    async with running(slack, sink) as channel:
        channel.add_status_listener(lambda ch: states.append(ch.state))
        breakers = [slack.close_ws, slack.send_disconnect, slack.abort_ws, slack.stall]
        for n, breaker in enumerate(breakers, start=2):
            result = breaker()
            if asyncio.iscoroutine(result):
                await result
            await slack.wait_connected(count=n, timeout=10)
            post = await slack.inject_dm("D1", "U_ALICE", f"after {breaker.__name__}")
            await acked(slack, post.envelope)
        await slack.wait_for(lambda: channel.state is ChannelState.CONNECTED, 5)
    assert [i.text for i in sink.items] == [f"after {b.__name__}" for b in breakers]
    assert slack.connections == 5


async def test_state_follows_the_socket_and_long_outage_fails_run(slack: FakeSlack) -> None:
    sink = Sink()
    channel = make_channel(slack)
    channel.give_up_after = 1.5
    task = asyncio.create_task(run_once(channel, sink))
    try:
        await slack.wait_for(lambda: channel.state is ChannelState.CONNECTED, 10)
        slack.fail("apps.connections.open", status=500, times=None)  # Slack is down for a while
        await slack.close_ws()
        await slack.wait_for(lambda: channel.state is ChannelState.RECONNECTING, 5)
        slack.clear_failures()
        await slack.wait_for(lambda: channel.state is ChannelState.CONNECTED, 5)
        post = await slack.inject_dm("D1", "U_ALICE", "back")
        await acked(slack, post.envelope)
        assert [i.text for i in sink.items] == ["back"]

        slack.fail("apps.connections.open", status=500, times=None)
        await slack.close_ws()
        with pytest.raises(ChannelError, match="not reconnected"):
            await asyncio.wait_for(asyncio.shield(task), 10)  # the supervisor restarts it from here
        assert not isinstance(task.exception(), FatalChannelError)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ChannelError):
            await task
        await channel.close()


async def test_invalid_tokens_are_fatal(slack: FakeSlack) -> None:
    slack.fail("auth.test", "invalid_auth", times=None)
    channel = make_channel(slack)
    with pytest.raises(FatalChannelError) as err:
        await asyncio.wait_for(run_once(channel, Sink()), 10)
    assert slack.bot_token not in str(err.value) and "invalid_auth" in str(err.value)
    await channel.close()

    slack.clear_failures()
    channel = make_channel(slack, app_token="xapp-revoked")
    with pytest.raises(FatalChannelError):
        await asyncio.wait_for(run_once(channel, Sink()), 10)
    await channel.close()
    assert slack.connections == 0


# -- outbound -----------------------------------------------------------------------------------
def test_render_long_answer_with_code_block() -> None:
    channel = SlackChannel("xoxb-x", "xapp-x", api_base_url="http://127.0.0.1:9/api/")
    code = "\n".join(f"    value_{i} = compute({i}) < limit & ok" for i in range(250))
    markdown = (
        f"# Report\n\nSome **bold** and [a link](https://example.com).\n\n```python\n{code}\n```\n\nDone."
    )
    parts = channel.render(markdown)
    assert len(parts) >= 2
    assert all(len(p.text) <= 3900 for p in parts)
    assert all(p.text.count("```") % 2 == 0 for p in parts)  # every part renders on its own
    joined = "\n".join(p.text for p in parts)
    assert parts[0].text.startswith("*Report*") and "*bold*" in joined
    assert "<https://example.com|a link>" in joined
    assert all(f"value_{i} = compute({i})" in joined for i in range(250))
    assert parts[-1].text.endswith("Done.")
    stream = channel.render_stream(markdown + "\n" + code)
    assert len(stream.text) <= 3900 and stream.text.count("```") % 2 == 0
    assert channel.render("   ") == []


async def test_send_edit_react_file_download(slack: FakeSlack, tmp_path: Path) -> None:
    channel = make_channel(slack)
    try:
        sink = Sink()
        async with running(slack, sink):
            post = await slack.inject_mention(
                "C1",
                "U_ALICE",
                "make a file",
                files=[
                    slack.add_file("notes.txt", b"hello file", "text/plain"),
                ],
            )
            await acked(slack, *post.envelopes)
        inbound = sink.items[0]
        assert inbound.attachments == (
            Attachment(inbound.attachments[0].file_id, "notes.txt", "text/plain", 10),
        )
        target = inbound.target

        ts = await channel.send(target, channel.render("Working on **it**")[0], idempotency_key="k#0")
        await channel.edit(target, ts, channel.render("Done: `x < y`")[0])
        # "<" inside code goes as an entity: Slack reads <…> even in code (channels/slack/render.py)
        assert slack.thread("C1", post.ts) == {ts: "Done: `x &lt; y`"}
        assert slack.post(ts).history == ["Working on *it*", "Done: `x &lt; y`"]

        await channel.typing(target)
        await channel.typing(target)  # once per message: no second API call
        await channel.react(target, "✅")
        await channel.react(target, "✅")  # already_reacted is fine
        assert slack.reactions[("C1", post.ts)] == ["eyes", "white_check_mark"]
        assert len(slack.calls_to("reactions.add")) == 3

        report = tmp_path / "report.csv"
        report.write_bytes(b"a,b\n1,2\n")
        file_id = await channel.send_file(
            target, OutFile(report.name, report.read_bytes()), caption="here you go", idempotency_key="k#1"
        )
        [upload] = slack.uploads
        assert (upload.file_id, upload.name, upload.content) == (file_id, "report.csv", b"a,b\n1,2\n")
        assert (upload.channel, upload.thread_ts, upload.initial_comment) == ("C1", post.ts, "here you go")

        assert await channel.download(inbound.attachments[0], limit=1000) == b"hello file"
        with pytest.raises(PermanentSendError):
            await channel.download(inbound.attachments[0], limit=5)
        foreign = Attachment("https://evil.example/steal", "x")
        with pytest.raises(PermanentSendError):
            await channel.download(foreign, limit=1000)
        assert slack.downloads == 1

        dm_target = ReplyTarget(platform="slack", chat_id="D1")
        dm_ts = await channel.send(dm_target, channel.render("top level")[0], idempotency_key="d#0")
        assert slack.thread("D1", None) == {dm_ts: "top level"}
    finally:
        await channel.close()


async def test_error_mapping(slack: FakeSlack) -> None:
    channel = make_channel(slack)
    target = ReplyTarget(platform="slack", chat_id="C1", thread_id="1.0")
    part = channel.render("hi")[0]
    try:
        slack.fail("chat.postMessage", status=429, retry_after=7)
        with pytest.raises(RetryAfter) as rate:
            await channel.send(target, part, idempotency_key="k")
        assert rate.value.seconds == 7

        slack.fail("chat.postMessage", "internal_error", status=503)
        with pytest.raises(TransientSendError):
            await channel.send(target, part, idempotency_key="k")

        slack.fail("chat.postMessage", "channel_not_found")
        with pytest.raises(PermanentSendError):
            await channel.send(target, part, idempotency_key="k")

        with pytest.raises(PermanentSendError):
            await channel.edit(target, "9.999", part)  # message_not_found

        slack.fail("chat.update", "token_revoked")
        with pytest.raises(FatalChannelError):
            await channel.edit(target, "9.999", part)

        ts = await channel.send(target, part, idempotency_key="k")  # failures were one-shot
        assert slack.post(ts).text == "hi"
    finally:
        await channel.close()
