"""Keeps the gateway's database bounded: prunes what no redelivery can need any more, gives the
space back to the file system, and re-takes the disk reserve once there is room again.

Why a timer in the daemon and not a cron job: the daemon owns its SQLite file (one connection), and
the prune must never touch an entry still open (pending, running), which only the store knows.
The policy and the retention default are explained in docs/durability.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.metrics import Counter, Gauge

from gateway.config.sections import StorageConfig
from gateway.store.journal import Store

log = logging.getLogger(__name__)

RESERVE_CHECK_EVERY = 60.0
"""Seconds between two attempts to re-take a disk reserve given up while the disk was full."""
DAY = 86_400.0


class RetentionMetrics(Protocol):
    """The two metrics retention feeds (:class:`gateway.ops.metrics.Metrics` has them): named here
    so the store does not import ops/, which sits above it."""

    pruned: Counter
    db_bytes: Gauge


@dataclass(slots=True)
class PruneReport:
    journal: int = 0
    pairing: int = 0
    pages_freed: int = 0
    threads_uncached: int = 0
    web: int = 0
    seconds: float = 0.0


class Retention:
    """Runs :meth:`prune_once` at start-up and every ``storage.prune_interval`` seconds."""

    def __init__(
        self,
        store: Store,
        storage: StorageConfig,
        metrics: RetentionMetrics | None = None,
        code_ttls: Iterable[float] = (),
        web_keep_days: float | None = None,
    ) -> None:
        """``code_ttls``: every channel's pairing-code validity (seconds). A request is kept at least
        twice the longest, since a denial is remembered for one TTL after the code's own lapses."""
        self.store = store
        self.keep_for = storage.retention_days * DAY
        self.pairing_for = max(storage.pairing_retention_hours * 3600.0, 2 * max(code_ttls, default=0.0))
        self.web_keep_for = web_keep_days * DAY if web_keep_days is not None else None
        """The web chat's messages and files (channels.web.keep_days); None: the web chat is off."""
        self.interval = storage.prune_interval
        self.metrics = metrics
        self.last: PruneReport | None = None

    async def start(self, *, prune: bool = True) -> None:
        """The start-up pass: prune (``prune``: unless the timers are another daemon's to run,
        gateway/daemon/timers.py), then (once per database) switch it to incremental vacuum, so the
        one-time ``VACUUM`` of an old database copies only the rows that are kept. Never fatal: a
        database that cannot be converted (no room for the copy) still works, it only does not
        shrink, and the next start tries again."""
        if prune:
            await self.prune_once(shrink=False)
        try:
            if await self.store.use_incremental_vacuum():
                log.info("database %s now gives freed space back (auto_vacuum=incremental)", self.store.path)
        except Exception as exc:
            log.warning(
                "could not switch %s to incremental vacuum (%s); retrying at next start", self.store.path, exc
            )
        await self._shrink()
        self._observe_size()

    async def prune_once(self, *, shrink: bool = True) -> PruneReport:
        started = time.monotonic()
        report = PruneReport()
        report.journal = await self.store.journal_prune(self.keep_for)
        report.pairing = await self.store.pairing_prune(self.pairing_for)
        await self.store.approvals_prune(self.keep_for)  # settled requests; pending ones stay
        await self.store.approval_log_prune(self.keep_for)  # decisions; revoked permissions
        await self.store.background_prune(self.keep_for)  # finished background tasks' rows
        if self.web_keep_for is not None:
            report.web = await self.store.web_prune(self.web_keep_for)
        report.threads_uncached = self.store.trim_caches()
        if shrink:
            report.pages_freed = await self._shrink()
        report.seconds = time.monotonic() - started
        self.last = report
        if self.metrics is not None:
            self.metrics.pruned.labels("journal").inc(report.journal)
            self.metrics.pruned.labels("pairing").inc(report.pairing)
            self._observe_size()
        if report.journal or report.pairing:
            log.info(
                "pruned %d journal entries and %d pairing requests in %.2fs (%d pages freed)",
                report.journal,
                report.pairing,
                report.seconds,
                report.pages_freed,
            )
        return report

    async def _shrink(self) -> int:
        try:
            return await self.store.shrink()
        except Exception as exc:  # a full disk can refuse even this; the prune itself stands
            log.warning("could not shrink %s: %s", self.store.path, exc)
            return 0

    def _observe_size(self) -> None:
        if self.metrics is None:
            return
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += (self.store.path.parent / (self.store.path.name + suffix)).stat().st_size
            except FileNotFoundError:
                pass
        self.metrics.db_bytes.set(total)

    async def run(self, *, prune_first: bool = False) -> None:
        """Forever: re-take the disk reserve every minute while it is given up, prune on the interval
        (``prune_first``: at once, too: a daemon that just took the timers over). One failed pass is
        logged and the loop goes on (the next one catches up)."""
        next_prune = time.monotonic() + (0.0 if prune_first else self.interval)
        while True:
            await asyncio.sleep(min(RESERVE_CHECK_EVERY, max(0.0, next_prune - time.monotonic())))
            try:
                await self.store.retake_reserve()
            except Exception as exc:
                log.warning("could not re-take the disk reserve: %s", exc)
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + self.interval
                try:
                    await self.prune_once()
                except Exception as exc:
                    log.error("pruning the journal failed (retrying in %.0fs): %s", self.interval, exc)
