"""Per-turn overhead of the harness against an instant model (hand-run benchmark).

The fake model runs in a child process so its CPU is not counted. Reports p50/p95 wall time and
the mean CPU time (``time.process_time``: all threads of this process, i.e. including aiosqlite's)
per turn, for turns on one growing thread and for turns spread over many threads.

    python bench/harness_turns.py [--turns 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent.config import AgentSettings, ModelSpec
from agent.harness import Final, Harness


async def _turns(harness: Harness, n: int, threads: int) -> tuple[list[float], float]:
    walls: list[float] = []
    cpu0 = time.process_time()
    for i in range(n):
        t0 = time.perf_counter()
        final = None
        async for event in harness.run(f"t{i % threads}", user_id="u", message_id=f"m{i}", text=f"hello {i}"):
            final = event
        walls.append(time.perf_counter() - t0)
        assert isinstance(final, Final), final
    return walls, (time.process_time() - cpu0) / n


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        os.environ.pop(key, None)
    root = Path(__file__).resolve().parents[1]
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.openai_server"], cwd=root, stdout=subprocess.PIPE, text=True
    )
    try:
        base_url = fake.stdout.readline().strip()  # type: ignore[union-attr]
        spec = ModelSpec(model="bench-model", base_url=base_url, api_key="sk-bench")
        with tempfile.TemporaryDirectory() as tmp:
            harness = Harness(AgentSettings(), spec, Path(tmp) / "checkpoints.sqlite")
            await harness.start()
            try:
                await _turns(harness, 20, 20)  # warm-up: imports, connection pool, caches
                for label, threads in (("one thread", 1), ("many threads", args.turns)):
                    walls, cpu = await _turns(harness, args.turns, threads)
                    walls.sort()
                    p50 = statistics.median(walls) * 1000
                    p95 = walls[int(len(walls) * 0.95) - 1] * 1000
                    print(f"{label:13s} {args.turns} turns: wall p50 {p50:.2f} ms, p95 {p95:.2f} ms, "
                          f"CPU {cpu * 1000:.2f} ms/turn")
            finally:
                await harness.close()
    finally:
        fake.terminate()
        fake.wait()


if __name__ == "__main__":
    asyncio.run(main())
