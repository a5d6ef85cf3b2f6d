"""One thread of many turns (``bench/harness_turns.py --long N``): does a long conversation cost
what a short one does? (issue 27, item 6.)

CPU per turn is ``time.process_time`` (all threads of this process; the fake model runs in a child
process) averaged over windows of 20 turns. Storage is read from the checkpoint tables after each
window: the payload bytes stored (SQLite: checkpoint + metadata + write values; PostgreSQL: the same
plus ``checkpoint_blobs``) and the thread's checkpoint rows; "per turn" is the growth over the
window divided by its turns, so a bounded store shows ~0 once pruning runs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from agent.config import AgentSettings, ModelSpec
from agent.harness import Final, Harness
from agent.runtime import AgentRuntime

WINDOW = 20


@contextlib.contextmanager
def _postgres() -> Iterator[str]:
    from tests.pg_server import postgres_server

    with postgres_server() as server:
        yield server.create_db("bench_long")


class _Store:
    """Reads what the thread holds in the checkpoint database."""

    def __init__(self, sqlite_path: Path | None, url: str | None) -> None:
        self.sqlite_path, self.url = sqlite_path, url

    def _sqlite(self, thread: str) -> tuple[int, int]:
        assert self.sqlite_path is not None
        conn = sqlite3.connect(str(self.sqlite_path))
        try:
            cps = conn.execute(
                "SELECT count(*), coalesce(sum(length(checkpoint) + length(metadata)), 0)"
                " FROM checkpoints WHERE thread_id = ?",
                (thread,),
            ).fetchone()
            writes = conn.execute(
                "SELECT coalesce(sum(length(value)), 0) FROM writes WHERE thread_id = ?", (thread,)
            ).fetchone()
            return int(cps[0]), int(cps[1]) + int(writes[0])
        finally:
            conn.close()

    async def _pg(self, thread: str) -> tuple[int, int]:
        import psycopg

        assert self.url is not None
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT count(*), coalesce(sum(pg_column_size(checkpoint) + pg_column_size(metadata)), 0)"
                " FROM checkpoints WHERE thread_id = %s",
                (thread,),
            )
            cps = await cur.fetchone()
            cur = await conn.execute(
                "SELECT coalesce(sum(length(blob)), 0) FROM checkpoint_writes WHERE thread_id = %s", (thread,)
            )
            writes = await cur.fetchone()
            cur = await conn.execute(
                "SELECT coalesce(sum(length(blob)), 0) FROM checkpoint_blobs WHERE thread_id = %s", (thread,)
            )
            blobs = await cur.fetchone()
            assert cps is not None and writes is not None and blobs is not None
            return int(cps[0]), int(cps[1]) + int(writes[0]) + int(blobs[0])

    async def measure(self, thread: str) -> tuple[int, int]:
        """(checkpoint rows, payload bytes) of ``thread``."""
        return self._sqlite(thread) if self.url is None else await self._pg(thread)

    def file_bytes(self) -> int:
        if self.sqlite_path is None:
            return 0
        return sum(
            p.stat().st_size for p in (self.sqlite_path, Path(f"{self.sqlite_path}-wal")) if p.exists()
        )


@contextlib.asynccontextmanager
async def _harness(spec: ModelSpec, tools: bool, url: str | None) -> AsyncIterator[tuple[Any, _Store]]:
    with tempfile.TemporaryDirectory() as tmp:
        harness: Harness | AgentRuntime
        path = Path(tmp) / "checkpoints.sqlite"
        if tools:
            os.chmod(tmp, 0o755)  # the sandbox user must reach its directories
            harness = AgentRuntime(AgentSettings(), spec, Path(tmp), database_url=url)
        else:
            harness = Harness(AgentSettings(), spec, path, checkpoint_url=url)
        await harness.start()
        try:
            yield harness, _Store(None if url else path, url)
        finally:
            await harness.close()


async def long_thread(spec: ModelSpec, turns: int, *, tools: bool, postgres: bool) -> None:
    """Run ``turns`` turns on one thread and print the windows (see the module docstring)."""
    with _postgres() if postgres else contextlib.nullcontext(None) as url:
        async with _harness(spec, tools, url) as (harness, store):
            for i in range(20):  # warm-up on threads of their own: imports, caches
                async for _ in harness.run(f"warm-{i}", user_id="u", message_id=f"w{i}", text="hi"):
                    pass
            gc.collect()
            gc.freeze()  # as gateway/daemon/app.py does after start-up
            gc.set_threshold(20_000, 20, 50)
            thread = "long"
            rows: list[tuple[int, float, int, int]] = []
            cpu0 = time.process_time()
            before = await store.measure(thread)
            for i in range(1, turns + 1):
                final = None
                async for event in harness.run(thread, user_id="u", message_id=f"m{i}", text=f"hello {i}"):
                    final = event
                assert isinstance(final, Final), final
                if i % WINDOW == 0 or i == turns:
                    cpu = time.process_time() - cpu0
                    count, size = await store.measure(thread)  # not counted in the window's CPU
                    n = (i - 1) % WINDOW + 1
                    rows.append((i, cpu / n, count, size - before[1]))
                    before = (count, size)
                    cpu0 = time.process_time()
            state = await harness.message_count(thread)
            file_mb = store.file_bytes() / 1e6
    where = "PostgreSQL" if postgres else "SQLite"
    print(f"one thread, {turns} turns ({'tools' if tools else 'bare harness'}, {where} checkpoints)")
    print("turns        CPU ms/turn  checkpoint rows  stored KB  stored bytes/turn")
    stored = 0
    for i, cpu, count, grown in rows:
        stored += grown
        if i == WINDOW or i % 100 == 0 or i == turns:
            n = (i - 1) % WINDOW + 1
            print(
                f"{i - n + 1:4d}-{i:<6d}  {cpu * 1000:9.2f}  {count:15d}  {stored / 1000:9.1f}  {grown / n:15.0f}"
            )
    first, last = rows[0], rows[-1]
    print(
        f"CPU per turn: turns 1-{WINDOW} {first[1] * 1000:.2f} ms, last {WINDOW} {last[1] * 1000:.2f} ms"
        f" ({last[1] / first[1]:.2f}x)"
    )
    total = sum(r[3] for r in rows)
    peak = max(sum(r[3] for r in rows[: k + 1]) for k in range(len(rows)))
    print(
        f"checkpoint storage: {last[2]} checkpoint rows, {total / 1000:.1f} KB stored at the end"
        f" (at most {peak / 1000:.1f} KB after a window),"
        f" {total / turns:.0f} bytes/turn on average,"
        f" {last[3] / ((turns - 1) % WINDOW + 1):.0f} bytes/turn over the last window"
        + (f", file with WAL {file_mb:.2f} MB" if not postgres else "")
        + f"; messages in state {state}"
    )
