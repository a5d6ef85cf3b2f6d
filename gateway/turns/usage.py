"""Token usage: recorded per user, conversation, model and purpose; shown by ``/usage``; an
optional daily budget per user; Prometheus counters per model.

The agent reports every model call (agent/usage.py) to :class:`UsageRecorder`, which counts it in
``chital_model_tokens`` at once and adds it to the ``token_usage`` table in the background (the
model call never waits for SQLite). Rows are sums per (user, day, conversation, model, purpose),
so the table grows with active users and days, not with calls; days are calendar days in
``usage.timezone``. The budget is checked at intake, before a turn is queued: a user over it gets
a journaled note instead of a turn (like the rate limit), commands keep working; and before every
model call of the turn (gateway/turns/budget.py), which the recorder settles in ``token_ledger`` when
the call ends. Calls the provider reported no usage for are counted by estimate and the part of
each row that is estimated is kept (``estimated_tokens``), so ``/usage`` can say so.

The tables themselves are the store's (gateway/store/usage.py, with :class:`Totals`); the
settings are ``usage:`` in config (gateway/config/sections.py ``UsageConfig``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from gateway.config.durations import about
from gateway.config.sections import UsageConfig
from gateway.turns.pricing import MICROS, budget_micros, cost_micros, money

if TYPE_CHECKING:
    from agent.usage import PlannedCall, TokenUsage  # langchain-core: imported when the daemon needs it
    from gateway.config.schema import Config
    from gateway.ops.metrics import Metrics
    from gateway.store.journal import Store
    from gateway.turns.budget import Budgets, Hold

log = logging.getLogger(__name__)

PRUNE_EVERY = 3600.0
"""Seconds between two deletions of rows older than ``usage.retention_days``."""
TOP_USERS = 10


# -- recording ---------------------------------------------------------------------------------------
class UsageRecorder:
    """The gateway's :class:`agent.usage.UsageSink`: counters now, the row in the background.
    Made on the daemon's event loop.

    The rows of the calls that end while a write is under way (or in the same loop pass) go
    together, in one transaction: with many chats at once that is one commit for several calls,
    and one background task at a time rather than one per call."""

    def __init__(
        self, store: Store, metrics: Metrics, config: UsageConfig, budgets: Budgets | None = None
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.config = config
        self.budgets = budgets
        """Checked before every model call (:meth:`reserve`); None: usage is only counted."""
        self._queue: list[TokenUsage] = []
        self._released: list[Hold] = []
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self._pruned = 0.0
        self._loop = asyncio.get_running_loop()
        if budgets is not None:
            budgets.settle_pending = self.flushed

    async def reserve(self, call: PlannedCall) -> Hold | None:
        """:class:`agent.usage.BudgetLedger`: the hold for a model call, or BudgetRefused."""
        if self.budgets is None:
            return None
        return await self.budgets.reserve(call)

    def release(self, hold: object) -> None:
        """A call that ended with nothing to count: its hold is freed with the next write."""
        from gateway.turns.budget import Hold

        if not isinstance(hold, Hold):
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._loop.call_soon_threadsafe(self._spawn_release, hold)
        else:
            self._spawn_release(hold)

    def _spawn_release(self, hold: Hold) -> None:
        if self._closed:
            return
        self._released.append(hold)
        if self._flusher is None:
            self._flusher = self._loop.create_task(self._flush(), name="usage")

    def record(self, usage: TokenUsage) -> None:
        tokens = self.metrics.tokens
        tokens.labels(usage.model, "prompt").inc(usage.prompt_tokens)
        tokens.labels(usage.model, "completion").inc(usage.completion_tokens)
        cost = self._cost(usage)
        if cost is not None:  # an unpriced model has no cost series: unknown, never 0
            self.metrics.cost.labels(usage.model, self.config.currency).inc(cost / MICROS)
        else:
            self.metrics.unpriced.labels(usage.model).inc(usage.prompt_tokens + usage.completion_tokens)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a model called from a worker thread: write from the daemon's loop
            self._loop.call_soon_threadsafe(self._spawn, usage)
        else:
            self._spawn(usage)

    def _spawn(self, usage: TokenUsage) -> None:
        if self._closed:
            return
        self._queue.append(usage)
        if self._flusher is None:
            self._flusher = self._loop.create_task(self._flush(), name="usage")

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)  # the other calls ending in this loop pass join the batch
            while self._queue or self._released:
                batch, self._queue = self._queue, []
                released, self._released = self._released, []
                await self._write(batch, released)
        finally:
            self._flusher = None

    def _cost(self, usage: TokenUsage) -> int | None:
        """The call's cost in micros (None: its model has no price)."""
        return cost_micros(self.config.prices, usage.model, usage.prompt_tokens, usage.completion_tokens,
                           usage.cached_tokens)  # fmt: skip

    async def _write(self, batch: list[TokenUsage], released: list[Hold] | None = None) -> None:
        from gateway.turns.budget import Hold

        today = self.config.today()
        try:
            costs = [self._cost(u) for u in batch]
            await self.store.usage_add_many(batch, today, costs)
            # After the rows: a failed write keeps the holds (the budget stays on the safe side).
            settle = [
                (u.prompt_tokens + u.completion_tokens, u.hold.tokens, u.hold.user, u.hold.day)
                for u in batch
                if isinstance(u.hold, Hold)
            ]
            settle += [(0, h.tokens, h.user, h.day) for h in released or ()]
            paid = [
                (cost or 0, u.hold.micros, u.hold.user, u.hold.day)
                for u, cost in zip(batch, costs, strict=True)
                if isinstance(u.hold, Hold) and u.hold.micros
            ]
            paid += [(0, h.micros, h.user, h.day) for h in released or () if h.micros]
            await self.store.ledger_settle_money(paid)
            await self.store.ledger_settle(settle)
            if time.monotonic() - self._pruned > PRUNE_EVERY or not self._pruned:
                self._pruned = time.monotonic()
                await self.store.usage_prune(today - timedelta(days=self.config.retention_days))
        except Exception as exc:  # usage is bookkeeping: a full disk must not fail anything else
            tokens = sum(u.prompt_tokens + u.completion_tokens for u in batch)
            log.warning("usage: could not record %d tokens of %d model call(s) (%s)", tokens, len(batch),
                        type(exc).__name__)  # fmt: skip

    async def flushed(self) -> None:
        """Wait until the calls recorded so far are written (and their holds settled)."""
        flusher = self._flusher
        if flusher is not None and flusher is not asyncio.current_task():
            with contextlib.suppress(Exception):
                await asyncio.wait({flusher}, timeout=5)

    async def close(self) -> None:
        """Finish the writes under way (before the store closes); later calls are counted only."""
        self._closed = True
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait({self._flusher}, timeout=5)


