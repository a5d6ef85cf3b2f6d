"""The background tasks table of the gateway's store (docs/background-tasks.md).

A mixin of :class:`gateway.store.journal.Store`, like :mod:`gateway.store.schedules`. A row says who
asked for what in which conversation; the work itself is a journal entry of its own (keyed
``<platform>:<chat>:bg-<id>``, in the conversation ``<conversation>:bg:<id>``), so the journal's
claim, outbox and resume-after-a-crash carry the task as they carry a message. The row adds only
what the journal cannot say: the task's number, its owner and text, and why it ended when it did
not end by its own answer (``ended``: stopped, its owner's access revoked, forgotten). A task's
state is read from its journal entry (a join), never kept twice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.store.connection import Connection
from gateway.store.limits import OverLimit

BACKGROUND_TABLES = (
    """CREATE TABLE IF NOT EXISTS background_tasks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    origin TEXT NOT NULL UNIQUE,
    key TEXT NOT NULL DEFAULT '',
    conversation TEXT NOT NULL,
    owner TEXT NOT NULL,
    text TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    ended TEXT
)""",
    "CREATE INDEX IF NOT EXISTS background_tasks_owner ON background_tasks(owner)",
    "CREATE INDEX IF NOT EXISTS background_tasks_conversation ON background_tasks(conversation)",
)
"""Created by schema step 8 (:mod:`gateway.store.schema`). ``origin`` is the request (the ``/bg``
message's journal key, or the message and tool call id of ``start_background_task``): a request
run again after a crash finds its task instead of starting a second one. ``AUTOINCREMENT``: a
finished task's number is never given to a new one (a late ``/tasks stop 7`` must not hit another)."""

OPEN = ("pending", "running", "waiting")
"""Journal states of a task that has not finished (``waiting``: for a person's approval)."""

UNJOURNALED_GRACE = 600.0
"""Seconds a task row may wait for its journal entry and still count against its owner's cap."""

_COLUMNS = "t.id, t.key, t.conversation, t.owner, t.text, t.created, t.updated, t.ended, j.state, j.updated"
_FROM = "background_tasks t LEFT JOIN journal j ON j.key = t.key"
_OPEN_SQL = ", ".join(f"'{s}'" for s in OPEN)
_RUNNING_COUNT = (
    f"SELECT COUNT(*) FROM {_FROM} WHERE t.owner = ? AND t.ended IS NULL"
    f" AND (j.state IN ({_OPEN_SQL}) OR (t.key = '' AND t.created > ?))"
)
"""An owner's unfinished tasks (parameters: the owner, the oldest unjournaled row that counts)."""


@dataclass(frozen=True, slots=True)
class BackgroundTask:
    id: int
    key: str
    """The journal key of its turn ('' until it is journaled)."""
    conversation: str
    """The conversation it was asked in (where its result goes), not its own."""
    owner: str
    text: str
    created: float
    updated: float
    ended: str | None
    """Why it ended when not by its own answer ("stopped by …", "access revoked", …); None."""
    state: str | None
    """Its journal entry's state (None: not journaled yet, or pruned)."""
    finished_at: float | None

    @property
    def running(self) -> bool:
        return self.ended is None and self.state in OPEN


def _row(row: Any) -> BackgroundTask:
    tid, key, conv, owner, text, created, updated, ended, state, jupdated = row
    finished = None
    if ended is not None:
        finished = float(updated)
    elif state is not None and state not in OPEN:
        finished = float(jupdated)
    return BackgroundTask(int(tid), str(key), str(conv), str(owner), str(text), float(created),
                          float(updated), ended, state, finished)  # fmt: skip


class BackgroundTables:
    """The ``background_tasks`` table; the Store supplies ``_db`` and ``_write``."""

    _db: Connection

    async def _write(self, sql: str, params: tuple[Any, ...] = (), *, locks: Sequence[str] = ()) -> int:
        raise NotImplementedError  # the Store's

    async def background_add(
        self, *, origin: str, conversation: str, owner: str, text: str, cap: int | None = None
    ) -> BackgroundTask:
        """The task of ``origin``, inserted unless that request made it already.

        ``cap``: the most unfinished tasks ``owner`` may have (what :meth:`background_running`
        counts), counted by the insert itself under a lock on the owner, so that two daemons
        never both pass it; a refusal raises :class:`~gateway.store.limits.OverLimit`."""
        now = time.time()
        insert = "INSERT OR IGNORE INTO background_tasks(origin, conversation, owner, text, created, updated)"
        values = (origin, conversation, owner, text, now, now)
        if cap is None:
            await self._write(f"{insert} VALUES (?, ?, ?, ?, ?, ?)", values)
        else:
            params = (*values, owner, now - UNJOURNALED_GRACE, cap)
            sql = f"{insert} SELECT ?, ?, ?, ?, ?, ? WHERE ({_RUNNING_COUNT}) < ?"
            await self._write(sql, params, locks=(f"tasks:user:{owner}",))
        async with self._db.execute(f"SELECT {_COLUMNS} FROM {_FROM} WHERE t.origin = ?", (origin,)) as cur:
            row = await cur.fetchone()
        if row is None:  # refused by the cap (a request that made its task before finds it)
            raise OverLimit("user", max(await self.background_running(owner), cap or 0))
        return _row(row)

    async def background_by_origin(self, origin: str) -> BackgroundTask | None:
        async with self._db.execute(f"SELECT {_COLUMNS} FROM {_FROM} WHERE t.origin = ?", (origin,)) as cur:
            row = await cur.fetchone()
        return _row(row) if row else None

    async def background_keyed(self, task_id: int, key: str) -> None:
        """Record the journal key of the task's turn (once journaled, it never changes)."""
        await self._write("UPDATE background_tasks SET key = ? WHERE id = ? AND key = ''", (key, task_id))

    async def background_get(self, task_id: int) -> BackgroundTask | None:
        if not 0 < task_id < 2**63:  # a number beyond SQL's integers names none
            return None
        async with self._db.execute(f"SELECT {_COLUMNS} FROM {_FROM} WHERE t.id = ?", (task_id,)) as cur:
            row = await cur.fetchone()
        return _row(row) if row else None

    async def background_running(self, owner: str) -> int:
        """Tasks of ``owner`` not finished: what the per-user cap counts. A row not journaled yet
        counts only while it is young (:data:`UNJOURNALED_GRACE`): it is journaled moments after it
        is inserted, or by the asking turn's re-run after a crash; one whose asking turn never ran
        again (stopped, forgotten) is an orphan and must not hold the owner's cap forever."""
        async with self._db.execute(_RUNNING_COUNT, (owner, time.time() - UNJOURNALED_GRACE)) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def background_list(self, conversation: str, limit: int) -> list[BackgroundTask]:
        """The conversation's tasks: the unfinished ones first (all of them, however old, unless
        more than ``limit``), then the most recent finished ones, newest first."""
        first = f"CASE WHEN t.ended IS NULL AND (j.state IN ({_OPEN_SQL}) OR t.key = '') THEN 0 ELSE 1 END"
        async with self._db.execute(
            f"SELECT {_COLUMNS} FROM {_FROM} WHERE t.conversation = ? ORDER BY {first}, t.id DESC LIMIT ?",
            (conversation, limit),
        ) as cur:
            return [_row(r) for r in await cur.fetchall()]

    async def background_all(self, limit: int = 200) -> list[BackgroundTask]:
        """Every conversation's background tasks, the newest first."""
        async with self._db.execute(
            f"SELECT {_COLUMNS} FROM {_FROM} ORDER BY t.id DESC LIMIT ?", (limit,)
        ) as cur:
            return [_row(r) for r in await cur.fetchall()]

    async def background_of(self, owner: str) -> list[BackgroundTask]:
        """``owner``'s tasks that have not ended (``/forget`` ends them)."""
        async with self._db.execute(
            f"SELECT {_COLUMNS} FROM {_FROM} WHERE t.owner = ? AND t.ended IS NULL ORDER BY t.id", (owner,)
        ) as cur:
            return [_row(r) for r in await cur.fetchall() if _row(r).state in (*OPEN, None)]

    async def background_end(self, task_id: int, why: str) -> bool:
        """Mark the task ended for ``why``; False when it had ended already (the first reason stays)."""
        count = await self._write(
            "UPDATE background_tasks SET ended = ?, updated = ? WHERE id = ? AND ended IS NULL",
            (why[:200], time.time(), task_id),
        )
        return count == 1

    async def background_reopen(self, task_id: int, why: str) -> None:
        """Undo :meth:`background_end` for ``why``: the stop came too late (the task's result was
        going out already), so the task ends by its answer and must not read as stopped."""
        await self._write(
            "UPDATE background_tasks SET ended = NULL WHERE id = ? AND ended = ?", (task_id, why[:200])
        )

    async def background_prune(self, older_than: float) -> int:
        """Tasks whose journal entry is gone (pruned with the journal) or that ended long ago."""
        with self._db.on_thread():
            return await self._write(
                "DELETE FROM background_tasks WHERE updated < ? AND (ended IS NOT NULL OR"
                " NOT EXISTS (SELECT 1 FROM journal j WHERE j.key = background_tasks.key))",
                (time.time() - older_than,),
            )
