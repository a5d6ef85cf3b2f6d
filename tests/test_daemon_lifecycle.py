"""Crash, restart and shutdown, in process: what the journal and the outbox make of a process that
stops mid-work. A "crash" stops the first Gateway where it stands (journal entries stay open, nothing
more is sent); the next process is a new Gateway on the same Store with a new adapter for the same
platform, and resumes when its channel connects. The kill -9 subprocess tests stay in the e2e files.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent.events import AgentEvent, FileOut, Final, TextDelta
from channels.base import Channel, ChannelState
from gateway.config.schema import Config, parse_config
from gateway.daemon import app
from gateway.delivery.reply import SUPERSEDES
from gateway.store.entries import JournalKind, JournalState
from tests.fakes.fake_channel import FakeChannel
from tests.fakes.fake_harness import Call, FakeHarness
from tests.fakes.gateway_rig import USER, crash, fake_rig, make_config, settled, until

RESUMED = "♻️ I was restarted while answering; picking up where I left off…"


def config() -> Config:
    return make_config(access={"allow_users": [str(USER)]}, delivery={"first_edit_delay": 0.0})


async def test_a_turn_cut_by_a_crash_resumes_in_the_same_message(tmp_path: Path) -> None:
    stuck = asyncio.Event()

    async def half(call: Call) -> AsyncIterator[AgentEvent]:
        yield TextDelta("the first half")
        await stuck.wait()  # the process dies here
        yield Final("never")

    first = FakeHarness()
    first.on("question", half)
    async with fake_rig(tmp_path, config(), harness=first) as rig1:
        ch1 = rig1.channel
        msg = ch1.message(USER, "question")
        await ch1.deliver(msg)
        await until(lambda: ch1.replies_to(msg.message_id) == ["the first half"], what="partial answer")
        await crash(rig1)
        (entry,) = await rig1.store.journal_open()
        assert entry.state is JournalState.RUNNING and entry.attempts == 1

        second = FakeHarness()
        async with fake_rig(tmp_path, config(), store=rig1.store, channel=ch1.restarted(), harness=second):
            await until(lambda: ch1.replies_to(msg.message_id) == ["echo: question"], what="resumed")
            assert await settled(rig1.store) == {"done": 1}
        (reply,) = ch1.sent
        assert reply.texts == ["the first half", RESUMED, "echo: question"], "one message, edited on"
        assert [c.message_id for c in second.calls] == [msg.key], "the agent is asked again, same id"


async def test_messages_waiting_at_a_crash_run_after_it_in_order(tmp_path: Path) -> None:
    first = FakeHarness()
    first.gate.clear()  # the agent never answers before the crash
    async with fake_rig(tmp_path, config(), harness=first) as rig1:
        ch1 = rig1.channel
        msgs = [ch1.message(USER, f"q{i}") for i in range(3)]
        for msg in msgs:
            await ch1.deliver(msg)
        await until(lambda: first.calls, what="first turn running")
        await crash(rig1)
        states = [(e.key, e.state) for e in await rig1.store.journal_open()]
        assert states == [(msgs[0].key, "running"), (msgs[1].key, "pending"), (msgs[2].key, "pending")]

        second = FakeHarness()
        async with fake_rig(tmp_path, config(), store=rig1.store, channel=ch1.restarted(), harness=second):
            assert await settled(rig1.store) == {"done": 3}
        assert [c.text for c in second.calls] == ["q0", "q1", "q2"]
        for msg in msgs:
            assert ch1.replies_to(msg.message_id) == [f"echo: {msg.text}"]


async def test_files_sent_before_a_crash_are_not_sent_again(tmp_path: Path) -> None:
    def harness() -> FakeHarness:
        h = FakeHarness()
        h.outputs = {"/out/a.txt": b"A" * 10, "/out/b.txt": b"B" * 20}

        async def two_files(call: Call) -> AsyncIterator[AgentEvent]:
            yield FileOut("/out/a.txt")
            yield FileOut("/out/b.txt")
            yield Final("two files")

        h.on("files", two_files)
        return h

    async with fake_rig(tmp_path, config(), harness=harness()) as rig1:
        ch1 = rig1.channel
        ch1.hold("send_file", after=1)  # a.txt goes out, the process dies sending b.txt
        msg = ch1.message(USER, "files")
        await ch1.deliver(msg)
        await until(lambda: ch1.held("send_file"), what="second file in flight")
        await crash(rig1)

        async with fake_rig(tmp_path, config(), store=rig1.store, channel=ch1.restarted(), harness=harness()):
            assert await settled(rig1.store) == {"done": 1}
        assert [(m.file.name, m.file.data) for m in ch1.files if m.file] == [
            ("a.txt", b"A" * 10),
            ("b.txt", b"B" * 20),
        ]
        assert ch1.replies_to(msg.message_id) == ["two files"]


async def test_a_send_cut_by_a_crash_is_answered_once_saying_it_replaces_it(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig1:
        ch1 = rig1.channel
        ch1.hold("send")  # the process dies with the send marked, its id never recorded
        msg = ch1.message(USER, "hello")
        await ch1.deliver(msg)
        await until(lambda: ch1.held("send"), what="send in flight")
        await crash(rig1)
        async with fake_rig(tmp_path, config(), store=rig1.store, channel=ch1.restarted()):
            await until(lambda: ch1.replies_to(msg.message_id), what="answer")
            assert await settled(rig1.store) == {"done": 1}
        assert ch1.replies_to(msg.message_id) == [SUPERSEDES + "echo: hello"]


async def test_a_turn_that_keeps_dying_is_given_up_with_a_note(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig1:
        store = rig1.store
        msg = rig1.channel.message(USER, "poison")
        await crash(rig1)
        assert await store.journal_add(msg, JournalKind.TURN)
        for _ in range(3):  # three runs that each died
            await store.journal_set(msg.key, JournalState.RUNNING)
        second = FakeHarness()
        async with fake_rig(
            tmp_path, config(), store=store, channel=rig1.channel.restarted(), harness=second
        ):
            assert await settled(store) == {"failed": 1}
        assert rig1.channel.replies_to(msg.message_id) == [
            "⚠️ I could not finish this answer after several tries. Please ask again."
        ]
        assert second.calls == []


async def test_shutdown_lets_turns_finish_within_the_grace_and_cuts_the_rest(tmp_path: Path) -> None:
    slow_done, never = asyncio.Event(), asyncio.Event()

    async def slow(call: Call) -> AsyncIterator[AgentEvent]:
        await asyncio.sleep(0.2)
        slow_done.set()
        yield Final("made it")

    async def endless(call: Call) -> AsyncIterator[AgentEvent]:
        await never.wait()
        yield Final("never")

    harness = FakeHarness()
    harness.on("slow", slow)
    harness.on("endless", endless)
    two_users = make_config(access={"allow_users": [str(USER), "201"]}, delivery={"first_edit_delay": 0.0})
    async with fake_rig(tmp_path, two_users, harness=harness) as rig:
        ch = rig.channel
        slow_msg, endless_msg = ch.message(USER, "slow"), ch.message(201, "endless")
        await ch.deliver(slow_msg)
        await ch.deliver(endless_msg)
        await until(lambda: len(harness.calls) == 2, what="both running")
        cut = await rig.gateway.close(grace=1.0)
        assert cut == 1 and slow_done.is_set()
        assert ch.replies_to(slow_msg.message_id) == ["made it"]
        (left,) = await rig.store.journal_open()
        assert left.key == endless_msg.key and left.state is JournalState.RUNNING, "resumed next start"


# -- the daemon's own start and stop ------------------------------------------------------------------
def fake_platform(monkeypatch: pytest.MonkeyPatch, channel: FakeChannel, harness: FakeHarness) -> None:
    """The daemon builds ``channel`` and ``harness`` instead of the real adapters and agent."""

    def build_channels(cfg: Config, room: object = None) -> tuple[list[Channel], dict[str, str]]:
        return [channel], {}

    async def open_harness(
        cfg: Config, *_: object, **__: object
    ) -> FakeHarness:  # (scheduler, usage, acp, tasks)
        return harness

    monkeypatch.setattr(app, "build_channels", build_channels)
    monkeypatch.setattr(app, "open_harness", open_harness)


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    """Daemon.start() tunes the collector for a long-lived process; not for the test run's."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def daemon_config(tmp_path: Path, grace: float) -> Config:
    return parse_config(
        {
            "access": {"allow_users": [str(USER)]},
            "storage": {"path": str(tmp_path / "data"), "reserve_mb": 0},
            "concurrency": {"shutdown_grace": grace},
            "delivery": {"first_edit_delay": 0.0},
            "http": {"enabled": False},
        }
    )


