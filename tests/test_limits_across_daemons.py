"""Per-user limits hold across daemons: the count is part of the insert (gateway/store/limits.py).

Two store connections to one database play two daemons (SQLite, then PostgreSQL). Many creations
race from both at once, through the real scheduler (the schedule tool's code) and the background
tasks' insert; exactly the limit's worth go in, and every refused one carries the sentence the
user reads when the limit is hit on one daemon.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.tools.schedule import Caller, ScheduleError, ScheduleRequest
from gateway.schedules.clock import ScheduleClock
from gateway.schedules.runner import GatewayScheduler
from gateway.store.entries import JournalKind
from gateway.store.journal import Store
from gateway.store.limits import OverLimit
from tests.fakes.gateway_rig import USER, dm
from tests.schedules_support import schedules_config

ATTEMPTS = 12
"""Creations per test, split between the two daemons' stores."""


async def _race(calls: list[Any]) -> list[Any]:
    return await asyncio.gather(*calls, return_exceptions=True)


@pytest.mark.parametrize(
    ("limits", "refusal"),
    [
        ({"max_per_user": 3}, "you already have 3 schedules (the limit); cancel one first"),
        (
            {"max_per_conversation": 3},
            "this conversation already has 3 schedules (the limit); cancel one first",
        ),
    ],
)
async def test_two_daemons_creating_schedules_at_once_stay_within_the_limit(
    two_stores: tuple[Store, Store], limits: dict[str, int], refusal: str
) -> None:
    a, b = two_stores
    config = schedules_config(**limits)
    asked = dm(USER, "remind me of many things")
    assert await a.journal_add(asked, JournalKind.TURN)
    thread = await a.thread_for(asked.conversation)
    schedulers = [GatewayScheduler(store, config, ScheduleClock()) for store in (a, b)]
    calls = [
        schedulers[i % 2].add(
            Caller(thread, asked.user, asked.key, call_id=f"call-{i}"),
            ScheduleRequest(f"job {i}", delay="1h"),
        )
        for i in range(ATTEMPTS)
    ]
    outcomes = await _race(calls)
    made = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(made) == 3, outcomes
    assert all(isinstance(r, ScheduleError) and str(r) == refusal for r in refused), refused
    assert await a.schedule_counts(asked.conversation, asked.user) == (3, 3)
    assert len({m.id for m in made}) == 3


async def test_the_same_call_run_again_at_the_limit_finds_its_schedule(
    two_stores: tuple[Store, Store],
) -> None:
    """A turn resumed after a crash runs its tool call again: it gets its own schedule back, not
    a refusal, although the limit is reached now."""
    a, b = two_stores
    config = schedules_config(max_per_user=1)
    asked = dm(USER, "remind me")
    assert await a.journal_add(asked, JournalKind.TURN)
    caller = Caller(await a.thread_for(asked.conversation), asked.user, asked.key, call_id="c1")
    first = await GatewayScheduler(a, config, ScheduleClock()).add(caller, ScheduleRequest("x", delay="1h"))
    again = await GatewayScheduler(b, config, ScheduleClock()).add(caller, ScheduleRequest("x", delay="1h"))
    assert again.id == first.id
    other = Caller(caller.thread_id, asked.user, asked.key, call_id="c2")
    with pytest.raises(ScheduleError, match=r"^you already have 1 schedules \(the limit\)"):
        await GatewayScheduler(b, config, ScheduleClock()).add(other, ScheduleRequest("y", delay="1h"))


async def test_two_daemons_starting_background_tasks_at_once_stay_within_the_cap(
    two_stores: tuple[Store, Store],
) -> None:
    a, b = two_stores
    cap, owner, chat = 3, "telegram:u", f"telegram:{USER}"
    first = await a.background_add(origin="first", conversation=chat, owner=owner, text="t", cap=cap)
    calls = [
        (a, b)[i % 2].background_add(origin=f"o-{i}", conversation=chat, owner=owner, text=f"t{i}", cap=cap)
        for i in range(ATTEMPTS)
    ]
    outcomes = await _race(calls)
    made = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(made) == cap - 1, outcomes
    assert all(isinstance(r, OverLimit) and (r.scope, r.count) == ("user", cap) for r in refused), refused
    assert await b.background_running(owner) == cap
    # The same request again (a turn re-run after a crash) finds its task, not a refusal; another
    # person's cap is their own.
    assert (
        await b.background_add(origin="first", conversation=chat, owner=owner, text="t", cap=cap)
    ).id == first.id
    assert (
        await b.background_add(origin="v", conversation=chat, owner="telegram:v", text="v", cap=cap)
    ).owner


async def test_pending_pairing_requests_stay_within_the_limit_across_daemons(
    two_stores: tuple[Store, Store],
) -> None:
    """Thirty strangers write at once to two daemons with ``pairing_max_pending`` 5: at most five
    codes are left, the newest, each stranger's own."""
    a, b = two_stores
    calls = [
        (a if i % 2 else b).pairing_request(f"telegram:{9000 + i}", f"S{i}", "", ttl=3600, max_pending=5)
        for i in range(30)
    ]
    results = await _race(calls)
    assert not [r for r in results if isinstance(r, BaseException)], results
    left = await a.pairing_list()
    assert len(left) <= 5, [r.user for r in left]
    assert len({r.user for r in left}) == len(left)
