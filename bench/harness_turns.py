"""Per-turn overhead of the harness against an instant model (hand-run benchmark).

The fake model runs in a child process so its CPU is not counted. Reports p50/p95 wall time and
the mean CPU time (``time.process_time``: all threads of this process, i.e. including aiosqlite's)
per turn: all turns on one thread (its history grows to 2 x turns messages), round-robin over 20
threads, and every turn on a thread of its own (each needs a checkpoint read to rule out a resume).
``--tools``: the whole runtime with the default tool stack (sandbox, sub-agents, skills, memory,
context) instead of the bare harness. GC is frozen after the warm-up, as the daemon does.

``--long N``: instead, one thread of N turns (issue 27: a long conversation must cost what a short
one does). Reports the CPU per turn averaged over windows of 20 turns (turns 1-20, i.e. "turn ~10",
against the last 20, "turn ~N", and every 100 turns between), and the checkpoint database: stored
bytes (checkpoint, metadata and write payloads) and checkpoint rows of the thread, per turn over the
last window, and the file with its WAL. ``--postgres``: the checkpoints in a throwaway PostgreSQL
server (tests/pg_server.py) instead of the SQLite file.

    python bench/harness_turns.py [--turns 200] [--tools]
    python bench/harness_turns.py --long 1000 [--tools] [--postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's packages first

from agent.config import AgentSettings, ModelSpec
from agent.harness import Final, Harness
from agent.runtime import AgentRuntime
from bench.long_thread import long_thread


async def _turns(
    harness: Harness | AgentRuntime, n: int, threads: int, tag: str
) -> tuple[list[float], float]:
    walls: list[float] = []
    cpu0 = time.process_time()
    for i in range(n):
        t0 = time.perf_counter()
        final = None
        thread, message = f"{tag}-t{i % threads}", f"{tag}-m{i}"
        async for event in harness.run(thread, user_id="u", message_id=message, text=f"hello {i}"):
            final = event
        walls.append(time.perf_counter() - t0)
        assert isinstance(final, Final), final
    return walls, (time.process_time() - cpu0) / n


@contextlib.asynccontextmanager
async def fake_model(*args: str) -> AsyncIterator[str]:
    """The instant fake model (tests/fakes/openai_server.py) in a child process, so that its CPU
    is not counted; yields its base URL. Proxy variables are dropped first: the SDKs would use them."""
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        os.environ.pop(key, None)
    root = Path(__file__).resolve().parents[1]
    fake = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.fakes.openai_server", *args, cwd=root, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert fake.stdout is not None
        yield (await fake.stdout.readline()).decode().strip()
    finally:
        fake.terminate()
        await fake.wait()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--tools", action="store_true", help="the runtime with the default tool stack")
    parser.add_argument("--long", type=int, default=0, help="one thread of this many turns")
    parser.add_argument("--postgres", action="store_true", help="checkpoints in PostgreSQL (--long)")
    args = parser.parse_args()
    if args.long:
        async with fake_model("--summaries") as base_url:
            spec = ModelSpec(model="bench-model", base_url=base_url, api_key="sk-bench")
            await long_thread(spec, args.long, tools=args.tools, postgres=args.postgres)
        return
    async with fake_model() as base_url:
        spec = ModelSpec(model="bench-model", base_url=base_url, api_key="sk-bench")
        with tempfile.TemporaryDirectory() as tmp:
            harness: Harness | AgentRuntime
            if args.tools:
                os.chmod(tmp, 0o755)  # the sandbox user must reach its directories
                harness = AgentRuntime(AgentSettings(), spec, Path(tmp))
            else:
                harness = Harness(AgentSettings(), spec, Path(tmp) / "checkpoints.sqlite")
            await harness.start()
            try:
                await _turns(harness, 20, 20, "warm")  # imports, connection pool, caches
                gc.collect()
                gc.freeze()  # as gateway/daemon/app.py does after start-up
                gc.set_threshold(20_000, 20, 50)
                scenarios = (("one thread", 1), ("20 threads", 20), ("fresh threads", args.turns))
                for n, (label, threads) in enumerate(scenarios):
                    walls, cpu = await _turns(harness, args.turns, threads, f"s{n}")
                    walls.sort()
                    p50 = statistics.median(walls) * 1000
                    p95 = walls[int(len(walls) * 0.95) - 1] * 1000
                    print(
                        f"{label:13s} {args.turns} turns: wall p50 {p50:.2f} ms, p95 {p95:.2f} ms, "
                        f"CPU {cpu * 1000:.2f} ms/turn"
                    )
            finally:
                await harness.close()


if __name__ == "__main__":
    asyncio.run(main())