async def test_the_daemon_cuts_a_turn_at_stop_and_the_next_one_answers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    channel, harness = FakeChannel(), FakeHarness()
    harness.gate.clear()
    fake_platform(monkeypatch, channel, harness)
    daemon = app.Daemon(daemon_config(tmp_path, grace=0.1))
    await daemon.start()
    await until(daemon.ready, what="ready")
    # One tracker holds every part's background work: the loops, the channel's supervisor, the turn.
    names = {task.get_name() for task in daemon.tasks.running}
    assert {"retention", "schedules", f"channel:{channel.name}"} <= names, names
    msg = channel.message(USER, "long job")
    await channel.deliver(msg)
    await until(lambda: harness.calls, what="turn running")
    with caplog.at_level(logging.WARNING, logger="gateway.daemon.app"):
        assert await daemon.stop() == []
    assert not daemon.tasks.running
    assert not [r for r in caplog.records if "still running after shutdown" in r.getMessage()]
    assert daemon.state == "stopped" and channel.state is ChannelState.STOPPED
    assert channel.closes == 1 and harness.closed and daemon.store is None

    channel2, harness2 = channel.restarted(), FakeHarness()
    fake_platform(monkeypatch, channel2, harness2)
    daemon2 = app.Daemon(daemon_config(tmp_path, grace=1.0))
    await daemon2.start()
    try:
        await until(lambda: channel2.replies_to(msg.message_id), what="answered by the next run")
        assert channel2.replies_to(msg.message_id) == ["echo: long job"]
        assert [c.text for c in harness2.calls] == ["long job"]
    finally:
        await daemon2.stop()
