"""The agent's state in PostgreSQL: LangGraph's own Postgres checkpointer and store.

Used when the gateway runs on PostgreSQL (``storage.url``, docs/scale-out.md), so every daemon
sharing the database sees the same threads and memories: a turn started on one daemon can be
continued by another from its last checkpoint. Imported only then (psycopg is an optional extra).
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agent.compaction import kept_chain
from compat import langgraph as langgraph_compat

Closer = Callable[[], Awaitable[None]]


async def _check_when_told(conn: Any) -> None:
    """The pool's check of a connection being taken: asked (an empty query, psycopg_pool's own
    check) only when its idle socket has something to read, which for an idle connection means
    the server said goodbye (a restart, a failover, ``pg_terminate_backend``): that check then
    fails and the pool hands out a new connection instead. Every other take costs no round trip;
    asking every time cost one per checkpoint call, about nine per turn (docs/performance.md,
    "Several daemons")."""
    from psycopg_pool import AsyncConnectionPool

    if conn.closed or conn.broken or _readable(conn.pgconn.socket):
        await AsyncConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True  # a closed descriptor: let the real check say so


async def _pool(url: str, max_size: int) -> Any:
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    # The settings LangGraph's savers expect: autocommit, dict rows. A statement run five times is
    # prepared on its connection (psycopg's default, as the gateway's own connection does): the
    # server no longer parses and plans the checkpointer's statements on every call (about half of
    # PostgreSQL's CPU per message: docs/scale-out.md, "What coordination costs"). Behind
    # PgBouncer in transaction mode that needs PgBouncer 1.21 or later (`max_prepared_statements`),
    # as the gateway's connection already did.
    pool = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 5, "row_factory": dict_row},
        # A connection the server dropped (a restart, a failover) is replaced when it is taken,
        # instead of failing one turn per dead connection.
        check=_check_when_told,
    )
    await pool.open(wait=True, timeout=30)
    return pool


SETUP_LOCK = 0x43484B50  # "CHKP": one daemon at a time creates or migrates LangGraph's tables


async def _setup_alone(pool: Any, setup: Callable[[], Awaitable[None]]) -> None:
    """LangGraph's ``setup()`` run by several daemons starting together would race on its
    migration table (a duplicate key): hold a session advisory lock around it.

    Polled with ``pg_try_advisory_lock`` rather than waited for with ``pg_advisory_lock``: the
    setup creates indexes ``CONCURRENTLY``, which waits for every other session's open statement,
    and a daemon blocked inside ``pg_advisory_lock`` would be one: a deadlock nobody detects."""
    async with pool.connection() as conn:
        while True:
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (SETUP_LOCK,))
            row = await cur.fetchone()
            if row and next(iter(row.values() if isinstance(row, dict) else row)):
                break
            await asyncio.sleep(0.2)
        try:
            await setup()
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK,))


async def _open(url: str, max_size: int, factory: Callable[[Any], Any]) -> tuple[Any, Closer]:
    """``factory(pool)`` with its tables set up, and how to close it (the pool goes on failure)."""
    pool = await _pool(url, max_size)
    try:
        made = factory(pool)
        await _setup_alone(pool, made.setup)
    except BaseException:
        await pool.close()
        raise
    return made, pool.close


async def postgres_checkpointer(url: str, max_size: int = 10) -> tuple[Any, Closer]:
    """An ``AsyncPostgresSaver`` (agent/postgres_saver.py: keeping recent threads' history) with
    its tables set up, and how to close it."""
    import langgraph.checkpoint.postgres.aio as saver

    from agent.postgres_saver import KeptPostgresSaver

    langgraph_compat.inline_postgres_threads(saver)
    return await _open(url, max_size, KeptPostgresSaver)


async def postgres_store(url: str, max_size: int = 4) -> tuple[Any, Closer]:
    """An ``AsyncPostgresStore`` (long-term memory) with its tables set up, and how to close it."""
    from langgraph.store.postgres.aio import AsyncPostgresStore

    return await _open(url, max_size, AsyncPostgresStore)


async def prune(saver: Any, thread_id: str, delta_channels: Sequence[str]) -> int:
    """``InlineSqliteSaver.prune_thread`` for an ``AsyncPostgresSaver``: the thread's checkpoints
    (root namespace) its latest does not need go with their writes, then the channel values no kept
    checkpoint refers to, in one transaction (agent/compaction.py); the number deleted.

    Why not the saver's own ``aprune(strategy="keep_latest")``: it refuses threads with delta
    channels (deleting their ancestors would empty the history), which every Chital thread has."""
    thread = str(thread_id)
    latest = await saver.aget_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
    if latest is None:
        return 0
    head = str(latest.config["configurable"]["checkpoint_id"])
    versions = latest.checkpoint.get("channel_versions") or {}
    versioned = [ch for ch in delta_channels if ch in versions]
    counters = (latest.metadata or {}).get("counters_since_delta_snapshot")
    async with saver.conn.connection() as conn, conn.transaction():
        cur = await conn.execute(langgraph_compat.PG_PARENTS, (thread,))
        rows = await cur.fetchall()
        parents = {
            str(r["checkpoint_id"]): (str(r["parent_checkpoint_id"]) if r["parent_checkpoint_id"] else None)
            for r in rows
        }
        kept = kept_chain(head, parents, counters, versioned)
        # Only older ids: a checkpoint put since the latest was read is not judged here.
        gone = [] if kept is None else [c for c in parents if c not in kept and c < head]
        if gone:
            for sql in langgraph_compat.PG_DELETE:
                await conn.execute(sql, (thread, gone))
            await conn.execute(langgraph_compat.PG_DELETE_UNUSED_BLOBS, (thread,))
    return len(gone)
