"""The gateway's SQLite connection runs its statements on the event loop (gateway/store/db.py
``SqliteConnection``). What that must not cost: another process holding the write lock (``chital
send``, ``chital pairing approve``) never stalls the loop, and a write waits it out for as long as it
did on aiosqlite's thread (5 s); long work runs on a thread while the other statements wait; a write
is on disk when its ``await`` returns."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, closing, contextmanager
from pathlib import Path

import pytest

from agent.usage import TokenUsage
from channels.base import Inbound
from gateway.config.sections import UsageConfig
from gateway.ops.metrics import Metrics
from gateway.store.db import SqliteConnection
from gateway.store.journal import Store
from gateway.turns.usage import UsageRecorder
from tests.fakes.gateway_rig import TEST_POSTGRES, skip_on_postgres, store_at

sqlite_only = skip_on_postgres("the SQLite connection itself")

HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO pairing(code, user, name, created) VALUES ('HOLDER', 'other:1', 'x', 0)")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@contextmanager
def write_lock_held(path: Path, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """Another process that holds the database's write lock for ``seconds`` (as a CLI command
    writing would), then commits its own row."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        proc.wait(timeout=30)


@asynccontextmanager
async def loop_watch() -> AsyncIterator[list[float]]:
    """The gaps between ticks of a task that wakes every millisecond: the longest one is how long
    the loop was held."""
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    gaps.clear()
    try:
        yield gaps
    finally:
        await asyncio.sleep(0.01)
        task.cancel()


def inbound(i: int) -> Inbound:
    return Inbound("telegram", "42", str(i), "42", f"message {i}", True, True)


def rows(path: Path, sql: str) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


