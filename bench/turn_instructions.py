"""Instructions per turn, counted by valgrind, for when the machine is too noisy for CPU times.

    python bench/turn_instructions.py                       # sdk, harness, runtime
    python bench/turn_instructions.py --modes runtime --plain-hooks
    python bench/turn_instructions.py --low 20 --high 120 --jobs 2

CPU time on a shared 2-core VM moves by ±30 % from one minute to the next, which hides changes of
a few percent. An instruction count does not move: each mode runs twice in a child interpreter under
``valgrind --tool=callgrind`` (the fake model is a grandchild, not counted), once with ``--low``
and once with ``--high`` turns after the same 40 warm-up turns, and the difference divided by the
extra turns is what one turn costs, start-up and warm-up cancelling out. A count is not a time
(a cache miss costs more than an add), so compare counts with counts, in one run.

Modes, each one turn = one short question and its answer over 20 threads, as ``library_floor.py``:

- ``sdk``: ``AsyncOpenAI.chat.completions.create``, the relay's model call (the reference).
- ``harness``: Chital's harness with ``agent.tools: false``.
- ``runtime``: the default stack (tools on).

``--plain-hooks`` puts back LangSmith's ``traceable`` around every middleware hook (what
``agent/tuning.py`` removes while tracing is off), to show what that costs.
Needs valgrind (``apt-get install valgrind``); about a minute per child, ``--jobs`` at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("sdk", "harness", "runtime")
WARM = 40


async def child(mode: str, turns: int, plain_hooks: bool) -> None:
    """The measured process: warm up, then ``turns`` turns."""
    sys.path.insert(0, str(ROOT))
    import compat.lean_imports

    compat.lean_imports.install()  # as the daemon's entry point does first
    from agent import tuning
    from bench.harness_turns import fake_model

    tuning.apply()
    if plain_hooks:
        from langchain.agents import factory
        from langsmith import traceable

        factory.traceable = traceable
    async with fake_model() as base_url:
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)  # the sandbox user must reach its directories
            if mode == "sdk":
                import openai

                client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)

                async def turn(thread: str, i: int) -> None:
                    await client.chat.completions.create(
                        model="bench-model", messages=[{"role": "user", "content": f"hello {i}"}]
                    )

                close = client.close
            else:
                from agent.config import AgentSettings, ModelSpec
                from agent.runtime import AgentRuntime

                spec = ModelSpec(model="bench-model", base_url=base_url, api_key="sk-bench")
                runtime = AgentRuntime(AgentSettings(tools=mode == "runtime"), spec, Path(tmp))
                await runtime.start()

                async def turn(thread: str, i: int) -> None:
                    async for _ in runtime.run(
                        thread, user_id="u", message_id=f"{thread}-m{i}", text=f"hello {i}"
                    ):
                        pass

                close = runtime.close
            for i in range(WARM):
                await turn(f"warm-{i % 20}", i)
            gc.collect()
            gc.freeze()
            gc.set_threshold(20_000, 20, 50)  # as the daemon runs (gateway/daemon/app.py)
            for i in range(turns):
                await turn(f"t{i % 20}", i)
            await close()


def count(mode: str, turns: int, plain_hooks: bool) -> int:
    """Instructions of one child run (valgrind's "Collected")."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={tmp}/cg.out",
            sys.executable,
            __file__,
            "--child",
            mode,
            "--turns",
            str(turns),
        ] + (["--plain-hooks"] if plain_hooks else [])
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"{mode} x{turns} failed:\n{done.stderr[-3000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--low", type=int, default=20)
    ap.add_argument("--high", type=int, default=120)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--plain-hooks", action="store_true", help="keep LangSmith's wrapper on every hook")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--turns", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        asyncio.run(child(args.child, args.turns, args.plain_hooks))
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        sys.exit(f"unknown modes: {', '.join(sorted(unknown))}")
    runs = [(m, n) for m in modes for n in (args.low, args.high)]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(runs, pool.map(lambda r: count(r[0], r[1], args.plain_hooks), runs), strict=True))
    hooks = " (LangSmith's wrapper on every hook)" if args.plain_hooks else ""
    print(f"instructions per turn, ({args.high} - {args.low} turns) under callgrind{hooks}")
    print(f"{'mode':<10} {'M instr/turn':>13} {'x sdk':>7}")
    sdk = None
    for mode in modes:
        per_turn = (counts[(mode, args.high)] - counts[(mode, args.low)]) / (args.high - args.low) / 1e6
        sdk = per_turn if mode == "sdk" else sdk
        ratio = f"{per_turn / sdk:7.2f}" if sdk else ""
        print(f"{mode:<10} {per_turn:13.2f} {ratio}")


if __name__ == "__main__":
    main()
