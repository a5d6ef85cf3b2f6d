"""What one PostgreSQL round trip costs the daemon's process, beside what a SQLite statement costs.

    python bench/pg_round_trip.py            # 3,000 statements of each kind

The floor under "one PostgreSQL daemon within 1.25x of one SQLite daemon" (docs/scale-out.md, "What
coordination costs"): a statement on SQLite is a call into a library in the process; on PostgreSQL
it is a round trip through the kernel to a server process and back, whatever the driver. Printed,
in one run on one throw-away cluster (tests/pg_server.py), CPU microseconds of this process per
statement (user + system): SQLite in memory; psycopg's async connection (the daemon's), its sync
one, three statements per pipeline; asyncpg when it is importable (not a dependency: the
comparison says whether another driver would move the floor). The server's own CPU is not in
these figures (bench_scale_out.py reports it beside the daemons').
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.pg_server import postgres_server

READ = "SELECT v FROM t WHERE k = %s"
WRITE = "INSERT INTO t(k, v) VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def per_call(n: int, fn: Callable[[], object]) -> float:
    for _ in range(50):
        fn()
    t0 = cpu()
    for _ in range(n):
        fn()
    return 1e6 * (cpu() - t0) / n


async def per_call_async(n: int, fn: Callable[[], Awaitable[object]], each: int = 1) -> float:
    for _ in range(50):
        await fn()
    t0 = cpu()
    for _ in range(n // each):
        await fn()
    return 1e6 * (cpu() - t0) / n


def sqlite_figures(n: int) -> dict[str, float]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t(k TEXT PRIMARY KEY, v INT)")
    read, write = READ.replace("%s", "?"), WRITE.replace("%s", "?")
    return {
        "sqlite read": per_call(n, lambda: db.execute(read, ("a",)).fetchall()),
        "sqlite upsert": per_call(n, lambda: db.execute(write, ("a", 1))),
    }


async def psycopg_figures(url: str, n: int) -> dict[str, float]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await conn.execute("CREATE TABLE IF NOT EXISTS t(k TEXT PRIMARY KEY, v INT)")

    async def read() -> object:
        return await (await conn.execute(READ, ("a",))).fetchall()

    async def three() -> None:
        async with conn.pipeline():
            for _ in range(3):
                await conn.execute(READ, ("a",))

    out = {
        "psycopg async read": await per_call_async(n, read),
        "psycopg async upsert": await per_call_async(n, lambda: conn.execute(WRITE, ("a", 1))),
        "psycopg async read, 3 per pipeline": await per_call_async(n, three, each=3),
    }
    await conn.close()
    sync = psycopg.connect(url, autocommit=True)
    out["psycopg sync read"] = per_call(n, lambda: sync.execute(READ, ("a",)).fetchall())
    sync.close()
    return out


async def asyncpg_figures(url: str, n: int) -> dict[str, float]:
    try:
        import asyncpg  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return {}
    conn = await asyncpg.connect(url)
    read = READ.replace("%s", "$1")
    out = {"asyncpg read": await per_call_async(n, lambda: conn.fetch(read, "a"))}
    await conn.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=3000)
    args = ap.parse_args()
    figures = sqlite_figures(args.n)
    with postgres_server() as server:
        url = server.url()
        figures |= asyncio.run(psycopg_figures(url, args.n))
        figures |= asyncio.run(asyncpg_figures(url, args.n))
    for name, us in figures.items():
        print(f"{name:38s} {us:7.1f} us CPU per statement")


if __name__ == "__main__":
    main()
