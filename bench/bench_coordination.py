"""What the cluster's coordination costs as daemons and open entries grow: N simulated daemons on
one PostgreSQL database, each holding M open journal entries, running the real heartbeat and sweep.

    python bench/bench_coordination.py                       # N = 1, 3, 10, 30; M = 50
    python bench/bench_coordination.py --daemons 1,10,30 --open 20,200 --ticks 20

Each participant is the real code of a daemon's cluster (gateway/daemon/cluster.py: ``Leases`` and
``Cluster`` over a ``Store`` on its own connection, the heartbeat on another, as in ``chital run``)
with a stand-in for the gateway that works on its M entries. The journal holds N x M open entries
(each participant's, leased, as while every daemon is busy) and ten finished ones per open one (the
history retention keeps). Then, tick by tick, every participant runs one heartbeat
(:meth:`Cluster.renew_once`) and one sweep (:meth:`Cluster.sweep_once`), one after the other.

Printed per (N, M), per call of one daemon: statements, the daemon's CPU (this process, the calls
run one at a time), PostgreSQL's CPU (the server's processes, over the whole phase, divided by the
calls) and the buffers the statements touched (``pg_stat_statements``: noise-free, it shows a scan
that grows). Flat columns down a table mean a daemon's cost does not grow with the number of
daemons or with what the others hold; the cluster's total is then N times one daemon's.

What the simulation leaves out: the leader's ``SELECT 1`` or lock try (one statement every 2 s per
daemon, whatever N and M), the timers (one owner) and the turns themselves (bench_scale_out.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_scale_out import _pg_cpu, _sql
from gateway.daemon.cluster import Cluster, Leases
from gateway.store.db import PgConnection
from gateway.store.entries import JournalEntry
from gateway.store.journal import Store
from tests.pg_server import postgres_server

PHASE: contextvars.ContextVar[str] = contextvars.ContextVar("phase", default="other")
COUNTS: Counter[str] = Counter()
_execute = PgConnection.execute


def _counted(self: PgConnection, sql: str, params: Sequence[Any] = ()) -> Any:
    COUNTS[PHASE.get()] += 1
    return _execute(self, sql, params)


class _Parking:
    def is_parked(self, key: str) -> bool:
        return False


class Work:
    """A daemon's gateway as the cluster's loops see it: one connected channel, and its M entries
    under way."""

    def __init__(self, keys: set[str]) -> None:
        self.keys = keys
        self.channels: Mapping[str, Any] = {"slack": object()}
        self.parking = _Parking()

    def claimed(self) -> set[str]:
        return set(self.keys)

    def cut(self, keys: set[str]) -> int:
        return 0

    def connected(self, platform: str) -> bool:
        return platform == "slack"

    def handles(self, key: str) -> bool:
        return key in self.keys

    def pick_up(self, entry: JournalEntry) -> bool:
        return False


async def _fill(url: str, nodes: list[str], open_each: int, history: int, ttl: float) -> dict[str, set[str]]:
    """The journal: ``open_each`` open entries leased to each node, ``history`` finished per open one."""
    import psycopg

    now = time.time()
    held: dict[str, set[str]] = {n: set() for n in nodes}
    rows = []
    for node in nodes:
        for i in range(open_each):
            key = f"slack:C{node}:{i}"
            held[node].add(key)
            rows.append((key, f"slack:C{node}{i % 10}", "turn", "{}", "running", now, now, node, now + ttl))
            for h in range(history):
                rows.append(
                    (f"{key}:h{h}", f"slack:C{node}{i % 10}", "turn", "{}", "done", now, now, None, None)
                )
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO journal(key, conversation, kind, payload, state, created, updated, lease_owner,"
            " lease_until) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )
        await cur.execute("ANALYZE journal")
    return held


async def _phase(
    name: str, clusters: list[Cluster], ticks: int, url: str, pg: Any
) -> tuple[float, float, float, float]:
    """Per call of one daemon: statements, daemon CPU µs, PostgreSQL CPU µs, buffers touched."""
    await _sql(url, "SELECT pg_stat_statements_reset()")
    COUNTS.clear()
    cpu = 0.0
    token = PHASE.set(name)
    pg0 = _pg_cpu(pg)
    try:
        for _ in range(ticks):
            for c in clusters:
                t0 = time.process_time()
                await (c.renew_once() if name == "heartbeat" else c.sweep_once())
                cpu += time.process_time() - t0
    finally:
        PHASE.reset(token)
    db_cpu = _pg_cpu(pg) - pg0
    calls = ticks * len(clusters)
    rows = await _sql(
        url,
        "SELECT COALESCE(SUM(shared_blks_hit + shared_blks_read), 0) FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND query NOT LIKE '%pg_stat_statements%'",
    )
    return COUNTS[name] / calls, cpu / calls * 1e6, db_cpu / calls * 1e6, float(rows[0][0]) / calls


async def run(n: int, m: int, args: argparse.Namespace, pg: Any) -> dict[str, tuple[float, ...]]:
    url = pg.create_db(f"coord_{n}_{m}_{uuid.uuid4().hex[:6]}")
    await _sql(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    first = await Store.open_postgres(url)  # migrates the schema
    await first.close()
    nodes = [f"n{i:02d}{uuid.uuid4().hex[:4]}" for i in range(n)]
    held = await _fill(url, nodes, m, args.history, 3600.0)
    clusters: list[Cluster] = []
    try:
        for node in nodes:
            store = await Store.open_postgres(url)
            leases = Leases(store, ttl=3600.0, node=node)
            clusters.append(Cluster(leases, Work(held[node]), url))
        for c in clusters:  # warm: connections made, statements prepared
            for _ in range(6):
                await c.renew_once()
                await c.sweep_once()
        return {
            "heartbeat": await _phase("heartbeat", clusters, args.ticks, url, pg),
            "sweep": await _phase("sweep", clusters, args.ticks, url, pg),
        }
    finally:
        for c in clusters:
            if c._beat is not None:
                await c._beat.close()
            await c.store.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemons", default="1,3,10,30")
    ap.add_argument("--open", default="50", help="open entries each daemon holds (comma-separated)")
    ap.add_argument("--history", type=int, default=10, help="finished entries per open one")
    ap.add_argument("--ticks", type=int, default=10)
    args = ap.parse_args()
    PgConnection.execute = _counted  # type: ignore[method-assign]
    results = []
    with postgres_server(("shared_preload_libraries = 'pg_stat_statements'",)) as pg:
        for m in (int(x) for x in args.open.split(",")):
            for n in (int(x) for x in args.daemons.split(",")):
                results.append((n, m, await run(n, m, args, pg)))
    print(f"\n== per call of one daemon; {args.ticks} ticks, {args.history} finished entries per open one ==")
    head = "stmts  daemon µs  postgres µs  buffers"
    print(f"{'daemons':>7} {'open each':>9} {'open all':>8} | heartbeat: {head} | sweep: {head}")
    for n, m, r in results:
        cells = " | ".join(
            f"{' ' * len(p) + '  '}{s:5.1f} {d:10.0f} {c:12.0f} {b:8.1f}" for p, (s, d, c, b) in r.items()
        )
        print(f"{n:>7} {m:>9} {n * m:>8} | {cells}")


if __name__ == "__main__":
    asyncio.run(main())
