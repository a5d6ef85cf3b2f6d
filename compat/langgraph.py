"""Reaches into LangGraph's checkpointers: their tables, whose layout is private, read and written
with Chital's own SQL, and ``SqliteSaver``'s private ``_has_task_path``.

Why (agent/checkpoints.py ``InlineSqliteSaver``): the saver keeps recent threads' message history
in memory and must see, when it first reads a thread, the writes already stored against the
checkpoint it read (a paused or failed step's); and it writes a step's writes in one transaction
(``SqliteSaver.put_writes`` commits row by row, so a batch failing halfway on a full disk would
leave rows LangGraph then counts as the whole step). ``chital migrate`` (gateway/cli/migrate.py)
reads each write's ``task_path``, which the savers' public ``list`` does not return, and asks
whether a PostgreSQL target already holds an agent's state by its tables' names.

Public fallback for the SQLite saver (outside :data:`compat.versions.VERIFIED`'s
``langgraph-checkpoint-sqlite`` set): no history kept in memory (every read walks the database,
as ``SqliteSaver`` does) and ``SqliteSaver``'s own ``put_writes``; :func:`usable` says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from compat.versions import usable as _usable

DISTRIBUTION = "langgraph-checkpoint-sqlite"

POSTGRES_TABLES = ("checkpoints", "checkpoint_writes", "store")
"""The PostgreSQL checkpointer's and store's tables whose rows mean an agent's state is there
(langgraph-checkpoint-postgres, pinned in the ``postgres`` extra)."""


def usable() -> bool:
    """Whether the SQLite saver's tables may be read and written with :func:`stored_writes` and
    :func:`insert_writes` (the installed release is a verified one)."""
    return _usable(DISTRIBUTION)


def has_task_path(saver: Any) -> bool:
    """Whether ``saver``'s (a ``SqliteSaver``'s) writes table has the ``task_path`` column
    (it is added by a later migration; the saver keeps the answer privately)."""
    return bool(saver._has_task_path)


def stored_writes(
    cur: sqlite3.Cursor, thread: str, checkpoint_id: str, *, with_path: bool
) -> list[tuple[str, int, str, str, str, bytes]]:
    """The writes stored against one checkpoint of ``thread`` (root namespace), as rows of
    (task_id, idx, task_path, channel, type, value); ``task_path`` is "" without the column."""
    cur.execute(
        "SELECT task_id, idx, task_path, channel, type, value FROM writes"
        " WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?"
        if with_path
        else "SELECT task_id, idx, '', channel, type, value FROM writes"
        " WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?",
        (thread, checkpoint_id),
    )
    return list(cur.fetchall())


def insert_writes(cur: sqlite3.Cursor, rows: Sequence[tuple[Any, ...]], *, replace: bool) -> None:
    """Store a step's writes as ``SqliteSaver.put_writes`` does (``INSERT OR REPLACE`` when every
    channel is a special one, else ``INSERT OR IGNORE``); rows are (thread_id, checkpoint_ns,
    checkpoint_id, task_id, task_path, idx, channel, type, value). The caller holds the
    transaction."""
    cur.executemany(
        f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO writes (thread_id,"
        " checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )


def task_paths(conn: sqlite3.Connection, thread: str, ns: str, checkpoint_id: str) -> dict[str, str]:
    """``{task_id: task_path}`` of the writes stored against one checkpoint of a SQLite saver's
    file; empty when its writes table has no ``task_path`` column."""
    if "task_path" not in {str(r[1]) for r in conn.execute("PRAGMA table_info(writes)")}:
        return {}
    rows = conn.execute(
        "SELECT task_id, task_path FROM writes"
        " WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
        (thread, ns, checkpoint_id),
    )
    return {str(t): str(p or "") for t, p in rows}


# ---- pruning a thread's checkpoints (agent/compaction.py) ----------------------------------------
def checkpoint_parents(cur: sqlite3.Cursor, thread: str) -> dict[str, str | None]:
    """``{checkpoint_id: parent_checkpoint_id}`` of a SQLite saver's thread, root namespace."""
    cur.execute(
        "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints"
        " WHERE thread_id = ? AND checkpoint_ns = ''",
        (thread,),
    )
    return {str(c): (str(p) if p else None) for c, p in cur.fetchall()}


def delete_checkpoints(cur: sqlite3.Cursor, thread: str, ids: Sequence[str]) -> None:
    """Delete checkpoints of a SQLite saver's thread (root namespace) and the writes stored against
    them. The caller holds the transaction."""
    rows = [(thread, cid) for cid in ids]
    cur.executemany(
        "DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?", rows
    )
    cur.executemany(
        "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?", rows
    )


PG_PARENTS = (
    "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''"
)
"""The PostgreSQL saver's ``{checkpoint_id: parent}`` of a thread (as :func:`checkpoint_parents`)."""
PG_DELETE = (
    "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = ANY(%s)",
    "DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = ANY(%s)",
)
"""Delete a PostgreSQL saver's checkpoints of a thread (root namespace) and their writes; parameters
(thread_id, [checkpoint ids])."""
PG_DELETE_UNUSED_BLOBS = (
    "DELETE FROM checkpoint_blobs b WHERE b.thread_id = %s AND b.checkpoint_ns = ''"
    " AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = b.thread_id"
    " AND c.checkpoint_ns = b.checkpoint_ns AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)"
)
"""Then the channel values no kept checkpoint of the thread refers to (the PostgreSQL saver stores
each channel's value once per version, ``checkpoint_blobs``); parameter (thread_id,)."""


