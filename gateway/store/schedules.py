"""The schedules table of the gateway's store, and the journal reads that schedules and pushes need.

A mixin of :class:`gateway.store.journal.Store` (like :mod:`gateway.store.access`), using the store's
connection and its full-disk-aware ``_write``. A schedule row says what to run, where (the
conversation, and the creating message as a template for the reply's target) and when next
(``next_fire``, epoch seconds, NULL once finished). A firing is not recorded here: it is a journal
entry keyed by (schedule, fire time) (gateway/schedules/runner.py), and this table only moves
``next_fire`` on once that entry exists.

A schedule made in a conversation that had read untrusted content has a ``provenance`` (JSON,
agent/provenance.py) and does not fire until its owner confirms it (``confirmed`` says who): the
due queries leave it out until then, so the runner neither fires it nor wakes for it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.provenance import UNTAINTED, Provenance
from channels.base import Inbound
from gateway.store.connection import Connection
from gateway.store.entries import inbound_from_json, inbound_to_json
from gateway.store.limits import OverLimit

SCHEDULE_TABLES = (
    """CREATE TABLE IF NOT EXISTS schedules (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    origin TEXT NOT NULL UNIQUE,
    conversation TEXT NOT NULL,
    template TEXT NOT NULL,
    creator TEXT NOT NULL,
    text TEXT NOT NULL,
    cron TEXT,
    tz TEXT NOT NULL,
    next_fire REAL,
    state TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS schedules_due ON schedules(next_fire) WHERE state = 'active'",
    "CREATE INDEX IF NOT EXISTS schedules_conversation ON schedules(conversation, state)",
)
"""Created by schema step 2 (:mod:`gateway.store.schema`). ``AUTOINCREMENT``: a cancelled
schedule's number is never given to a new one (a late ``/unschedule 7`` must not hit another)."""

PROVENANCE_COLUMNS = {"provenance": "TEXT", "confirmed": "TEXT"}
"""Added by schema step 7: the untrusted sources a schedule was made after (NULL: none) and who
confirmed it (NULL: nobody yet; a schedule with a provenance waits for that)."""
LAST_RUN_COLUMNS = {"last_run": "REAL", "last_outcome": "TEXT"}
"""Added by schema step 10: when a schedule last ran and how it ended (``posted``, or ``silent``: a
run with nothing to report posted nothing, gateway/turns/quiet.py), for ``/schedules``."""
_ACTIVE_OF = "SELECT COUNT(*) FROM schedules WHERE {} = ? AND state = ?"
"""Active schedules of one conversation or creator (the limits)."""
RUNNABLE = "(provenance IS NULL OR confirmed IS NOT NULL)"
"""The condition of a schedule that may fire."""

ACTIVE, DONE, CANCELLED = "active", "done", "cancelled"
SCHEDULE_MARK = "chital_schedule"
"""In a firing's ``extra``: the schedule's id."""
PUSH_MARK = "chital_push"
"""In a ``chital send`` notice's ``extra``: the daemon's push loop picks it up
(gateway/schedules/runner.py)."""


@dataclass(frozen=True, slots=True)
class Schedule:
    id: int
    conversation: str
    template: Inbound
    """The message that created it: platform, chat, thread and the adapter's reply data."""
    creator: str
    text: str
    cron: str | None
    tz: str
    next_fire: float | None
    state: str
    created: float
    provenance: Provenance = UNTAINTED
    """The untrusted sources in the model's context when it was made (agent/provenance.py)."""
    confirmed: str | None = None
    """Who confirmed it (None: nobody yet)."""
    last_run: float | None = None
    """When a run last ended (None: never)."""
    last_outcome: str | None = None
    """How it ended: ``posted`` or ``silent``."""

    @property
    def unconfirmed(self) -> bool:
        """Made after reading untrusted content and waiting for its owner's confirmation."""
        return self.provenance.tainted and self.confirmed is None


