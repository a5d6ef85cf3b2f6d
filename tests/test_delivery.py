"""Delivery, in process: paced streaming, the split final, the outbox, files, and parked retries.

Real Gateway, Reply, pacer, Store; a FakeChannel whose calls can fail with any ChannelError or be
held, so the failure paths are driven exactly (what the platform outage benches do with real SDKs).
"""

from __future__ import annotations

import asyncio
import itertools
import types
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import gateway.delivery.pacing
import gateway.delivery.parking
from agent.events import AgentEvent, FileOut, Final, TextDelta
from channels.base import ChannelState, NotModified, PermanentSendError, RetryAfter, TransientSendError
from gateway.config.schema import Config
from gateway.delivery.pacing import ChatPacer
from gateway.delivery.reply import SENDING, SUPERSEDES, Reply
from gateway.intake.attachments import FILE_PART
from gateway.ops.metrics import Metrics
from gateway.store.entries import JournalState
from gateway.store.journal import Store
from tests.fakes.fake_channel import FakeChannel
from tests.fakes.fake_harness import Call, Script
from tests.fakes.gateway_rig import USER, fake_rig, make_config, quiet, settled, store_at, until

ANSWER = " ".join(f"word{i:02d}" for i in range(30))  # 209 characters


def streamed(deltas: list[str], every: float) -> Script:
    async def script(call: Call) -> AsyncIterator[AgentEvent]:
        for delta in deltas:
            yield TextDelta(delta)
            await asyncio.sleep(every)
        yield Final("".join(deltas).strip())

    return script


def config(**delivery: object) -> Config:
    return make_config(access={"allow_users": [str(USER)]}, delivery={"first_edit_delay": 0.1, **delivery})


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parked retries after 0.1, 0.2, 0.4 s (no jitter); the pacer's quick retry after 0.25 s."""
    monkeypatch.setattr(gateway.delivery.parking, "RETRY_FIRST", 0.1)
    monkeypatch.setattr(gateway.delivery.parking, "random", types.SimpleNamespace(uniform=lambda a, b: b))
    monkeypatch.setattr(gateway.delivery.pacing, "random", types.SimpleNamespace(random=lambda: 0.0))


# -- streaming -------------------------------------------------------------------------------------
async def test_streaming_edits_one_message_at_the_platform_pace(tmp_path: Path) -> None:
    channel = FakeChannel(edit_interval=0.2)
    async with fake_rig(tmp_path, config(), channel=channel) as rig:
        deltas = [f"word{i:02d} " for i in range(30)]
        rig.harness.on("stream", streamed(deltas, 0.03))
        msg = channel.message(USER, "stream")
        await channel.deliver(msg)
        final = "".join(deltas).strip()
        await until(lambda: channel.replies_to(msg.message_id) == [final], what="final")
        (reply,) = [m for m in channel.sent if m.target.reply_to == msg.message_id]
        assert 3 <= len(reply.texts) <= 9, reply.texts  # ~0.9 s of text at one edit per 0.2 s
        assert all(final.startswith(t.strip()) for t in reply.texts), "each edit shows more"
        streaming = [e.at for e in channel.edits][:-1]  # the final edit goes out at once
        assert all(b - a >= 0.19 for a, b in itertools.pairwise(streaming)), streaming
        first_send = channel.attempts("send")[0]
        assert first_send - channel.attempts("run")[0] >= 0.1, "text gathers for first_edit_delay"


async def test_a_fast_answer_goes_out_whole_and_a_non_editing_platform_gets_no_edits(tmp_path: Path) -> None:
    channel = FakeChannel(can_edit=False)
    async with fake_rig(tmp_path, config(), channel=channel) as rig:
        rig.harness.on("slowish", streamed(["a ", "b ", "c"], 0.1))
        quick, slowish = channel.message(USER, "quick"), channel.message(USER, "slowish")
        await channel.deliver(quick)
        await channel.deliver(slowish)
        await until(lambda: channel.replies_to(slowish.message_id) == ["a b c"], what="answer")
        assert channel.replies_to(quick.message_id) == ["echo: quick"]
        assert channel.edits == [] and len(channel.sent) == 2


