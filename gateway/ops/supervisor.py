"""Runs each channel, restarts it with capped exponential backoff and jitter, keeps its state visible.

The supervisor is the only writer of a channel's :class:`~channels.base.ChannelStatus`. An adapter
says two things while it runs, through the one callback installed here (``report_connected`` and
``report_trouble``); everything else the supervisor reads from how ``run`` ended: a
:class:`FatalChannelError` keeps the channel FAILED with its reason (the others go on), any other
exception or a return restarts it (RECONNECTING, with the reason and the delay), cancellation stops
it. A channel that stayed connected for a while starts its backoff again from the bottom.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from channels.base import Channel, ChannelState, FatalChannelError, InboundSink
from gateway.ops.metrics import Metrics
from gateway.ops.tasks import TaskTracker

log = logging.getLogger(__name__)


class Backoff:
    def __init__(self, base: float = 1.0, cap: float = 60.0, stable_after: float = 60.0) -> None:
        self.base, self.cap, self.stable_after = base, cap, stable_after
        self.failures = 0

    def next_delay(self, ran_for: float) -> float:
        if ran_for >= self.stable_after:
            self.failures = 0
        self.failures += 1
        ceiling = min(self.cap, self.base * 2 ** (self.failures - 1))
        return random.uniform(ceiling / 2, ceiling)  # "equal jitter"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def run_once(channel: Channel, sink: InboundSink, *, restart: bool = False) -> None:
    """One run of ``channel``, its state kept from start to end; re-raises how the run ended.

    STARTING (RECONNECTING, keeping the last reason, on a ``restart``), then the adapter's reports
    (CONNECTED, or RECONNECTING with its reason) while this run is current, then FAILED on a
    :class:`FatalChannelError`, STOPPED on cancellation, RECONNECTING on anything else. Reports that
    arrive after the run ended (an SDK winding down) are ignored. Tests run an adapter once this way."""
    status = channel.status
    if restart:
        status.set(ChannelState.RECONNECTING, status.reason)
    else:
        status.set(ChannelState.STARTING)
    current = True

    def report(trouble: str | None) -> None:
        if not current:
            return
        if trouble is None:
            status.set(ChannelState.CONNECTED)
        else:
            status.set(ChannelState.RECONNECTING, trouble)

    channel.supervise(report)
    try:
        await channel.run(sink)
    except asyncio.CancelledError:
        current = False
        status.set(ChannelState.STOPPED)
        raise
    except FatalChannelError as exc:
        current = False
        status.set(ChannelState.FAILED, str(exc))
        raise
    except Exception as exc:
        current = False
        status.set(ChannelState.RECONNECTING, _describe(exc))
        raise
    current = False
    status.set(ChannelState.RECONNECTING, "the connection ended")


class ChannelSupervisor:
    def __init__(
        self,
        channel: Channel,
        sink: InboundSink,
        metrics: Metrics,
        backoff: Backoff | None = None,
        tasks: TaskTracker | None = None,
    ) -> None:
        self.channel = channel
        self._sink = sink
        self._metrics = metrics
        self._backoff = backoff or Backoff()
        self._tasks = tasks if tasks is not None else TaskTracker()
        """Holds the channel's loop; a loop that dies of a bug is logged with the channel's name."""
        channel.add_status_listener(self._on_state)

    def _on_state(self, channel: Channel) -> None:
        self._metrics.channel_up.labels(channel.name).set(1 if channel.state is ChannelState.CONNECTED else 0)

    @property
    def running(self) -> bool:
        """Whether the channel's loop is still going (it ends for good on a fatal error)."""
        return bool(self._tasks.running)

    def start(self) -> None:
        self._tasks.spawn(self._loop(), f"channel:{self.channel.name}")

    async def _loop(self) -> None:
        ch = self.channel
        while True:
            started = time.monotonic()
            try:
                await run_once(ch, self._sink, restart=self._backoff.failures > 0)
                reason = "the connection ended"
            except asyncio.CancelledError:
                raise
            except FatalChannelError as exc:
                self._metrics.errors.labels(ch.name, "fatal").inc()
                log.error("channel %s is down until fixed: %s", ch.name, exc)
                await _safe_close(ch)
                return
            except Exception as exc:
                reason = _describe(exc)
            await _safe_close(ch, restart=True)
            delay = self._backoff.next_delay(time.monotonic() - started)
            self._metrics.reconnects.labels(ch.name).inc()
            ch.status.set(ChannelState.RECONNECTING, f"{reason}; retrying in {delay:.1f}s")
            log.warning("channel %s: %s; restarting in %.1fs", ch.name, reason, delay)
            await asyncio.sleep(delay)

    async def close(self) -> None:
        """Stop for good (shutdown): a later :meth:`start`, such as a cluster's step-down making
        the channel send-only again while the daemon stops, starts nothing."""
        await self._tasks.close()
        await self.stop()

    async def switch(self, receive: bool) -> None:
        """Start (``True``) or stop taking in events, staying connected for sending: a leadership
        change on a platform that allows one receiver per bot. Only the inbound side is dropped
        (the adapter's :meth:`~channels.base.Channel.disconnect`), so an answer being sent or
        edited right now goes on over the same pool: closing the channel as :meth:`stop` does cut
        it, and a send whose answer was lost that way may be posted twice when retried. For
        adapters with :attr:`~channels.base.Channel.can_send_only` only."""
        await self._tasks.cancel_running()
        await _safe_close(self.channel, restart=True)
        self.channel.receive = receive
        self.start()

    async def stop(self) -> None:
        await self._tasks.cancel_running()  # open: a leader change stops and starts it again
        await _safe_close(self.channel)
        self.channel.status.set(ChannelState.STOPPED)


async def _safe_close(ch: Channel, *, restart: bool = False) -> None:
    """Release the channel; on a restart only its inbound connection (replies keep flowing)."""
    try:
        await (ch.disconnect() if restart else ch.close())
    except Exception as exc:
        log.debug("closing %s: %s", ch.name, exc)
