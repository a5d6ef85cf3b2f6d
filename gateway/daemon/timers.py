"""One owner for every timer: approval timeouts, schedule firings and retention (docs/scale-out.md).

Each of these is work that must happen once, at a time, whatever the number of daemons. On every
daemon at once they raced (each held every approval timer; each ran the schedule loop and pruned),
the database's compare-and-sets keeping the effects single but the work multiplied by the daemons.
Now one daemon owns them: the lone daemon on SQLite, from its start; on PostgreSQL the leader
(gateway/daemon/cluster.py), from the moment it takes the lock until it loses it. The leader is
already the one daemon a platform's once-per-bot connection follows, and its lock dies with it.

- **Taking them** (:meth:`TimerOwner.own`): every pending approval's timer is armed from the rows
  (one already past its deadline times out at once), the schedule loop starts (what came due
  meanwhile fires, late runs with their note, as after a restart), and retention prunes at once
  and then on its interval.
- **Losing them** (:meth:`TimerOwner.disown`): the loops are cancelled. Nothing is left half done:
  an approval's timeout under way finishes (its own task; the decision is a compare-and-set), a
  firing is claimed by its journal insert or not at all, a prune is one statement per table.
- Between the old owner's death and the next leader's lock (a few seconds), nothing expires or
  fires: it does so, late by that much, on the new owner.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from gateway.ops.metrics import Metrics
from gateway.ops.tasks import TaskTracker
from gateway.turns.approval_timers import LOOK_EVERY, ApprovalTimers

if TYPE_CHECKING:
    from gateway.daemon.app import Daemon
    from gateway.schedules.clock import ScheduleClock
    from gateway.schedules.runner import GatewayScheduler, ScheduleRunner

log = logging.getLogger(__name__)

Job = Callable[[], Coroutine[Any, Any, Any]]


class TimerOwner:
    """Starts the timer loops (``jobs``) and the approval timers when this daemon owns the timers,
    and stops them when it stops owning them; says which it is (status, metrics)."""

    def __init__(
        self, approvals: ApprovalTimers, jobs: dict[str, Job], metrics: Metrics, tasks: TaskTracker
    ) -> None:
        self.approvals = approvals
        self.jobs = jobs
        self.tasks = tasks
        """A child tracker of the daemon's: only the loops, so that losing the timers cancels them alone."""
        self.owned = False
        metrics.timers_owned.set_function(lambda: 1.0 if self.owned else 0.0)
        metrics.timers_armed.labels("approval").set_function(lambda: float(len(approvals.armed)))

    async def own(self) -> None:
        if self.owned:
            return
        self.owned = True
        log.info("timers: owned here (approval timeouts, schedules, retention)")
        self.approvals.own()
        for name, job in self.jobs.items():
            self.tasks.spawn(job(), name)

    async def disown(self) -> None:
        if not self.owned:
            return
        self.owned = False
        self.approvals.disown()
        await self.tasks.cancel_running()
        log.info("timers: no longer owned here; the leader runs them")

    def report(self) -> dict[str, object]:
        """For ``/readyz`` and ``chital status``: where the timers run, and what this daemon holds."""
        return {
            "owner": "here" if self.owned else "the leader",
            "approvals_armed": len(self.approvals.armed),
        }

    async def close(self) -> None:
        self.owned = False
        await self.tasks.close()


async def take_timers(
    daemon: Daemon, clock: ScheduleClock, scheduler: GatewayScheduler | None
) -> tuple[TimerOwner, ScheduleRunner]:
    """The daemon's :class:`TimerOwner` (and the schedule runner, whose pushes run on every daemon):
    owning the timers now when the daemon is alone (SQLite), else from each moment its cluster
    makes it the leader until it steps down. Called before the cluster starts, so that its first
    lead already owns them."""
    from gateway.schedules.runner import MAX_SLEEP, ScheduleRunner

    gateway, retention, cluster = daemon.gateway, daemon.retention, daemon.cluster
    assert gateway is not None and retention is not None and daemon.store is not None
    several = cluster is not None  # a schedule made on another daemon wakes only that one's clock
    runner = ScheduleRunner(gateway, daemon.store, daemon.config, clock, scheduler,
                            max_sleep=LOOK_EVERY if several else MAX_SLEEP)  # fmt: skip
    jobs: dict[str, Job] = {
        "retention": functools.partial(retention.run, prune_first=several),
        "schedules": runner.run_timers,
    }
    approvals = gateway.approvals.timers
    owner = TimerOwner(approvals, jobs, daemon.metrics, daemon.tasks.child())
    if cluster is None:
        await owner.own()
    else:
        approvals.disown()  # until this daemon leads
        cluster.on_lead.append(owner.own)
        cluster.on_unlead.append(owner.disown)
    return owner, runner