# -- the budget -------------------------------------------------------------------------------------
def budget_of(config: Config, user: str, admin: bool) -> int:
    """``user``'s daily token budget; 0 when they have none."""
    usage = config.usage
    if user in usage.users:
        return usage.users[user]
    if admin and usage.admins_exempt:
        return 0
    return usage.daily_tokens


def money_budget_of(config: Config, user: str, admin: bool) -> int:
    """``user``'s daily money budget in micros; 0 when they have none."""
    usage = config.usage
    if user in usage.user_costs:
        return budget_micros(usage.user_costs[user])
    if admin and usage.admins_exempt:
        return 0
    return budget_micros(usage.daily_cost)


async def budget_refusal(store: Store, config: Config, user: str, admin: bool) -> str | None:
    """The note for a user whose budget for today is spent, or None (checked before each turn)."""
    budget = budget_of(config, user, admin)
    spent = ""
    if budget:
        used = await store.usage_on(user, config.usage.today())
        if used >= budget:
            spent = f"your token budget for today ({used:,} of {budget:,} tokens)"
    limit = money_budget_of(config, user, admin)
    if limit and not spent:
        cost, _ = await store.cost_on(user, config.usage.today())
        if cost >= limit:
            currency = config.usage.currency
            spent = f"your money budget for today ({money(cost, currency)} of {money(limit, currency)})"
    if not spent:
        return None
    return (
        f"⚠️ You have used {spent}, so I did not "
        f"pass this message to the agent. The budget renews at midnight ({config.usage.timezone}), "
        f"in {renewal_in(config.usage.seconds_to_midnight())}; send it again then, or ask an admin "
        "for a larger budget. /usage shows what you used."
    )


def renewal_in(seconds: float) -> str:
    return about(seconds)
