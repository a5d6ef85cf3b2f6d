"""The model-usage tables of the store: ``conversation_models`` (the ``/model`` choice),
``token_usage`` (sums per user, day, conversation, model and purpose) and ``token_ledger`` (the
budget's spent and held tokens). A mixin of :class:`gateway.store.journal.Store`; migrations 3 and
6 create them. What records into them and renders ``/usage`` is gateway/turns/usage.py, above the
store: the store imports nothing from turns/.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any

from gateway.store.connection import Connection

if TYPE_CHECKING:
    from agent.usage import TokenUsage  # langchain-core: imported when the daemon needs it

_USAGE_ADD = (
    "INSERT INTO token_usage(user, day, conversation, model, purpose, prompt_tokens,"
    " completion_tokens, estimated_tokens, cached_tokens, cost_micros, unpriced_tokens, calls)"
    " VALUES (?, ?, COALESCE((SELECT conversation"
    " FROM journal WHERE key = ?), (SELECT conversation FROM threads WHERE thread_id = ? LIMIT 1),"
    " ''), ?, ?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT(user, day, conversation, model, purpose) DO UPDATE SET"
    " prompt_tokens = token_usage.prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = token_usage.completion_tokens + excluded.completion_tokens,"
    " estimated_tokens = token_usage.estimated_tokens + excluded.estimated_tokens,"
    " cached_tokens = token_usage.cached_tokens + excluded.cached_tokens,"
    " cost_micros = token_usage.cost_micros + excluded.cost_micros,"
    " unpriced_tokens = token_usage.unpriced_tokens + excluded.unpriced_tokens,"
    " calls = token_usage.calls + 1"
)
_LEDGER_OPEN = (
    "INSERT OR IGNORE INTO token_ledger(user, day, used, held, used_micros, held_micros) SELECT ?, ?,"
    " COALESCE(SUM(prompt_tokens + completion_tokens), 0), 0, COALESCE(SUM(cost_micros), 0), 0"
    " FROM token_usage WHERE user = ? AND day = ?"
)
_LEDGER_HOLD = "UPDATE token_ledger SET held = held + ? WHERE user = ? AND day = ? AND used + held < ?"
_LEDGER_HOLD_MONEY = (
    "UPDATE token_ledger SET held_micros = held_micros + ? WHERE user = ? AND day = ?"
    " AND used_micros + held_micros < ?"
)
_LEDGER_SETTLE = "UPDATE token_ledger SET used = used + ?, held = MAX(held - ?, 0) WHERE user = ? AND day = ?"
_LEDGER_SETTLE_MONEY = (
    "UPDATE token_ledger SET used_micros = used_micros + ?, held_micros = MAX(held_micros - ?, 0)"
    " WHERE user = ? AND day = ?"
)
USAGE_COST_COLUMNS = {
    ("token_usage", "cached_tokens"): "INTEGER NOT NULL DEFAULT 0",
    ("token_usage", "cost_micros"): "INTEGER NOT NULL DEFAULT 0",
    ("token_usage", "unpriced_tokens"): "INTEGER NOT NULL DEFAULT 0",
    ("token_ledger", "used_micros"): "INTEGER NOT NULL DEFAULT 0",
    ("token_ledger", "held_micros"): "INTEGER NOT NULL DEFAULT 0",
}
"""Added by schema step 11 (usage in money, gateway/turns/pricing.py): per row the prompt tokens
read from the provider's cache, the cost of the priced calls in micros and the tokens of calls
whose model had no price (their cost is unknown); the ledger's money spent and held. Rows from
before the step had no cost recorded: their tokens become unpriced (cost unknown, never 0)."""


@dataclass(frozen=True, slots=True)
class Totals:
    """Tokens over the three windows ``/usage`` shows."""

    name: str
    today: int
    week: int
    month: int
    estimated: int = 0
    """Of ``month``, the tokens counted by estimate (the provider reported no usage)."""
    cost: tuple[int, int, int] = (0, 0, 0)
    """Micros of the priced calls, today · 7 days · 30 days."""
    unpriced: tuple[int, int, int] = (0, 0, 0)
    """Tokens whose model had no price (their cost is unknown), in the same windows."""


class ModelUsageTables:
    """``conversation_models`` and ``token_usage`` (mixed into ``Store``)."""

    _db: Connection

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

    async def usage_add_many(
        self, usages: list[TokenUsage], day: date, costs: list[int | None] | None = None
    ) -> None:
        """Add model calls, in one transaction (one commit for all of them). ``costs``: each call's
        cost in micros, None for a model without a price (its tokens are counted unpriced)."""
        priced = costs if costs is not None else [None] * len(usages)
        rows = [
            (u.user, day.isoformat(), u.message_id, u.thread_id, u.model, u.purpose, u.prompt_tokens,
             u.completion_tokens, (u.prompt_tokens + u.completion_tokens) if u.estimated else 0,
             u.cached_tokens, cost or 0, (u.prompt_tokens + u.completion_tokens) if cost is None else 0)
            for u, cost in zip(usages, priced, strict=True)
        ]  # fmt: skip
        if len(rows) == 1:
            await self._write(_USAGE_ADD, rows[0])
        elif rows:
            await self._write(_USAGE_ADD, many=rows)

    async def cost_on(self, user: str, day: date) -> tuple[int, int]:
        """(micros spent, unpriced tokens) of ``user`` on ``day``."""
        sql = "SELECT SUM(cost_micros), SUM(unpriced_tokens) FROM token_usage WHERE user = ? AND day = ?"
        async with self._db.execute(sql, (user, day.isoformat())) as cur:
            row = await cur.fetchone()
        return (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)

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
            f" SUM(prompt_tokens + completion_tokens), SUM(estimated_tokens),"
            " SUM(CASE WHEN day = ? THEN cost_micros ELSE 0 END),"
            " SUM(CASE WHEN day >= ? THEN cost_micros ELSE 0 END), SUM(cost_micros),"
            " SUM(CASE WHEN day = ? THEN unpriced_tokens ELSE 0 END),"
            " SUM(CASE WHEN day >= ? THEN unpriced_tokens ELSE 0 END), SUM(unpriced_tokens)"
            f" FROM token_usage WHERE {where} GROUP BY {by} ORDER BY 4 DESC, 1 LIMIT ?"
        )
        windows = (today.isoformat(), week) * 3
        with self._db.on_thread():  # sums a month of rows
            async with self._db.execute(sql, (*windows, *params, limit)) as cur:
                rows = await cur.fetchall()
        return [
            Totals(
                str(r[0]),
                int(r[1] or 0),
                int(r[2] or 0),
                int(r[3] or 0),
                int(r[4] or 0),
                (int(r[5] or 0), int(r[6] or 0), int(r[7] or 0)),
                (int(r[8] or 0), int(r[9] or 0), int(r[10] or 0)),
            )
            for r in rows
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

    async def ledger_hold_money(self, user: str, day: str, micros: int, budget: int) -> bool:
        """:meth:`ledger_hold` for a money budget: ``micros`` held while spent + held < ``budget``."""
        return await self._write(_LEDGER_HOLD_MONEY, (micros, user, day, budget)) == 1

    async def ledger_state(self, user: str, day: str, money: bool = False) -> tuple[int, int]:
        """(spent, held) tokens of ``user`` on ``day`` (micros with ``money``)."""
        columns = "used_micros, held_micros" if money else "used, held"
        sql = f"SELECT {columns} FROM token_ledger WHERE user = ? AND day = ?"
        async with self._db.execute(sql, (user, day)) as cur:
            row = await cur.fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    async def ledger_settle(self, rows: list[tuple[int, int, str, str]]) -> None:
        """(spent, held before, user, day) per finished call: spent added, its hold freed."""
        if len(rows) == 1:
            await self._write(_LEDGER_SETTLE, rows[0])
        elif rows:
            await self._write(_LEDGER_SETTLE, many=rows)

    async def ledger_settle_money(self, rows: list[tuple[int, int, str, str]]) -> None:
        """:meth:`ledger_settle` for money: (micros spent, micros held before, user, day)."""
        if len(rows) == 1:
            await self._write(_LEDGER_SETTLE_MONEY, rows[0])
        elif rows:
            await self._write(_LEDGER_SETTLE_MONEY, many=rows)
