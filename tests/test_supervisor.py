"""Channel supervision, in process: restarts with backoff, a fatal error that keeps the channel down
with its reason, and which release (disconnect or close) happens when.

The real ChannelSupervisor and Gateway over FakeChannels that fail to connect, drop their
connection, or raise FatalChannelError on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from channels.base import ChannelState, FatalChannelError, Inbound
from gateway.daemon.gateway import Gateway
from gateway.ops.metrics import Metrics
from gateway.ops.supervisor import Backoff, ChannelSupervisor
from gateway.ops.tasks import TaskTracker
from tests.fakes.fake_channel import FakeChannel
from tests.fakes.fake_harness import FakeHarness
from tests.fakes.gateway_rig import USER, make_config, store_at, until


@contextlib.asynccontextmanager
async def supervised(
    channel: FakeChannel, metrics: Metrics | None = None, backoff: Backoff | None = None
) -> AsyncIterator[ChannelSupervisor]:
    async def sink(inbound: Inbound) -> None:
        return None

    sup = ChannelSupervisor(channel, sink, metrics or Metrics(), backoff or Backoff(0.05, 0.4))
    sup.start()
    try:
        yield sup
    finally:
        await sup.stop()


def metric(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_channel_that_fails_is_restarted_with_growing_backoff() -> None:
    ch, metrics = FakeChannel(), Metrics()
    ch.fail("run", RuntimeError("connect refused"), times=3)
    states: list[tuple[ChannelState, str | None]] = []
    ch.add_status_listener(lambda c: states.append((c.state, c.reason)))
    async with supervised(ch, metrics, Backoff(base=0.05, cap=1.0)):
        await until(lambda: ch.state is ChannelState.CONNECTED, what="connected at last")
        runs = ch.attempts("run")
        assert len(runs) == 4
        gaps = [b - a for a, b in itertools.pairwise(runs)]
        # Equal jitter: each wait is within [ceiling / 2, ceiling], the ceiling doubling from 0.05.
        assert 0.025 <= gaps[0] and 0.05 <= gaps[1] and 0.1 <= gaps[2], gaps
        assert gaps[2] <= 0.2 + 0.25, gaps  # the ceiling, plus room for a loaded machine
        reasons = [r for s, r in states if s is ChannelState.RECONNECTING and r and "retrying" in r]
        assert reasons and reasons[0].startswith("RuntimeError: connect refused; retrying in ")
        assert metric(metrics, "chital_reconnects_total", channel="telegram") == 3
        assert metric(metrics, "chital_channel_up", channel="telegram") == 1
        assert (ch.disconnects, ch.closes) == (3, 0), "a restart releases only the inbound side"


async def test_a_dropped_connection_is_restarted() -> None:
    ch, metrics = FakeChannel(), Metrics()
    async with supervised(ch, metrics):
        await until(lambda: ch.state is ChannelState.CONNECTED, what="connected")
        ch.drop(ConnectionResetError("peer went away"))
        await until(lambda: ch.state is ChannelState.RECONNECTING, what="reconnecting")
        assert metric(metrics, "chital_channel_up", channel="telegram") == 0
        assert ch.reason is not None and ch.reason.startswith("ConnectionResetError: peer went away")
        await until(lambda: ch.state is ChannelState.CONNECTED and ch.runs == 2, what="back")
        ch.drop()  # the connection simply ended
        await until(lambda: ch.runs == 3 and ch.state is ChannelState.CONNECTED, what="back again")
        assert ch.disconnects == 2 and ch.closes == 0


@pytest.mark.parametrize("when", ["connecting", "connected"])
async def test_a_fatal_error_keeps_the_channel_failed_with_its_reason(when: str) -> None:
    ch, metrics = FakeChannel(), Metrics()
    if when == "connecting":
        ch.fail("run", FatalChannelError("token revoked: set TELEGRAM_BOT_TOKEN"))
    async with supervised(ch, metrics) as sup:
        if when == "connected":
            await until(lambda: ch.state is ChannelState.CONNECTED, what="connected")
            assert sup.running
            ch.drop(FatalChannelError("token revoked: set TELEGRAM_BOT_TOKEN"))
        await until(lambda: ch.state is ChannelState.FAILED, what="failed")
        await asyncio.sleep(0.3)  # several backoff periods: no restart happens
        assert ch.state is ChannelState.FAILED and ch.runs == 1
        assert ch.reason == "token revoked: set TELEGRAM_BOT_TOKEN"
        assert metric(metrics, "chital_errors_total", channel="telegram", kind="fatal") == 1
        assert metric(metrics, "chital_reconnects_total", channel="telegram") == 0
        assert (ch.disconnects, ch.closes) == (0, 1), "down for good: everything released"
        assert not sup.running, "the loop ended: nothing restarts it"
    assert ch.state is ChannelState.STOPPED


async def test_stop_closes_the_channel() -> None:
    ch = FakeChannel()
    async with supervised(ch):
        await until(lambda: ch.state is ChannelState.CONNECTED, what="connected")
    assert ch.state is ChannelState.STOPPED and (ch.disconnects, ch.closes) == (0, 1)


async def test_a_closed_supervisor_starts_nothing_and_the_daemon_tracker_holds_its_loop() -> None:
    root = TaskTracker()

    async def sink(inbound: Inbound) -> None:
        return None

    ch = FakeChannel()
    sup = ChannelSupervisor(ch, sink, Metrics(), Backoff(0.05, 0.4), tasks=root.child())
    sup.start()
    await until(lambda: ch.state is ChannelState.CONNECTED, what="connected")
    assert [t.get_name() for t in root.running] == ["channel:telegram"], "the daemon's tracker holds it"
    await sup.stop()
    sup.start()  # a leader change: stopped, then started again
    await until(lambda: ch.runs == 2 and ch.state is ChannelState.CONNECTED, what="restarted")
    await sup.close()
    sup.start()  # a cluster's step-down during shutdown
    await asyncio.sleep(0.2)
    assert ch.runs == 2 and not sup.running and ch.state is ChannelState.STOPPED
    assert not root.running


def test_backoff_grows_to_its_cap_and_restarts_after_a_stable_run() -> None:
    backoff = Backoff(base=1.0, cap=8.0, stable_after=60.0)
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0]
    for ceiling in ceilings:
        delay = backoff.next_delay(ran_for=0.5)
        assert ceiling / 2 <= delay <= ceiling
    assert backoff.next_delay(ran_for=120.0) <= 1.0, "a channel that stayed up starts from the bottom"


async def test_a_restart_does_not_cut_a_reply_in_flight_and_other_channels_go_on(tmp_path: Path) -> None:
    """The restart calls disconnect(), not close(): a send under way finishes and is recorded. A
    channel down for good does not hold up the others."""
    config = make_config(access={"allow_users": [str(USER)]}, delivery={"first_edit_delay": 0.0})
    telegram, slack = FakeChannel("telegram"), FakeChannel("slack")
    metrics = Metrics()
    gw = Gateway(config, await store_at(tmp_path / "g.sqlite"), FakeHarness(), metrics)
    sups = [ChannelSupervisor(ch, gw.attach(ch), metrics, Backoff(0.05, 0.2)) for ch in (telegram, slack)]
    slack.fail("run", FatalChannelError("invalid_auth"))
    for sup in sups:
        sup.start()
    try:
        await until(lambda: telegram.state is ChannelState.CONNECTED, what="telegram up")
        await until(lambda: slack.state is ChannelState.FAILED, what="slack down")
        telegram.hold("send")
        msg = telegram.message(USER, "answer me across a restart")
        await telegram.deliver(msg)
        await until(lambda: telegram.held("send"), what="reply on its way")
        telegram.drop(ConnectionResetError("socket closed"))
        await until(lambda: telegram.runs == 2 and telegram.state is ChannelState.CONNECTED, what="restarted")
        telegram.release("send")
        await until(lambda: telegram.replies_to(msg.message_id), what="reply")
        assert telegram.replies_to(msg.message_id) == ["echo: answer me across a restart"]
        assert (telegram.disconnects, telegram.closes) == (1, 0)
        assert len(telegram.attempts("send")) == 1, "sent once, not retried"
        assert slack.state is ChannelState.FAILED and slack.reason == "invalid_auth"
    finally:
        for sup in sups:
            await sup.stop()
        await gw.close(0.5)
        await gw.store.close()
    assert telegram.closes == 1 and slack.closes == 2  # once when it failed, once at stop
