"""The agent's state in PostgreSQL: LangGraph's own Postgres checkpointer and store.

Used when the gateway runs on PostgreSQL (``storage.url``, docs/scale-out.md), so every daemon
sharing the database sees the same threads and memories: a turn started on one daemon can be
continued by another from its last checkpoint. Imported only then (psycopg is an optional extra).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Closer = Callable[[], Awaitable[None]]


async def _pool(url: str, max_size: int) -> Any:
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    # The settings LangGraph's savers expect: autocommit, dict rows, no server-side prepares
    # (safe behind PgBouncer in transaction mode).
    pool = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": None, "row_factory": dict_row},
    )
    await pool.open(wait=True, timeout=30)
    return pool


async def postgres_checkpointer(url: str, max_size: int = 10) -> tuple[Any, Closer]:
    """An ``AsyncPostgresSaver`` with its tables set up, and how to close it."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    pool = await _pool(url, max_size)
    try:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
    except BaseException:
        await pool.close()
        raise
    return saver, pool.close


async def postgres_store(url: str, max_size: int = 4) -> tuple[Any, Closer]:
    """An ``AsyncPostgresStore`` (long-term memory) with its tables set up, and how to close it."""
    from langgraph.store.postgres.aio import AsyncPostgresStore

    pool = await _pool(url, max_size)
    try:
        store = AsyncPostgresStore(pool)
        await store.setup()
    except BaseException:
        await pool.close()
        raise
    return store, pool.close
