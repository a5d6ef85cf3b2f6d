"""The daily token budget, held at every model call, not only at intake.

Why: a budget checked only when a message arrives is one a single message can overrun (a tool
loop, three sub-agents, eight messages sent at once all pass the intake check together). So
every model call the agent makes (the lead, sub-agents, titles, summaries, memory extraction)
first asks :meth:`Budgets.reserve` through the usage callback on the chat model
(agent/usage.py), and is sent only when the answer is a hold:

- **Before the call**: the request's estimated size plus its answer's bound (the model's
  ``max_tokens``, else ``usage.reserve_output_tokens``) is added to the user's ``held`` tokens
  in ``token_ledger``, on the condition that spent + held is still under the budget. That is one
  ``UPDATE`` of one row (:meth:`gateway.store.usage.ModelUsageTables.ledger_hold`): atomic on SQLite
  and on PostgreSQL, so concurrent turns of one user, in one daemon or in several daemons on one
  database, cannot all pass on the same remainder.
- **After the call**: the recorder (gateway/turns/usage.py) adds what it cost (reported, or estimated
  when the provider said nothing) to ``used`` and frees the hold, in the same background write
  as the usage row. Until that write, the hold counts: the ledger errs on the safe side.
- **Refused**: :class:`agent.usage.BudgetRefused` with the note below; the harness stops the
  turn there and the user reads it as the turn's answer (the message is done, not retried).

What holds: a call starts only while spent + held < budget, so the day's total can pass the
budget by at most the last admitted call's cost (plus, for calls in flight together, what each
cost beyond its hold; a hold is an upper bound whenever the model has a ``max_tokens``). A
daemon killed mid-call leaves that call's hold counted until the day ends (it may well have
been billed). A ledger that cannot be read refuses the call: a budget is a limit, so it fails
closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from agent.usage import BudgetRefused, PlannedCall
from gateway.intake import access
from gateway.turns.pricing import cost_micros, money
from gateway.turns.usage import budget_of, money_budget_of, renewal_in

if TYPE_CHECKING:
    from gateway.config.schema import Config
    from gateway.store.journal import Store

log = logging.getLogger(__name__)

_OPENED = 4096
"""Ledger rows this process knows exist (user, day): no ``INSERT`` before their next calls."""

UNPRICED = (
    "Stopped: the model {model} has no price in the config, so your daily money budget cannot be "
    "checked for it. An admin can add one under usage.prices."
)
UNCHECKED = (
    "Stopped: I could not check your daily token budget just now (a database problem), so I did "
    "not call the model again. Please try again in a little while."
)


@dataclass(frozen=True, slots=True)
class Hold:
    """Tokens set aside in ``token_ledger`` for one model call, until the call is settled."""

    user: str
    day: str
    tokens: int
    micros: int = 0
    """Money held for the call, for a user with a money budget (gateway/turns/pricing.py)."""


class Budgets:
    """The per-user budget ledger every model call consults (see the module docstring). Made on
    the daemon's event loop; a call from another loop (a model called from a worker thread) is
    handed to it."""

    def __init__(self, store: Store, config: Config) -> None:
        self.store = store
        self.config = config
        self._opened: dict[tuple[str, str], None] = {}
        self._loop = asyncio.get_running_loop()
        self.settle_pending: Callable[[], Awaitable[None]] | None = None
        """Waits until the calls this process finished so far are settled (the recorder's):
        asked before a refusal, so the previous call of a turn, still being written, does not
        count as an answer running now."""

    def _admin(self, user: str) -> bool:
        platform, _, raw = user.partition(":")
        if not (platform and raw):
            return False
        try:
            admins = self.config.access_for(platform).admins
        except (AttributeError, KeyError, ValueError):
            admins = []
        return access.admin_id(admins, platform, raw)

    def budget(self, user: str) -> int:
        """``user``'s (``platform:id``) daily token budget, as at intake: 0 when they have none."""
        return budget_of(self.config, user, self._admin(user))

    def money_budget(self, user: str) -> int:
        """``user``'s daily money budget in micros, as at intake: 0 when they have none."""
        return money_budget_of(self.config, user, self._admin(user))

    async def reserve(self, call: PlannedCall) -> Hold | None:
        """A hold for ``call``, None when its user has no budget; raises BudgetRefused."""
        budget = self.budget(call.user) if call.user else 0
        limit = self.money_budget(call.user) if call.user else 0
        if not budget and not limit:
            return None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self._loop:
            future = asyncio.run_coroutine_threadsafe(self._reserve(call, budget, limit), self._loop)
            return await asyncio.wrap_future(future)
        return await self._reserve(call, budget, limit)

    async def _reserve(self, call: PlannedCall, budget: int, limit: int = 0) -> Hold:
        usage = self.config.usage
        day = usage.today().isoformat()
        output = call.max_output or usage.reserve_output_tokens
        tokens = call.prompt_tokens() + output
        try:
            if (call.user, day) not in self._opened:
                await self.store.ledger_open(call.user, day)
                if len(self._opened) >= _OPENED:
                    self._opened.pop(next(iter(self._opened)))
                self._opened[(call.user, day)] = None
            if limit:
                # Money first: a refusal there holds no tokens. The config gives every model a price
                # when a money budget is set; a call of one without (a model added since) is refused.
                micros = cost_micros(usage.prices, call.model, call.prompt_tokens(), output)
                if micros is None:
                    raise BudgetRefused(UNPRICED.format(model=call.model))
                if not await self._hold_money(call, day, micros, limit):
                    used, held = await self.store.ledger_state(call.user, day, money=True)
                    raise BudgetRefused(self.money_note(limit, used, held))
            else:
                micros = 0
            if not budget:
                return Hold(call.user, day, 0, micros)
            if await self.store.ledger_hold(call.user, day, tokens, budget):
                return Hold(call.user, day, tokens, micros)
            if self.settle_pending is not None:
                await self.settle_pending()
                if await self.store.ledger_hold(call.user, day, tokens, budget):
                    return Hold(call.user, day, tokens, micros)
            if micros:
                await self.store.ledger_settle_money([(0, micros, call.user, day)])
            used, held = await self.store.ledger_state(call.user, day)
        except BudgetRefused:
            raise
        except Exception as exc:
            log.warning("budget: the ledger could not be read (%s); call refused", type(exc).__name__)
            raise BudgetRefused(UNCHECKED) from None
        log.info(
            "budget: a %s call (%s) refused: %d used and %d held of %d", call.purpose, call.model, used,
            held, budget,
        )  # fmt: skip
        raise BudgetRefused(self.stop_note(budget, used, held))

    async def _hold_money(self, call: PlannedCall, day: str, micros: int, limit: int) -> bool:
        if await self.store.ledger_hold_money(call.user, day, micros, limit):
            return True
        if self.settle_pending is not None:
            await self.settle_pending()
            return await self.store.ledger_hold_money(call.user, day, micros, limit)
        return False

    def money_note(self, limit: int, used: int, held: int) -> str:
        """What the user reads when a model call was refused by their money budget."""
        currency = self.config.usage.currency
        renewal = (
            f"It renews at midnight ({self.config.usage.timezone}), in "
            f"{renewal_in(self.config.usage.seconds_to_midnight())}; /usage shows what you used."
        )
        if used >= limit or not held:
            return (
                f"Stopped: your daily money budget of {money(limit, currency)} is used up "
                f"({money(used, currency)} spent today). {renewal}"
            )
        return (
            f"Stopped: the rest of your daily money budget of {money(limit, currency)} is held by your "
            f"other answers running now ({money(used, currency)} spent today, {money(held, currency)} "
            f"held); send this again once they are done. {renewal}"
        )

    def stop_note(self, budget: int, used: int, held: int) -> str:
        """What the user reads when a model call of their turn was refused."""
        usage = self.config.usage
        zone = ZoneInfo(usage.timezone)
        now = datetime.now(zone)
        midnight = datetime(now.year, now.month, now.day, tzinfo=zone) + timedelta(days=1)
        renews = f"{midnight:%H:%M} {usage.timezone}"
        renewal = (
            f"It renews at {renews}, in {renewal_in(usage.seconds_to_midnight())}; /usage shows what "
            "you used, and an admin can raise the budget."
        )
        if used >= budget or not held:
            spent = f"{budget:,} tokens is used up ({used:,} used today)"
            return f"Stopped: your daily token budget of {spent}. {renewal}"
        return (
            f"Stopped: the rest of your daily token budget of {budget:,} tokens is held by your other "
            f"answers running now ({used:,} used today, {held:,} held); send this again once they are "
            f"done. {renewal}"
        )
