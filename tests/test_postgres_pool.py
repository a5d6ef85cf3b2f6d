"""The agent's PostgreSQL pool (agent/postgres.py) asks a connection it hands out whether it still
works only when its idle socket says the server let go of it; a connection whose backend was
terminated is then replaced, not handed to a turn that would fail on it."""

from __future__ import annotations

import psycopg
import pytest

from agent.postgres import _pool


@pytest.mark.usefixtures("pg_server")
async def test_a_terminated_connection_is_replaced_when_taken(pg_url: str) -> None:
    pool = await _pool(pg_url, 1)  # one connection: the pool must replace that one
    try:
        async with pool.connection() as conn:
            row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
            first = row["pid"]
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (first,))
            for _ in range(100):  # until the server has closed it
                cur = await admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (first,))
                if await cur.fetchone() is None:
                    break
        async with pool.connection() as conn:
            row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
            assert row["pid"] != first
        async with pool.connection() as conn:  # a live one is handed out again, and works
            row = await (await conn.execute("SELECT pg_backend_pid() AS pid")).fetchone()
            assert row["pid"] != first
    finally:
        await pool.close()
