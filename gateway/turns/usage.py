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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.config.durations import about
from gateway.store.db import SqliteConnection

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


class UsageConfig(BaseModel):
    """Token accounting and the optional daily budget per user."""

    model_config = ConfigDict(extra="forbid")

    daily_tokens: int = Field(0, ge=0)
    """Tokens (prompt + completion, all model calls of their turns, sub-agents, titles and memory
    included) one user may use per day; checked at intake (a message beyond it gets a note instead
    of an answer) and before every model call (a turn that reaches it stops with a note).
    0: no budget."""
    users: dict[str, int] = Field(default_factory=dict)
    """Per-user budgets that replace ``daily_tokens``, keyed ``platform:user_id``; 0: unlimited."""
    admins_exempt: bool = True
    """Admins (``access.admins``) have no budget unless ``users`` names them."""
    timezone: str = "UTC"
    """Where a day starts and ends, for the budget and ``/usage`` (an IANA name, e.g. Europe/Berlin)."""
    retention_days: int = Field(90, ge=30)
    """Usage rows older than this are deleted (``/usage`` shows 30 days)."""
    reserve_output_tokens: int = Field(2048, ge=1)
    """For users with a budget: the tokens held for a model call's answer when the model's own
    settings give no ``max_tokens`` (the request's estimated size is held besides). A larger value
    keeps a budget tighter under concurrent calls, a smaller one refuses fewer calls near its end."""

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r} (use an IANA name such as UTC or Europe/Berlin)"
            ) from None
        return value

    @field_validator("users")
    @classmethod
    def _qualified(cls, value: dict[str, int]) -> dict[str, int]:
        for user, tokens in value.items():
            platform, _, raw = user.partition(":")
            if not platform or not raw:
                raise ValueError(f"{user!r}: write users as 'platform:user_id', e.g. 'telegram:12345'")
            if tokens < 0:
                raise ValueError(f"{user!r}: a budget cannot be negative")
        return value

    def today(self, now: float | None = None) -> date:
        return datetime.fromtimestamp(time.time() if now is None else now, ZoneInfo(self.timezone)).date()

    def seconds_to_midnight(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        zone = ZoneInfo(self.timezone)
        tomorrow = datetime.fromtimestamp(now, zone).date() + timedelta(days=1)
        return datetime(tomorrow.year, tomorrow.month, tomorrow.day, tzinfo=zone).timestamp() - now


# -- the tables (a mixin of gateway.store.journal.Store; migration 3 creates them) ---------------------------
_USAGE_ADD = (
    "INSERT INTO token_usage(user, day, conversation, model, purpose, prompt_tokens,"
    " completion_tokens, estimated_tokens, calls) VALUES (?, ?, COALESCE((SELECT conversation"
    " FROM journal WHERE key = ?), (SELECT conversation FROM threads WHERE thread_id = ? LIMIT 1),"
    " ''), ?, ?, ?, ?, ?, 1) ON CONFLICT(user, day, conversation, model, purpose) DO UPDATE SET"
    " prompt_tokens = token_usage.prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = token_usage.completion_tokens + excluded.completion_tokens,"
    " estimated_tokens = token_usage.estimated_tokens + excluded.estimated_tokens,"
    " calls = token_usage.calls + 1"
)
_LEDGER_OPEN = (
    "INSERT OR IGNORE INTO token_ledger(user, day, used, held) SELECT ?, ?,"
    " COALESCE(SUM(prompt_tokens + completion_tokens), 0), 0 FROM token_usage WHERE user = ? AND day = ?"
)
_LEDGER_HOLD = "UPDATE token_ledger SET held = held + ? WHERE user = ? AND day = ? AND used + held < ?"
_LEDGER_SETTLE = "UPDATE token_ledger SET used = used + ?, held = MAX(held - ?, 0) WHERE user = ? AND day = ?"


@dataclass(frozen=True, slots=True)
class Totals:
    """Tokens over the three windows ``/usage`` shows."""

    name: str
    today: int
    week: int
    month: int
    estimated: int = 0
    """Of ``month``, the tokens counted by estimate (the provider reported no usage)."""


class ModelUsageTables:
    """``conversation_models`` and ``token_usage`` (mixed into ``Store``)."""

    _db: SqliteConnection

    async def _write(
        self, sql: str, params: tuple[Any, ...] = (), *, many: list[tuple[Any, ...]] | None = None
    ) -> int:
        raise NotImplementedError  # Store's

    async def chosen_model(self, conversation: str) -> str | None:
        """The model ``/model`` chose for ``conversation``, if any."""
        sql = "SELECT model FROM conversation_models WHERE conversation = ?"
        async with self._db.execute(sql, (conversation,)) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def choose_model(self, conversation: str, model: str | None, user: str) -> None:
        """Record ``model`` for ``conversation``; None forgets the choice (back to the default)."""
        if model is None:
            await self._write("DELETE FROM conversation_models WHERE conversation = ?", (conversation,))
            return
        await self._write(
            "INSERT INTO conversation_models(conversation, model, user, updated) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(conversation) DO UPDATE SET model = excluded.model, user = excluded.user,"
            " updated = excluded.updated",
            (conversation, model, user, time.time()),
        )

    async def usage_add(self, usage: TokenUsage, day: date) -> None:
        """Add one model call. Its conversation is the journal entry's of the turn (else the
        thread's current conversation)."""
        await self.usage_add_many([usage], day)

    async def usage_add_many(self, usages: list[TokenUsage], day: date) -> None:
        """Add model calls, in one transaction (one commit for all of them)."""
        rows = [
            (u.user, day.isoformat(), u.message_id, u.thread_id, u.model, u.purpose, u.prompt_tokens,
             u.completion_tokens, (u.prompt_tokens + u.completion_tokens) if u.estimated else 0)
            for u in usages
        ]  # fmt: skip
        if len(rows) == 1:
            await self._write(_USAGE_ADD, rows[0])
        elif rows:
            await self._write(_USAGE_ADD, many=rows)

    async def usage_on(self, user: str, day: date) -> int:
        sql = "SELECT SUM(prompt_tokens + completion_tokens) FROM token_usage WHERE user = ? AND day = ?"
        async with self._db.execute(sql, (user, day.isoformat())) as cur:
            row = await cur.fetchone()
        return int(row[0] or 0) if row else 0

    async def usage_totals(
        self, today: date, by: str, user: str | None = None, limit: int = 50
    ) -> list[Totals]:
        """Tokens of today, the last 7 and the last 30 days, per ``by`` (``model`` or ``user``),
        largest 30-day total first; only ``user``'s rows when given."""
        if by not in ("model", "user"):
            raise ValueError(by)
        week, month = (today - timedelta(days=6)).isoformat(), (today - timedelta(days=29)).isoformat()
        where, params = "day >= ?", [month]
        if user is not None:
            where, params = "user = ? AND day >= ?", [user, month]
        sql = (
            f"SELECT {by}, SUM(CASE WHEN day = ? THEN prompt_tokens + completion_tokens ELSE 0 END),"
            " SUM(CASE WHEN day >= ? THEN prompt_tokens + completion_tokens ELSE 0 END),"
            f" SUM(prompt_tokens + completion_tokens), SUM(estimated_tokens) FROM token_usage"
            f" WHERE {where} GROUP BY {by} ORDER BY 4 DESC, 1 LIMIT ?"
        )
        with self._db.on_thread():  # sums a month of rows
            async with self._db.execute(sql, (today.isoformat(), week, *params, limit)) as cur:
                rows = await cur.fetchall()
        return [
            Totals(str(r[0]), int(r[1] or 0), int(r[2] or 0), int(r[3] or 0), int(r[4] or 0)) for r in rows
        ]

    async def usage_prune(self, before: date) -> int:
        with self._db.on_thread():  # may delete a day's rows of every user
            await self._write("DELETE FROM token_ledger WHERE day < ?", (before.isoformat(),))
            return await self._write("DELETE FROM token_usage WHERE day < ?", (before.isoformat(),))

    # -- the budget ledger (gateway/turns/budget.py) -----------------------------------------------------
    async def ledger_open(self, user: str, day: str) -> None:
        """The ledger row of ``user`` on ``day``, made once, from the usage recorded so far."""
        await self._write(_LEDGER_OPEN, (user, day, user, day))

    async def ledger_hold(self, user: str, day: str, tokens: int, budget: int) -> bool:
        """Hold ``tokens`` for a call when the user's spent and held tokens are under ``budget``.
        One ``UPDATE`` of one row: atomic on SQLite (one writer) and on PostgreSQL (the row lock,
        and the condition re-checked on the row as the concurrent winner left it), so concurrent
        turns and daemons cannot all pass on the same remainder."""
        return await self._write(_LEDGER_HOLD, (tokens, user, day, budget)) == 1

    async def ledger_state(self, user: str, day: str) -> tuple[int, int]:
        """(spent, held) tokens of ``user`` on ``day``."""
        sql = "SELECT used, held FROM token_ledger WHERE user = ? AND day = ?"
        async with self._db.execute(sql, (user, day)) as cur:
            row = await cur.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def ledger_settle(self, rows: list[tuple[int, int, str, str]]) -> None:
        """(spent, held before, user, day) per finished call: spent added, its hold freed."""
        if len(rows) == 1:
            await self._write(_LEDGER_SETTLE, rows[0])
        elif rows:
            await self._write(_LEDGER_SETTLE, many=rows)


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

    async def _write(self, batch: list[TokenUsage], released: list[Hold] | None = None) -> None:
        from gateway.turns.budget import Hold

        today = self.config.today()
        try:
            await self.store.usage_add_many(batch, today)
            # After the rows: a failed write keeps the holds (the budget stays on the safe side).
            settle = [
                (u.prompt_tokens + u.completion_tokens, u.hold.tokens, u.hold.user, u.hold.day)
                for u in batch
                if isinstance(u.hold, Hold)
            ]
            settle += [(0, h.tokens, h.user, h.day) for h in released or ()]
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


async def budget_refusal(store: Store, config: Config, user: str, admin: bool) -> str | None:
    """The note for a user whose budget for today is spent, or None (checked before each turn)."""
    budget = budget_of(config, user, admin)
    if not budget:
        return None
    used = await store.usage_on(user, config.usage.today())
    if used < budget:
        return None
    return (
        f"⚠️ You have used your token budget for today ({used:,} of {budget:,} tokens), so I did not "
        f"pass this message to the agent. The budget renews at midnight ({config.usage.timezone}), "
        f"in {renewal_in(config.usage.seconds_to_midnight())}; send it again then, or ask an admin "
        "for a larger budget. /usage shows what you used."
    )


def renewal_in(seconds: float) -> str:
    return about(seconds)
