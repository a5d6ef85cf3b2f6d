"""The daemon's one task tracker (gateway/ops/tasks.py): a background job that fails is logged with
its name, never dropped; shutdown cancels what still runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from channels.base import ChannelState
from gateway.ops import tasks as tasks_module
from gateway.ops.tasks import TaskTracker, cancel_and_wait, report_slow_stop
from tests.fakes.gateway_rig import make_config, make_gateway, skip_on_postgres, until


async def test_a_failed_task_is_logged_with_its_name(caplog: pytest.LogCaptureFixture) -> None:
    tracker = TaskTracker()

    async def boom() -> None:
        raise RuntimeError("the disk said no")

    with caplog.at_level(logging.ERROR, logger="gateway.ops.tasks"):
        task = tracker.spawn(boom(), "resume:telegram")
        await asyncio.wait([task])
        await asyncio.sleep(0)  # the done callback runs on the next loop pass
    failed = [r for r in caplog.records if r.name == "gateway.ops.tasks"]
    assert len(failed) == 1
    assert "background task resume:telegram failed: the disk said no" in failed[0].getMessage()
    assert failed[0].exc_info is not None
    assert len(tracker) == 0


async def test_close_cancels_what_still_runs_and_logs_no_failure(caplog: pytest.LogCaptureFixture) -> None:
    tracker = TaskTracker()
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = tracker.spawn(forever(), "idle")
    await started.wait()
    with caplog.at_level(logging.ERROR, logger="gateway.ops.tasks"):
        await tracker.close()
    assert task.cancelled()
    assert not [r for r in caplog.records if r.name == "gateway.ops.tasks"]


async def test_a_part_stops_only_its_own_tasks_and_the_root_holds_them_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = TaskTracker()
    cluster, channel = root.child(), root.child()

    async def forever() -> None:
        await asyncio.Event().wait()

    async def dies() -> None:
        raise RuntimeError("a bug in the sweep")

    beat = cluster.spawn(forever(), "cluster:heartbeat")
    loop = channel.spawn(forever(), "channel:telegram")
    with caplog.at_level(logging.ERROR, logger="gateway.ops.tasks"):
        sweep = cluster.spawn(dies(), "cluster:sweep")
        await asyncio.wait([sweep])
        await asyncio.sleep(0)
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.ops.tasks"]
    assert logged == ["background task cluster:sweep failed: a bug in the sweep"], "logged once, by name"
    assert root.running == {beat, loop}

    await cluster.close()
    assert beat.cancelled() and not loop.done(), "the cluster's close leaves the channel's loop"
    assert root.running == {loop}
    await root.close()
    assert loop.cancelled() and len(root) == 0
    late = cluster.spawn(forever(), "resume:telegram")  # its owner has stopped
    await asyncio.sleep(0)
    assert late.cancelled() and not root.running, "a closed tracker starts nothing"


async def test_a_part_cancelled_while_it_stops_another_part_ends_and_its_owner_stops() -> None:
    """The daemon that never exited on SIGTERM (CI): the cluster's leader loop became the leader
    just as the stop began, and its hook was stopping a channel's tasks (which take a moment to
    end) when the stop cancelled the loop. That cancel was swallowed with the channel task's, the
    loop slept on, and the cluster's close waited for it for ever."""
    cluster, channel = TaskTracker(), TaskTracker()
    in_hook = asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.2)  # closing a connection on the way out

    async def leader_loop() -> None:
        while True:
            in_hook.set()
            await channel.cancel_running()  # the lead hook switching the channel over
            await asyncio.sleep(3600)

    channel.spawn(slow_to_end(), "channel:telegram")
    await asyncio.sleep(0)
    loop = cluster.spawn(leader_loop(), "cluster:leader")
    await in_hook.wait()
    closing = asyncio.create_task(cluster.close())
    await asyncio.wait({closing}, timeout=5)  # not wait_for: its cancel at the deadline is swallowed too
    stopped = closing.done()
    closing.cancel()
    loop.cancel()
    assert stopped, "the cluster's close waited for its leader loop for ever"
    assert loop.cancelled(), "the loop ended by its cancel, not by an error of its own"


