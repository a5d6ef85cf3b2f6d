"""Approval timeouts held by the timers' owner only (gateway/turns/approval_timers.py), on both
engines, with two store connections playing two daemons: the one that does not own the timers
holds none; the one that takes them over arms every pending request from the rows, including one
asked on the other daemon, and times out one already past its deadline at once; losing the timers
drops them, but an expiry under way runs to its end. (The expiry here only records the call: the
decision itself, a compare-and-set, is the daemon's, tested end to end in test_timers_scale_out.py.)"""

from __future__ import annotations

import asyncio
import time

from channels.base import ReplyTarget
from gateway.ops.tasks import TaskTracker
from gateway.store.approvals import ApprovalRow
from gateway.store.journal import Store
from gateway.turns.approval_timers import ApprovalTimers
from tests.fakes.gateway_rig import until


async def _ask(store: Store, n: int, deadline: float) -> ApprovalRow:
    target = ReplyTarget("telegram", "200")
    return await store.approval_add(
        f"call-{n}", f"CODE{n:04d}", f"telegram:200:{n}", "telegram:200", target, "telegram:200", "Ann",
        "write_file", "may I?", deadline,
    )  # fmt: skip


async def test_only_the_owner_holds_timers_and_a_new_owner_arms_every_pending_one(
    two_stores: tuple[Store, Store],
) -> None:
    a, b = two_stores
    expired: list[str] = []
    started = asyncio.Event()
    finish = asyncio.Event()

    async def expire(row: ApprovalRow) -> None:  # the daemon's Approvals._expire: a slow decision
        started.set()
        await finish.wait()
        expired.append(row.id)

    tasks = TaskTracker()
    standby = ApprovalTimers(a, tasks, expire, look_every=0.2)
    standby.disown()
    owner = ApprovalTimers(b, tasks, expire, look_every=0.2)
    owner.disown()
    try:
        later = await _ask(a, 1, time.time() + 3600)  # asked on the standby's daemon
        standby.poke()
        await asyncio.sleep(0.3)
        assert standby.armed == {} and owner.armed == {}, "no daemon owns the timers yet"

        owner.own()
        await until(lambda: later.id in owner.armed, what="the new owner arming a request asked elsewhere")
        assert standby.armed == {}
        past = await _ask(a, 2, time.time() - 1)  # due already: times out at once on the owner
        await asyncio.wait_for(started.wait(), 30)
        owner.disown()  # mid-expiry: the expiry finishes, the timers are dropped
        assert owner.armed == {}
        finish.set()
        await until(lambda: expired == [past.id], what="the expiry under way finishing")
        standby.own()  # the other daemon takes over: it arms what is pending, and times out what is due
        await until(lambda: later.id in standby.armed, what="armed on the new owner")
        await until(lambda: expired == [past.id, past.id], what="the due one (still pending here) at once")
        assert owner.armed == {}
    finally:
        standby.close()
        owner.close()
        await tasks.close()