async def test_a_dm_streams_as_draft_previews_then_one_message(tmp_path: Path) -> None:
    channel = FakeChannel(drafts=True, edit_interval=0.05)
    async with fake_rig(tmp_path, config(), channel=channel) as rig:
        rig.harness.on("draft", streamed(["one ", "two ", "three"], 0.1))
        msg = channel.message(USER, "draft")
        await channel.deliver(msg)
        await until(lambda: channel.replies_to(msg.message_id), what="answer")
        assert channel.replies_to(msg.message_id) == ["one two three"]
        assert channel.edits == [], "the message appears once, complete"
        previews = [p.text for p in channel.platform.previews]
        assert (
            previews
            and previews[-1].startswith("one two")
            and all(p.key == msg.key for p in channel.platform.previews)
        )


async def test_a_server_without_drafts_falls_back_to_streamed_edits(tmp_path: Path) -> None:
    """An older self-hosted Bot API answers sendMessageDraft with an error: the answer still
    streams, as edits of one message, and arrives once."""
    channel = FakeChannel(drafts=True, edit_interval=0.05)
    channel.fail("preview", PermanentSendError("Not Found: method not found"), times=None)
    async with fake_rig(tmp_path, config(), channel=channel) as rig:
        rig.harness.on("draft", streamed(["one ", "two ", "three"], 0.1))
        msg = channel.message(USER, "draft")
        await channel.deliver(msg)
        await until(lambda: channel.replies_to(msg.message_id) == ["one two three"], what="answer")
        assert channel.platform.previews == []
        assert len(channel.sent) == 1 and channel.edits, "one message, edited as the text grew"


async def test_a_long_final_is_split_and_the_streamed_message_becomes_part_one(tmp_path: Path) -> None:
    channel = FakeChannel(max_message_len=80, edit_interval=0.05)
    async with fake_rig(tmp_path, config(), channel=channel) as rig:
        words = ANSWER.split(" ")
        rig.harness.on("long", streamed([w + " " for w in words], 0.01))
        msg = channel.message(USER, "long")
        await channel.deliver(msg)
        await until(lambda: " ".join(channel.replies_to(msg.message_id)).split() == words, what="whole text")
        parts = channel.replies_to(msg.message_id)
        assert parts == [r.text for r in channel.render(ANSWER)] and len(parts) >= 3
        assert all(len(p) <= 80 for p in parts)
        first = next(m for m in channel.sent if m.target.reply_to == msg.message_id)
        assert len(first.texts) > 1, "part one is the message that streamed, edited"
        outbox = await rig.store.outbox_get(msg.key)
        assert sorted(outbox) == list(range(len(parts))) and outbox[0] == first.message_id


# -- the outbox ----------------------------------------------------------------------------------------
async def _reply(store: Store, channel: FakeChannel, key: str = "telegram:200:m1") -> Reply:
    target = channel.message(USER, "x", mid=key.rsplit(":", 1)[1]).target
    return Reply(channel, target, key, store, ChatPacer(channel.capabilities), Metrics())