PG_STORED_WRITES = (
    "SELECT task_id, idx, task_path, channel, type, blob FROM checkpoint_writes"
    " WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = %s"
)
"""The writes stored against one checkpoint of a PostgreSQL saver's thread (root namespace), as
rows {task_id, idx, task_path, channel, type, blob}; parameters (thread_id, checkpoint_id). Read by
agent/postgres_saver.py ``KeptPostgresSaver`` on every read it serves from memory."""


POSTGRES_DISTRIBUTION = "langgraph-checkpoint-postgres"


def postgres_usable() -> bool:
    """Whether the PostgreSQL saver's tables may be read with :data:`PG_STORED_WRITES` (and its
    history kept, agent/postgres_saver.py): the installed release is a verified one."""
    return _usable(POSTGRES_DISTRIBUTION)


class _InlineThreads:
    """The ``asyncio`` LangGraph's Postgres checkpointer sees: ``to_thread`` runs the function
    inline. It hands each (de)serialisation of a checkpoint to a worker thread, about seven hops per
    turn; a turn's checkpoint is small, and on a busy machine each hop (a context switch, the GIL
    handed back and forth) cost more than the work. The SQLite checkpointer runs inline too
    (agent/checkpoints.py)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def to_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def inline_postgres_threads(module: Any) -> None:
    """Make ``langgraph.checkpoint.postgres.aio`` (``module``) run its ``asyncio.to_thread`` calls
    inline (:class:`_InlineThreads` says why): its module global ``asyncio`` is replaced. Public
    fallback (outside the verified ``langgraph-checkpoint-postgres`` releases): left as it is, each
    (de)serialisation goes to a worker thread (slower, same result)."""
    if _usable(POSTGRES_DISTRIBUTION):
        module.asyncio = _InlineThreads()


# -- statements of the PostgreSQL saver, recorded or sent on a given cursor ----------------------
_PG_CURSOR: ContextVar[Any] = ContextVar("chital_pg_saver_cursor", default=None)


class RecordingCursor:
    """Stands in for the PostgreSQL saver's cursor: each statement ``aput``/``aput_writes`` would
    run is kept, its parameters already serialised (bytes, ``Jsonb`` of primitives), to be run
    later with :func:`run_statements`. Why: agent/postgres_saver.py sends a turn's input
    checkpoint, its input's writes and the first step's checkpoint in one round trip."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any, bool]] = []

    async def execute(self, query: str, params: Any = None) -> None:
        self.statements.append((query, params, False))

    async def executemany(self, query: str, params_seq: Any) -> None:
        self.statements.append((query, list(params_seq), True))


@contextlib.contextmanager
def saver_statements_to(cursor: Any) -> Iterator[None]:
    """Within: the PostgreSQL saver's statements go to ``cursor`` (a :class:`RecordingCursor`, or a
    cursor of a connection in a pipeline the caller opened), not to a connection of its pool."""
    token = _PG_CURSOR.set(cursor)
    try:
        yield
    finally:
        _PG_CURSOR.reset(token)


async def run_statements(cursor: Any, statements: Sequence[tuple[str, Any, bool]]) -> None:
    """Run what a :class:`RecordingCursor` kept, in order, on ``cursor``."""
    for query, params, many in statements:
        if many:
            await cursor.executemany(query, params)
        else:
            await cursor.execute(query, params)


_PULLED = "~__pregel_pull, "


def pulled_node(task_path: str) -> str | None:
    """The node a task's path names when its edges triggered it (``"~__pregel_pull, model"``); None
    for a task sent on its own (``Send``: the tool calls of one step run side by side) or a path
    of another shape. LangGraph's task paths are private; agent/postgres_saver.py holds the lead
    model's writes by it."""
    if not task_path.startswith(_PULLED):
        return None
    node = task_path[len(_PULLED) :]
    return node if node and "," not in node else None


@functools.cache
def postgres_saver_base() -> type[Any]:
    """``AsyncPostgresSaver`` whose private ``_cursor`` (every statement of ``aput`` and
    ``aput_writes`` runs on the cursor it yields, after taking the saver's lock and a pooled
    connection) yields the cursor :func:`saver_statements_to` set, when one is set and the release
    is a verified one; otherwise the library's own. Outside the verified releases nothing sets one
    (agent/postgres_saver.py asks :func:`postgres_usable` first), so the library runs as it is."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    class StatementsSaver(AsyncPostgresSaver):
        @contextlib.asynccontextmanager
        async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[Any]:
            given = _PG_CURSOR.get()
            if given is None:
                async with super()._cursor(pipeline=pipeline) as cur:
                    yield cur
            else:
                yield given

    return StatementsSaver
