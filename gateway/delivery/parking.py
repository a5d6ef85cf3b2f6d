"""Replies parked after a transient delivery failure, and their in-process retries.

A 5xx, a network error or a channel restart must not leave an answer waiting for the next start of
the daemon: the journal entry goes back to ``pending`` and is dispatched again after 1, 2, 4, 8, 15,
15… seconds (jittered), and at once when its channel reconnects (the gateway's resume). Delivery
failures do not count as runs of the agent. After ``delivery.retry_window`` the entry is failed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from channels.base import ChannelError, PermanentSendError
from gateway.ops.metrics import Metrics
from gateway.store.entries import JournalEntry
from gateway.store.journal import Store

log = logging.getLogger(__name__)

RETRY_FIRST = 1.0
RETRY_CAP = 15.0


class Parking:
    """Retry state of parked entries. Bounded: an entry leaves it when delivered, failed or
    dispatched for good; timers are cancelled on close (the journal keeps the entries pending)."""

    def __init__(
        self, store: Store, metrics: Metrics, window: float, redispatch: Callable[[JournalEntry], object]
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._window = window
        self._redispatch = redispatch
        self._retries: dict[str, tuple[int, float]] = {}
        """Key -> (delivery failures so far, monotonic time of the first)."""
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._retries)

    def is_parked(self, key: str) -> bool:
        return key in self._timers

    def unpark(self, key: str) -> None:
        """The entry is being dispatched now (its timer, or a reconnect): no second dispatch."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def settled(self, key: str) -> None:
        """Delivered or failed for good: forget its retry state (unless a retry is scheduled)."""
        if key not in self._timers:
            self._retries.pop(key, None)

    async def park(self, entry: JournalEntry, exc: ChannelError) -> bool:
        """Keep ``entry`` pending and schedule its retry. False when retrying cannot help (a
        permanent refusal) or the window is spent: the caller then marks it failed."""
        if isinstance(exc, PermanentSendError) or self._closed:
            return False
        count, first = self._retries.get(entry.key, (0, time.monotonic()))
        if time.monotonic() - first > self._window:
            self._retries.pop(entry.key, None)
            return False
        await self._store.journal_retry(entry.key)
        entry.attempts = max(entry.attempts - 1, 0)  # a delivery failure is not a run of the agent
        entry.from_journal = True  # the next try reads what already went out from the outbox
        delay = min(RETRY_CAP, RETRY_FIRST * 2**count) * random.uniform(0.8, 1.0)
        self._retries[entry.key] = (count + 1, first)
        self._metrics.delivery_retries.labels(entry.inbound.platform).inc()
        log.warning("delivery of %s failed (%s); retrying in %.1fs", entry.key, exc, delay)
        self.unpark(entry.key)
        self._timers[entry.key] = asyncio.get_running_loop().call_later(delay, self._fire, entry)
        return True

    def _fire(self, entry: JournalEntry) -> None:
        self._timers.pop(entry.key, None)
        self._redispatch(entry)

    def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
