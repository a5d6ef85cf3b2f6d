"""Instructions per Telegram DM, daemon beside relay, counted by valgrind (run by hand).

    python bench/telegram_instructions.py                    # 20 chats x 10, tools on
    python bench/telegram_instructions.py --chats 10 --messages 4 --bare

``bench_telegram.py``'s figures are CPU times, which move by ±30 % on a shared 2-core VM. This
runs the same two processes, the bare relay (``relay_telegram.py``) and ``chital run`` with
Telegram alone, each under ``valgrind --tool=callgrind --instr-atstart=no`` on its own fake
Telegram and fake model (in this process, not counted). After a warm-up (imports, connections,
the first turns) counting is switched on with ``callgrind_control -i on``, ``--chats`` closed-loop
users send ``--messages`` DMs each, counting is switched off, and the instructions counted divided
by the DMs answered is the figure: the same work as ``bench_telegram.py``'s many-chats phase,
with no noise. An instruction count is not a time (a cache miss costs more than an add; the
daemon's larger working set misses more), so the CPU-time ratio of ``bench_telegram.py`` runs a
little higher than this one. Under valgrind everything runs ~50x slower: both processes start in
about a minute, a DM takes ~0.5 s. Needs valgrind (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_telegram import daemon_config, load, one_exchange, relay_argv
from tests.daemon import REPO, DaemonProcess
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

HERE = Path(__file__).resolve().parent
SLOW = 600.0  # seconds a DM may take under valgrind with every chat waiting its turn


async def callgrind(pid: int, switch: str) -> None:
    done = await asyncio.create_subprocess_exec(
        "callgrind_control",
        "-i",
        switch,
        str(pid),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    if await done.wait() != 0:
        raise RuntimeError(f"callgrind_control -i {switch} {pid} failed")


async def measure(name: str, argv: list[str], tg: FakeTelegram, args: argparse.Namespace, cwd: Path) -> float:
    """M instructions per DM of ``argv`` run under callgrind; counted only during the load. Prints
    the Bot API calls per DM of the load: time-based work (the typing indicator 0.3 s into a turn,
    ``gateway/turns/runner.py``) happens on every DM under valgrind's slowness, on few at native
    speed."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        proc = await asyncio.create_subprocess_exec(
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={tmp}/cg.out",
            *argv,
            cwd=str(cwd),
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        t0 = time.monotonic()
        await one_exchange(tg, 1, "ready?", quoted=False, timeout=SLOW)  # once it has started (slowly)
        await load(tg, min(args.chats, 5), 2, 10, quoted=False, timeout=SLOW)  # first turns, pools
        print(f"{name}: started and warmed up in {time.monotonic() - t0:.0f} s", flush=True)
        await callgrind(proc.pid, "on")
        t0, calls = time.monotonic(), len(tg.calls)
        await load(tg, args.chats, args.messages, 1000, quoted=False, timeout=SLOW)
        await callgrind(proc.pid, "off")
        wall = time.monotonic() - t0
        methods = collections.Counter(c.method for c in tg.calls[calls:])
        proc.terminate()
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode(errors="replace")
        await proc.wait()
    found = re.search(r"Collected\s*:\s*(\d+)", err)
    if not found:
        raise RuntimeError(f"{name}: no count from valgrind:\n{err[-3000:]}")
    dms = args.chats * args.messages
    per_dm = ", ".join(f"{m} {n / dms:.2f}" for m, n in methods.most_common())
    print(f"{name}: {dms} DMs counted in {wall:.0f} s; Bot API calls per DM: {per_dm}", flush=True)
    return int(found.group(1)) / dms / 1e6


async def relay(args: argparse.Namespace) -> float:
    tg, model = FakeTelegram(), FakeOpenAI(record=False)
    await tg.start()
    await model.start()
    try:
        return await measure("relay", relay_argv(tg, model), tg, args, HERE)
    finally:
        await model.aclose()
        await tg.stop()


async def chital(args: argparse.Namespace) -> float:
    tg, model = FakeTelegram(), FakeOpenAI(record=False)
    await tg.start()
    await model.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = daemon_config(Path(tmp) / "data", tg, model, tools=not args.bare)
            cfg["agent"]["model_timeout"] = SLOW
            # As at native speed: an instant answer goes out whole, not as a message and its edits,
            # and no DM waits for a turn slot long enough to get a "queued" sign (then edited).
            cfg["delivery"] = {"first_edit_delay": SLOW}
            cfg["concurrency"]["max_turns"] = 32
            daemon = DaemonProcess(Path(tmp), cfg)
            daemon.write_config()
            argv = [sys.executable, "-m", "gateway.cli.main", "run", "-c", str(daemon.config_path)]
            return await measure("chital", argv, tg, args, REPO)
    finally:
        await model.aclose()
        await tg.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chats", type=int, default=20)
    ap.add_argument("--messages", type=int, default=10)
    ap.add_argument("--bare", action="store_true", help="agent.tools: false")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    ref, ours = await asyncio.gather(relay(args), chital(args))
    tools = "off" if args.bare else "on"
    print(f"instructions per DM, {args.chats} chats x {args.messages}, tools {tools}, under callgrind")
    print(f"relay   {ref:8.2f} M")
    print(f"chital  {ours:8.2f} M   {ours / ref:.2f}x the relay")


if __name__ == "__main__":
    asyncio.run(main())