@sqlite_only
async def test_a_write_waits_out_another_process_lock_while_the_loop_runs(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sqlite"
    store = await Store.open(path, reserve_bytes=0)
    try:
        with write_lock_held(path, 0.8):
            async with loop_watch() as gaps:
                started = time.monotonic()
                assert await store.journal_add(inbound(1), "turn")
                waited = time.monotonic() - started
        assert waited >= 0.5  # it did wait for the other process's commit…
        assert max(gaps) < 0.2  # …without holding the loop (SQLite itself waits 2 ms at most)
        # Both writes are there: the other process's, and ours, readable by anyone at once.
        assert rows(path, "SELECT code FROM pairing") == [("HOLDER",)]
        assert rows(path, "SELECT key, state FROM journal") == [(inbound(1).key, "pending")]
    finally:
        await store.close()


@sqlite_only
async def test_a_lock_held_past_the_wait_fails_the_statement_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sqlite"
    await (await Store.open(path, reserve_bytes=0)).close()
    db = await SqliteConnection.connect(path, busy_wait=0.3)
    try:
        with write_lock_held(path, 2.0):
            started = time.monotonic()
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                await db.execute("INSERT INTO threads(conversation, thread_id, created) VALUES ('c', 't', 1)")
            assert 0.25 <= time.monotonic() - started < 1.5
        await db.execute("INSERT INTO threads(conversation, thread_id, created) VALUES ('c', 't', 1)")
        assert rows(path, "SELECT conversation FROM threads") == [("c",)]
    finally:
        await db.close()


@sqlite_only
async def test_statements_wait_for_work_on_the_thread_even_when_its_caller_gives_up(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sqlite"
    await (await Store.open(path, reserve_bytes=0)).close()
    db = await SqliteConnection.connect(path)
    order: list[str] = []

    def slow(conn: sqlite3.Connection) -> None:
        time.sleep(0.3)
        conn.execute("INSERT INTO threads(conversation, thread_id, created) VALUES ('slow', 't', 1)")
        order.append("slow")

    try:
        async with loop_watch() as gaps:
            runner = asyncio.create_task(db.run(slow))
            await asyncio.sleep(0.05)
            runner.cancel()  # the thread cannot be stopped: the others must still wait for it
            await db.execute("INSERT INTO threads(conversation, thread_id, created) VALUES ('fast', 't', 2)")
            order.append("fast")
        assert order == ["slow", "fast"]
        assert max(gaps) < 0.2
        with db.on_thread():  # a task's statements on the thread, the same API
            async with db.execute("SELECT conversation FROM threads ORDER BY created") as cur:
                assert await cur.fetchall() == [("slow",), ("fast",)]
    finally:
        await db.close()


@sqlite_only
async def test_the_cursor_is_complete_when_handed_out(tmp_path: Path) -> None:
    db = await SqliteConnection.connect(tmp_path / "x.sqlite")
    try:
        await db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
        await db.executemany("INSERT INTO t(k, v) VALUES (?, ?)", [(1, "a"), (2, "b"), (3, "c")])
        async with db.execute("UPDATE t SET v = v || '!' WHERE k >= ? RETURNING k", (2,)) as cur:
            assert cur.rowcount == 2 and sorted(await cur.fetchall()) == [(2,), (3,)]
        cur = await db.execute("SELECT k, v FROM t ORDER BY k")
        assert [d[0] for d in cur.description] == ["k", "v"]
        assert await cur.fetchone() == (1, "a") and await cur.fetchone() == (2, "b!")
        assert await cur.fetchall() == [(3, "c!")] and await cur.fetchone() is None
        # Autocommit: another connection sees every write as soon as its await returned.
        assert rows(tmp_path / "x.sqlite", "SELECT COUNT(*) FROM t") == [(3,)]
        with pytest.raises(sqlite3.IntegrityError):  # a failed batch leaves nothing behind
            await db.executemany("INSERT INTO t(k, v) VALUES (?, ?)", [(4, "d"), (1, "dup")])
        assert rows(tmp_path / "x.sqlite", "SELECT COUNT(*) FROM t") == [(3,)] and not db.in_transaction
    finally:
        await db.close()


@sqlite_only
async def test_pruning_a_large_journal_does_not_hold_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sqlite"
    await (await Store.open(path, reserve_bytes=0)).close()
    old = time.time() - 100 * 86_400
    with closing(sqlite3.connect(path)) as conn:
        conn.executemany(
            "INSERT INTO journal(key, conversation, kind, payload, state, created, updated)"
            " VALUES (?, 'telegram:42', 'turn', ?, 'done', ?, ?)",
            ((f"telegram:42:{i}", "x" * 300, old, old) for i in range(20_000)),
        )
        conn.executemany("INSERT INTO outbox(key, part, message_id) VALUES (?, 0, ?)",
                         ((f"telegram:42:{i}", str(i)) for i in range(20_000)))  # fmt: skip
        conn.commit()
    store = await Store.open(path, reserve_bytes=0)
    try:
        async with loop_watch() as gaps:
            counts = await store.journal_counts()
            assert await store.journal_prune(30 * 86_400) == 20_000
        assert counts == {"done": 20_000}
        assert max(gaps) < 0.04  # inline, a 2,000-key batch held it 60-100 ms
        assert rows(path, "SELECT COUNT(*) FROM outbox") == [(0,)]
    finally:
        await store.close()


async def test_usage_of_calls_ending_together_is_one_transaction(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "gateway.sqlite")
    statements: list[str] = []
    if not TEST_POSTGRES:
        store._db.raw.set_trace_callback(statements.append)
    recorder = UsageRecorder(store, Metrics(), UsageConfig())
    try:
        for i in range(5):  # five model calls ending in the same loop pass (twenty chats at once)
            recorder.record(TokenUsage("default", "lead", "telegram:7", "", "", 100 + i, 10))
        recorder.record(TokenUsage("other", "title", "telegram:8", "", "", 5, 1))
        await recorder.close()
        recorder.record(
            TokenUsage("default", "lead", "telegram:7", "", "", 1000, 0)
        )  # after close: counted only
        await asyncio.sleep(0.05)
        assert await store.usage_on("telegram:7", UsageConfig().today()) == 510 + 50
        assert await store.usage_on("telegram:8", UsageConfig().today()) == 6
        if not TEST_POSTGRES:
            writes = [s for s in statements if s.startswith(("INSERT", "BEGIN", "COMMIT"))]
            assert [w.split()[0] for w in writes] == ["BEGIN", *["INSERT"] * 6, "COMMIT"]
    finally:
        await store.close()