async def test_a_new_send_is_marked_sending_until_its_id_is_recorded(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    channel = FakeChannel()
    try:
        reply = await _reply(store, channel)
        channel.hold("send")
        finishing = asyncio.create_task(reply.finish("hello"))
        await until(lambda: channel.held("send"), what="send in flight")
        assert await store.outbox_get(reply.key) == {0: SENDING}
        channel.release("send")
        await finishing
        assert await store.outbox_get(reply.key) == {0: channel.sent[0].message_id}

        refused = await _reply(store, channel, "telegram:200:m2")
        channel.fail("send", PermanentSendError("chat not found"))
        with pytest.raises(PermanentSendError):
            await refused.finish("nope")
        assert await store.outbox_get(refused.key) == {}, "a refused send leaves no mark behind"

        deduping = FakeChannel(dedupes_sends=True)
        nonced = await _reply(store, deduping, "telegram:200:m3")
        deduping.hold("send")
        task = asyncio.create_task(nonced.finish("hi"))
        await until(lambda: deduping.held("send"), what="send in flight")
        assert await store.outbox_get(nonced.key) == {}, "a platform that dedupes needs no mark"
        deduping.release("send")
        await task
    finally:
        await store.close()


async def test_a_restart_edits_the_messages_the_outbox_knows(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    channel = FakeChannel()
    try:
        before = await _reply(store, channel)
        await before.status("partial answer")
        after = await _reply(store, channel.restarted())  # the next process, same message key
        await after.load()
        assert after.has_message and not after.supersedes
        await after.finish("the complete answer")
        assert [m.texts for m in channel.sent] == [["partial answer", "the complete answer"]]
    finally:
        await store.close()


async def test_a_sending_mark_left_by_a_crash_is_recovered_or_superseded(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    try:
        # The platform can search for the key (Slack's metadata): the orphan is found and edited.
        finder = FakeChannel(finds_orphans=True)
        key = "telegram:200:m1"
        orphan = finder.platform.post(finder.message(USER, "x", mid="m1").target, "partial", f"{key}#0")
        await store.outbox_put(key, 0, SENDING)
        reply = await _reply(store, finder, key)
        await reply.load()
        await reply.finish("complete")
        assert finder.recovered == [f"{key}#0"] and not reply.supersedes
        assert [m.texts for m in finder.sent] == [["partial", "complete"]]
        assert await store.outbox_get(key) == {0: orphan.message_id}

        # It cannot (a Telegram group): the new answer says it replaces whatever was cut off.
        blind = FakeChannel()
        key2 = "telegram:200:m2"
        await store.outbox_put(key2, 0, SENDING)
        reply2 = await _reply(store, blind, key2)
        await reply2.load()
        assert reply2.supersedes
        await reply2.finish("complete")
        assert [m.text for m in blind.sent] == [SUPERSEDES + "complete"]
    finally:
        await store.close()


# -- files ---------------------------------------------------------------------------------------------
async def test_presented_files_are_sent_once_with_their_bytes(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig:
        ch, harness = rig.channel, rig.harness
        harness.outputs["/mnt/user-data/outputs/report.csv"] = b"a,b\n1,2\n"

        async def present(call: Call) -> AsyncIterator[AgentEvent]:
            yield FileOut("/mnt/user-data/outputs/report.csv", "the report")
            yield FileOut("/mnt/user-data/outputs/report.csv", "the report")  # presented twice
            yield FileOut("/mnt/user-data/outputs/missing.png")
            yield Final("here you are")

        harness.on("files please", present)
        msg = ch.message(USER, "files please")
        await ch.deliver(msg)
        await until(lambda: any("could not send" in t for t in ch.replies_to(msg.message_id)), what="note")
        await quiet(0.1)
        (sent,) = ch.files
        assert sent.file is not None and (sent.file.name, sent.file.data) == ("report.csv", b"a,b\n1,2\n")
        assert sent.text == "the report" and sent.target.reply_to == msg.message_id
        texts = ch.replies_to(msg.message_id)
        assert texts[0] == "here you are" and texts[1].startswith("⚠️ I could not send `missing.png`:")
        assert (await rig.store.outbox_get(msg.key))[FILE_PART] == sent.message_id
        assert await settled(rig.store) == {"done": 1}  # done a moment after the last send


async def test_a_file_refused_after_the_answer_leaves_the_answer_and_says_what_is_missing(
    tmp_path: Path,
) -> None:
    """The answer is out when the platform refuses the file that follows it: the answer stays as it
    was (never edited into an error), a note under it names the file and the platform's reason, the
    entry is done and not run again."""
    async with fake_rig(tmp_path, config()) as rig:
        ch, harness = rig.channel, rig.harness
        harness.outputs["/mnt/user-data/outputs/big.zip"] = b"PK" * 64

        async def present(call: Call) -> AsyncIterator[AgentEvent]:
            yield FileOut("/mnt/user-data/outputs/big.zip", "the archive")
            yield Final("the archive is attached")

        harness.on("zip it", present)
        ch.fail("send_file", PermanentSendError("Request Entity Too Large"), times=None)
        msg = ch.message(USER, "zip it")
        await ch.deliver(msg)
        await until(lambda: len(ch.replies_to(msg.message_id)) >= 2, what="answer and note")
        await quiet(0.2)
        texts = ch.replies_to(msg.message_id)
        assert texts[0] == "the archive is attached", texts
        assert texts[1] == "⚠️ I could not send `big.zip`: `Request Entity Too Large`", texts
        assert len(texts) == 2 and not ch.files
        assert not any("while answering" in t for t in texts)
        assert await settled(rig.store) == {"done": 1}  # done a moment after the last send
        assert len(harness.calls) == 1


# -- failures and parked retries -------------------------------------------------------------------
async def test_transient_failures_park_the_reply_and_retry_with_backoff(
    tmp_path: Path, fast_retries: None
) -> None:
    async with fake_rig(tmp_path, config()) as rig:
        ch = rig.channel
        ch.fail("send", TransientSendError("502 Bad Gateway"), times=6)  # 3 rounds of 2 attempts
        msg = ch.message(USER, "through the outage")
        await ch.deliver(msg)
        await until(lambda: ch.replies_to(msg.message_id), timeout=10, what="answer after the outage")
        assert ch.replies_to(msg.message_id) == ["echo: through the outage"]
        tries = ch.attempts("send")
        assert len(tries) == 7
        rounds = [tries[i] - tries[i - 1] for i in (2, 4, 6)]  # waits between parked rounds
        assert rounds[0] >= 0.09 and rounds[1] >= 0.19 and rounds[2] >= 0.39, rounds
        assert rounds[0] < rounds[1] < rounds[2], "the backoff doubles"
        assert rig.metric("chital_delivery_retries_total", channel="telegram") == 3
        assert await settled(rig.store) == {JournalState.DONE: 1}


async def test_a_parked_reply_goes_out_at_once_when_its_channel_reconnects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway.delivery.parking, "RETRY_FIRST", 60.0)  # only the reconnect can bring it
    monkeypatch.setattr(gateway.delivery.pacing, "random", types.SimpleNamespace(random=lambda: 0.0))
    async with fake_rig(tmp_path, config()) as rig:
        ch = rig.channel
        ch.fail("send", TransientSendError("connection reset"), times=2)
        msg = ch.message(USER, "hello")
        await ch.deliver(msg)
        await until(
            lambda: rig.metric("chital_delivery_retries_total", channel="telegram") == 1, what="parked"
        )
        assert [e.state for e in await rig.store.journal_open()] == [JournalState.PENDING]
        ch.force_state(ChannelState.RECONNECTING)  # what the supervisor shows while it restarts
        ch.force_state(ChannelState.CONNECTED)
        await until(lambda: ch.replies_to(msg.message_id), timeout=3, what="answer at reconnect")
        assert ch.replies_to(msg.message_id) == ["echo: hello"]


async def test_a_permanent_refusal_fails_the_entry_with_a_visible_error(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig:
        ch = rig.channel
        ch.fail("send", PermanentSendError("message too long"))
        msg = ch.message(USER, "hi")
        await ch.deliver(msg)
        (text,) = await until(lambda: ch.replies_to(msg.message_id), what="error note")
        assert text == "⚠️ Something went wrong on my side while answering. Please try again."
        assert await settled(rig.store) == {"failed": 1}
        assert rig.metric("chital_delivery_retries_total", channel="telegram") == 0


async def test_retry_after_is_obeyed_and_not_a_failure(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig:
        ch = rig.channel
        ch.fail("send", RetryAfter(0.3))
        msg = ch.message(USER, "slow down")
        await ch.deliver(msg)
        await until(lambda: ch.replies_to(msg.message_id), what="answer")
        first, second = ch.attempts("send")
        assert second - first >= 0.29
        assert rig.metric("chital_platform_429_total", channel="telegram") == 1
        assert ch.replies_to(msg.message_id) == ["echo: slow down"]


async def test_edit_failures_while_streaming_are_harmless(tmp_path: Path) -> None:
    channel = FakeChannel(edit_interval=0.05)
    async with fake_rig(tmp_path, config(first_edit_delay=0.0), channel=channel) as rig:
        rig.harness.on("s", streamed(["alpha ", "beta ", "gamma ", "delta"], 0.08))
        channel.fail("edit", NotModified("same text"))
        channel.fail("edit", TransientSendError("flaky"), times=2)
        msg = channel.message(USER, "s")
        await channel.deliver(msg)
        await until(lambda: channel.replies_to(msg.message_id) == ["alpha beta gamma delta"], what="final")
        assert await settled(rig.store) == {"done": 1}


async def test_a_deleted_message_is_replaced_by_a_new_one(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig:
        ch = rig.channel
        release = asyncio.Event()

        async def script(call: Call) -> AsyncIterator[AgentEvent]:
            yield TextDelta("thinking")
            await release.wait()
            yield Final("the answer")

        rig.harness.on("q", script)
        msg = ch.message(USER, "q")
        await ch.deliver(msg)
        await until(lambda: ch.replies_to(msg.message_id) == ["thinking"], what="streamed")
        ch.platform.delete(ch.sent[0].message_id)  # the user deletes it meanwhile
        release.set()
        await until(lambda: "the answer" in ch.replies_to(msg.message_id), what="new message")
        assert [m.deleted for m in ch.sent] == [True, False]