_COLUMNS = (
    "id, conversation, template, creator, text, cron, tz, next_fire, state, created, provenance, confirmed,"
    " last_run, last_outcome"
)


def _of_platforms(platforms: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """A condition on ``conversation`` (``platform:chat...``) matching ``platforms``, portable SQL
    (PostgreSQL has no ``instr``), and its parameters."""
    if not platforms:
        return "1 = 0", ()
    condition = " OR ".join(["conversation LIKE ?"] * len(platforms))
    return f"({condition})", tuple(f"{p}:%" for p in platforms)


def _template_json(inbound: Inbound) -> str:
    data = {
        "platform": inbound.platform,
        "chat_id": inbound.chat_id,
        "message_id": inbound.message_id,
        "sender_id": inbound.sender_id,
        "is_direct": inbound.is_direct,
        "thread_id": inbound.thread_id,
        "sender_name": inbound.sender_name,
        "chat_title": inbound.chat_title,
        "extra": inbound.extra,
    }
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _row(row: Any) -> Schedule:
    sid, conv, template, creator, text, cron, tz, next_fire, state, created, provenance, confirmed = row[:12]
    last_run, last_outcome = row[12:14]
    data = json.loads(template)
    inbound = Inbound(text="", addressed=True, **data)
    return Schedule(int(sid), str(conv), inbound, str(creator), str(text), cron, str(tz),
                    None if next_fire is None else float(next_fire), str(state), float(created),
                    Provenance.from_json(provenance),
                    None if confirmed is None else str(confirmed),
                    None if last_run is None else float(last_run),
                    None if last_outcome is None else str(last_outcome))  # fmt: skip


class ScheduleTables:
    """Schedule rows and the journal reads of :mod:`gateway.schedules.runner` and ``chital send``."""

    _db: Connection

    async def _write(self, sql: str, params: tuple[Any, ...] = (), *, locks: Sequence[str] = ()) -> int:
        raise NotImplementedError  # the Store's

    # -- schedules --------------------------------------------------------------------------------
    async def schedule_add(
        self,
        *,
        origin: str,
        template: Inbound,
        creator: str,
        text: str,
        cron: str | None,
        tz: str,
        next_fire: float,
        provenance: Provenance = UNTAINTED,
        limits: tuple[int, int] | None = None,
    ) -> tuple[Schedule, bool]:
        """Insert a schedule once per ``origin`` (message and tool call); returns it and whether it
        is new (False: the same call ran before, e.g. a turn resumed after a crash).

        ``limits`` (active schedules per conversation, per creator): counted in the insert itself,
        under locks on both names, so that no two daemons both pass them; a refusal raises
        :class:`~gateway.store.limits.OverLimit` (scope ``conversation`` or ``user``)."""
        now = time.time()
        conversation = template.conversation
        values = (origin, conversation, _template_json(template), creator, text, cron, tz, next_fire,
                  ACTIVE, now, now, provenance.to_json())  # fmt: skip
        insert = (
            "INSERT OR IGNORE INTO schedules(origin, conversation, template, creator, text, cron, tz,"
            " next_fire, state, created, updated, provenance) {} ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
        )
        if limits is None:
            count = await self._write(insert.format("VALUES (") + ")", values)
        else:
            insert = insert.format("SELECT")
            of = _ACTIVE_OF.format
            under = f"WHERE ({of('conversation')}) < ? AND ({of('creator')}) < ?"
            params = (*values, conversation, ACTIVE, limits[0], creator, ACTIVE, limits[1])
            locks = (f"schedules:conversation:{conversation}", f"schedules:user:{creator}")
            count = await self._write(f"{insert} {under}", params, locks=locks)
        async with self._db.execute(f"SELECT {_COLUMNS} FROM schedules WHERE origin = ?", (origin,)) as cur:
            row = await cur.fetchone()
        if row is None:  # not inserted, and not made before by the same call: a limit refused it
            assert limits is not None
            in_conversation, by_user = await self.schedule_counts(conversation, creator)
            if in_conversation >= limits[0]:
                raise OverLimit("conversation", in_conversation)
            raise OverLimit("user", max(by_user, limits[1]))
        return _row(row), count == 1

    async def schedule_get(self, schedule_id: int) -> Schedule | None:
        async with self._db.execute(f"SELECT {_COLUMNS} FROM schedules WHERE id = ?", (schedule_id,)) as cur:
            row = await cur.fetchone()
        return _row(row) if row else None

    async def schedules_active(self, conversation: str) -> list[Schedule]:
        """The conversation's active schedules, the next to fire first."""
        async with self._db.execute(
            f"SELECT {_COLUMNS} FROM schedules WHERE conversation = ? AND state = ? ORDER BY next_fire, id",
            (conversation, ACTIVE),
        ) as cur:
            return [_row(r) for r in await cur.fetchall()]

    async def schedules_finished(self, conversation: str, limit: int = 3) -> list[Schedule]:
        """The conversation's one-time schedules that ran, the latest run first (``/schedules``
        says how their last run went: a quiet one posted nothing)."""
        async with self._db.execute(
            f"SELECT {_COLUMNS} FROM schedules WHERE conversation = ? AND state = ? AND last_run IS NOT NULL"
            " ORDER BY last_run DESC, id DESC LIMIT ?",
            (conversation, DONE, limit),
        ) as cur:
            return [_row(r) for r in await cur.fetchall()]

    async def schedules_all(self, limit: int = 200) -> list[Schedule]:
        """Every active schedule, the next to fire first."""
        async with self._db.execute(
            f"SELECT {_COLUMNS} FROM schedules WHERE state = ? ORDER BY next_fire, id LIMIT ?",
            (ACTIVE, limit),
        ) as cur:
            return [_row(r) for r in await cur.fetchall()]

    async def schedule_counts(self, conversation: str, creator: str) -> tuple[int, int]:
        """Active schedules of ``conversation`` and of ``creator`` (for the limits)."""
        counts = []
        for column, value in (("conversation", conversation), ("creator", creator)):
            async with self._db.execute(
                f"SELECT COUNT(*) FROM schedules WHERE {column} = ? AND state = ?", (value, ACTIVE)
            ) as cur:
                row = await cur.fetchone()
            counts.append(int(row[0]) if row else 0)
        return counts[0], counts[1]

    async def schedules_due(self, now: float, platforms: Sequence[str], limit: int = 100) -> list[Schedule]:
        """Active schedules of ``platforms`` due at ``now``, the earliest first."""
        where, params = _of_platforms(platforms)
        async with self._db.execute(
            f"SELECT {_COLUMNS} FROM schedules WHERE state = ? AND next_fire <= ? AND {where}"
            f" AND {RUNNABLE} ORDER BY next_fire LIMIT ?",
            (ACTIVE, now, *params, limit),
        ) as cur:
            return [_row(r) for r in await cur.fetchall()]

    async def schedule_next_time(self, platforms: Sequence[str]) -> float | None:
        """When the next active schedule of ``platforms`` is due (None: none is)."""
        where, params = _of_platforms(platforms)
        async with self._db.execute(
            f"SELECT MIN(next_fire) FROM schedules WHERE state = ? AND {where} AND {RUNNABLE}",
            (ACTIVE, *params),
        ) as cur:
            row = await cur.fetchone()
        return float(row[0]) if row and row[0] is not None else None

    async def schedule_advance(self, schedule_id: int, expected: float, next_fire: float | None) -> bool:
        """Move an active schedule from ``expected`` to ``next_fire`` (None: it is done). Only
        when it still stands at ``expected`` (a cancel in between wins). True when it moved."""
        state = ACTIVE if next_fire is not None else DONE
        count = await self._write(
            "UPDATE schedules SET next_fire = ?, state = ?, updated = ? WHERE id = ? AND state = ?"
            " AND next_fire = ?",
            (next_fire, state, time.time(), schedule_id, ACTIVE, expected),
        )
        return count == 1

    async def schedule_confirm(self, schedule_id: int, by: str, next_fire: float) -> bool:
        """Confirm an active, unconfirmed schedule (the first confirmation wins) and set its next
        run. True when this call confirmed it."""
        count = await self._write(
            "UPDATE schedules SET confirmed = ?, next_fire = ?, updated = ? WHERE id = ? AND state = ?"
            " AND provenance IS NOT NULL AND confirmed IS NULL",
            (by or "?", next_fire, time.time(), schedule_id, ACTIVE),
        )
        return count == 1

    async def schedule_ran(self, schedule_id: int, outcome: str) -> None:
        """Record that a run of the schedule ended now, and how (whatever its state: a one-time
        schedule is done by the time its run ends)."""
        now = time.time()
        await self._write(
            "UPDATE schedules SET last_run = ?, last_outcome = ?, updated = ? WHERE id = ?",
            (now, outcome, now, schedule_id),
        )

    async def schedule_cancel(self, schedule_id: int) -> bool:
        count = await self._write(
            "UPDATE schedules SET state = ?, next_fire = NULL, updated = ? WHERE id = ? AND state = ?",
            (CANCELLED, time.time(), schedule_id, ACTIVE),
        )
        return count == 1

    async def schedules_prune(self, older_than: float) -> int:
        """Delete finished and cancelled schedules untouched for ``older_than`` seconds (a user
        who makes and cancels schedules all day must not grow the table for ever)."""
        with self._db.on_thread():  # a scan of the table
            return await self._write(
                "DELETE FROM schedules WHERE state != ? AND updated < ?", (ACTIVE, time.time() - older_than)
            )

    # -- journal reads ----------------------------------------------------------------------------
    async def journal_inbound(self, key: str) -> Inbound | None:
        """The message journaled under ``key`` (None when there is none)."""
        async with self._db.execute("SELECT payload FROM journal WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        return inbound_from_json(str(row[0]))[0] if row else None

    async def journal_state(self, key: str) -> str | None:
        async with self._db.execute("SELECT state FROM journal WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def journal_fail_with(self, key: str, extra_key: str, reason: str) -> None:
        """Mark ``key`` failed and keep ``reason`` on it (in its message's extra, under
        ``extra_key``): what ``chital send --wait`` tells the operator about a refused push."""
        async with self._db.execute("SELECT payload FROM journal WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        if row is None:
            return
        inbound, note = inbound_from_json(str(row[0]))
        inbound.extra[extra_key] = reason
        await self._write(
            "UPDATE journal SET state = 'failed', payload = ?, updated = ? WHERE key = ?",
            (inbound_to_json(inbound, note), time.time(), key),
        )

    async def journal_last_rowid(self) -> int:
        async with self._db.execute("SELECT COALESCE(MAX(rowid), 0) FROM journal") as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def journal_pending_after(self, rowid: int, kind: str) -> list[tuple[int, Inbound, str]]:
        """(rowid, message, note) of pending entries of ``kind`` journaled after ``rowid``: what
        another process (``chital send``) added since the last look. A range scan on the rowid,
        cheap enough to run every second."""

        async with self._db.execute(
            "SELECT rowid, payload FROM journal WHERE rowid > ? AND kind = ? AND state = 'pending'"
            " ORDER BY rowid",
            (rowid, kind),
        ) as cur:
            rows = await cur.fetchall()
        return [(int(r), *inbound_from_json(str(p))) for r, p in rows]

    async def thread_conversation(self, thread_id: str) -> str | None:
        """The conversation whose current agent thread is ``thread_id``."""
        sql = "SELECT conversation FROM threads WHERE thread_id = ?"
        async with self._db.execute(sql, (thread_id,)) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None
