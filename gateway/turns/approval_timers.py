"""Approval timeouts, held by the one daemon that owns the timers (docs/scale-out.md, "Who owns what").

Every pending request carries its deadline in its row. One daemon times them all out: the lone
daemon on SQLite, the leader on PostgreSQL (gateway/daemon/timers.py gives and takes the timers).
It reads the pending requests, sleeps until the next deadline, but looks again at least every
:data:`LOOK_EVERY` seconds (a request asked on another daemon is found so, at the cost of one small
query on one daemon, whatever the number of daemons), and times out each one that is due.

Why one loop over the rows and not one task per request: a daemon that becomes the owner must hold
every pending request's timer at once, including those it never saw asked; the rows are the only
list of them there is. A timeout is the same compare-and-set as a press (the first decision wins),
so a request answered meanwhile on another daemon stays answered. Each expiry runs as a task of its
own, not inside the loop: when the daemon loses the timers the loop stops, but an expiry under way
finishes (its decision, the edited buttons and the resumed turn go together) rather than stopping
between the decision and the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from gateway.store.approvals import ApprovalRow

if TYPE_CHECKING:
    from gateway.ops.tasks import TaskTracker
    from gateway.store.journal import Store

log = logging.getLogger(__name__)

LOOK_EVERY = 5.0
"""Seconds between two reads of the pending requests while none is due sooner (a request asked on
another daemon times out at most this late)."""


class ApprovalTimers:
    """The timeouts of every pending request, while this daemon owns the timers (:attr:`owned`)."""

    def __init__(
        self,
        store: Store,
        tasks: TaskTracker,
        expire: Callable[[ApprovalRow], Awaitable[Any]],
        look_every: float = LOOK_EVERY,
    ) -> None:
        self.store, self.tasks, self.expire, self.look_every = store, tasks, expire, look_every
        self.owned = True
        """This daemon times requests out (a daemon of several: only while it is the leader)."""
        self.armed: dict[str, float] = {}
        """The requests this daemon will time out, and when (empty unless it owns the timers)."""
        self._expiring: set[str] = set()
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[Any] | None = None

    def poke(self) -> None:
        """A request was asked (or a channel reconnected): look again now, if the timers are ours."""
        if not self.owned:
            return
        self._wake.set()
        if self._loop is None or self._loop.done():
            self._loop = self.tasks.spawn(self._run(), "approval-timers")

    def forget(self, approval_id: str) -> None:
        """``approval_id`` was settled here: no timer for it any more."""
        self.armed.pop(approval_id, None)

    def own(self) -> None:
        """This daemon owns the timers from now on: every pending request's timer is armed (one
        whose deadline has passed times out at once)."""
        self.owned = True
        self.poke()

    def disown(self) -> None:
        """Another daemon owns the timers now: hold none. An expiry already under way finishes."""
        self.owned = False
        self.armed.clear()
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()

    async def look(self) -> float:
        """Arm every pending request's timer and start the expiry of those due; returns the
        seconds until the next deadline (at most :attr:`look_every`)."""
        rows = await self.store.approvals_pending()
        if not self.owned:
            return self.look_every
        now = time.time()
        self.armed = {r.id: r.deadline for r in rows}
        for row in rows:
            if row.deadline <= now and row.id not in self._expiring:
                self._expiring.add(row.id)
                self.tasks.spawn(self._expire(row), f"approval-timeout:{row.code}")
        upcoming = [d - now for d in self.armed.values() if d > now]
        return min([self.look_every, *upcoming])

    async def _run(self) -> None:
        while self.owned:
            self._wake.clear()
            try:
                wait = await self.look()
            except Exception as exc:  # the database is away: try again in a while
                log.warning("approval timers: could not read the pending requests: %s", exc)
                wait = self.look_every
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.05)):
                    await self._wake.wait()

    async def _expire(self, row: ApprovalRow) -> None:
        try:
            await self.expire(row)
        finally:
            self._expiring.discard(row.id)
            self.armed.pop(row.id, None)

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.cancel()