async def test_a_loop_that_lost_its_cancel_is_cancelled_again_and_named(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel swallowed inside a library (a shielded clean-up that then ends normally) must not
    hold the daemon's stop for ever: the loop is cancelled again, and the log says which."""
    monkeypatch.setattr(tasks_module, "AGAIN_AFTER", 0.2)
    tracker = TaskTracker()
    started = asyncio.Event()

    async def sweep_loop() -> None:
        started.set()
        while True:
            try:
                await asyncio.sleep(3600)  # the cancel lands here and is eaten, as a library did
            except asyncio.CancelledError:
                pass
            await asyncio.sleep(3600)

    loop = tracker.spawn(sweep_loop(), "cluster:sweep")
    await started.wait()
    with caplog.at_level(logging.WARNING, logger="gateway.ops.tasks"):
        await asyncio.wait_for(tracker.close(), 5)
    assert loop.cancelled()
    (again,) = [r.getMessage() for r in caplog.records if "again" in r.getMessage()]
    assert again.startswith("cluster:sweep: sweep_loop > sleep (asyncio/tasks.py:")
    assert again.endswith("did not end 0.2s after its cancel: cancelling it again")


async def test_a_stop_that_waits_says_which_tasks_it_waits_for_and_where(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What the operator reads when a stop hangs: each waiting task by name, with the chain of
    calls it waits in, instead of silence until the supervisor's SIGKILL."""

    async def close_the_pool() -> None:
        await asyncio.Event().wait()

    async def release_all() -> None:
        await close_the_pool()

    async def events() -> AsyncIterator[int]:
        await asyncio.Event().wait()
        yield 1

    async def run_graph() -> None:
        async for _ in events():
            pass

    stuck = asyncio.create_task(release_all(), name="store-close")
    streaming = asyncio.create_task(run_graph(), name="turn")
    with caplog.at_level(logging.WARNING, logger="gateway.ops.tasks"):
        reporter = asyncio.create_task(report_slow_stop(0.05, every=0.6))
        await until(lambda: len([r for r in caplog.records if "still waiting" in r.getMessage()]) >= 2)
        await cancel_and_wait([reporter, stuck, streaming])
    first, second = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()][:2]
    assert first.startswith("the stop is still waiting after 0s for: ")
    assert "store-close: release_all > close_the_pool > Event.wait (asyncio/locks.py:" in first
    assert "turn: run_graph > events > Event.wait (asyncio/locks.py:" in first  # into the async for
    assert "after 0s" not in second, "each report says how long it has waited"
    assert reporter.cancelled() and stuck.cancelled()


@skip_on_postgres(
    "the failure is made by closing the SQLite store under the gateway (on PostgreSQL a closed store's query did not fail within the wait in CI); the tracker is the same on both"
)
async def test_a_resume_that_fails_at_reconnect_is_logged_not_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The path that used to lose its exception: a channel (re)connects, the gateway resumes what
    the journal holds for it in the background, and the database is gone."""
    gw, channel, _ = await make_gateway(tmp_path, make_config(access={"allow_users": ["*"]}))
    await gw.store.close()  # every query of the resume now fails
    with caplog.at_level(logging.ERROR, logger="gateway.ops.tasks"):
        channel.force_state(ChannelState.CONNECTED)
        await until(lambda: any(r.name == "gateway.ops.tasks" for r in caplog.records))
    (record,) = [r for r in caplog.records if r.name == "gateway.ops.tasks"]
    assert record.getMessage().startswith(f"background task resume:{channel.name} failed")
    await gw.close(0.5)


async def test_the_in_flight_registry_wakes_a_waiter_when_a_key_is_let_go() -> None:
    """Approvals wait for a paused run to leave (gateway/turns/approvals.py) on this, not a poll."""
    from gateway.turns.inflight import InFlight

    inflight = InFlight(lambda entry: None)  # type: ignore[arg-type,return-value]
    await inflight.released("free")  # not held: returns at once
    assert inflight.take("k") and not inflight.take("k")
    waiter = asyncio.create_task(inflight.released("k"))
    await asyncio.sleep(0)
    assert not waiter.done()
    inflight.release("k")
    await asyncio.wait_for(waiter, 5)
    assert "k" not in inflight
