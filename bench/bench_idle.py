"""Resident memory of an idle daemon, by the channels it runs (each against its fake server).

    python bench/bench_idle.py                               # telegram alone, then all four
    python bench/bench_idle.py --sets telegram,slack --bare  # agent.tools: false
    python bench/bench_idle.py --env MALLOC_ARENA_MAX=2      # a variable for the daemon

Per set of channels: a fresh ``chital run`` (tools on unless ``--bare``), RSS once every channel
is connected, then after one DM per channel has been answered (the agent built, the first
conversation's checkpoint and memory written) and ``--settle`` seconds of idling. The relay
(``bench/relay_telegram.py``, python-telegram-bot + the openai SDK) is measured the same way
beside it. Which packages the memory belongs to: ``bench/import_rss.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_platforms import DiscordDriver, Driver, LarkDriver, SlackDriver, TelegramDriver
from bench.bench_telegram import rss_mb, start_relay
from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI

DRIVERS: dict[str, type[Driver]] = {
    "telegram": TelegramDriver,
    "slack": SlackDriver,
    "discord": DiscordDriver,
    "lark": LarkDriver,
}


async def answered(driver: Driver, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while driver.answers(f"echo: {text}") == 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{driver.name}: no answer to {text!r}")
        await asyncio.sleep(0.05)


async def measure(names: list[str], args: argparse.Namespace) -> tuple[float, float]:
    """(RSS connected, RSS after one answered DM per channel and the settle time)."""
    model = FakeOpenAI(record=False)
    await model.start()
    drivers = [DRIVERS[n](quick=True) for n in names]
    for d in drivers:
        await d.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = base_config(Path(tmp) / "data", model.base_url, free_port())
            cfg["log_level"] = "WARNING"
            cfg["access"] = {"allow_users": ["*"], "pairing": False}
            cfg["agent"]["tools"] = not args.bare
            for d in drivers:
                cfg["channels"][d.name] = d.channel_config()
            daemon = DaemonProcess(Path(tmp), cfg)
            await daemon.start()
            for d in drivers:
                await d.after_daemon_start()
            await asyncio.sleep(args.settle)
            assert daemon.proc is not None
            connected = rss_mb(daemon.proc.pid)
            for i, d in enumerate(drivers):
                await d.dm(f"idle probe {i}")
                await answered(d, f"idle probe {i}")
            await asyncio.sleep(args.settle)
            warm = rss_mb(daemon.proc.pid)
            await daemon.terminate()
    finally:
        for d in drivers:
            await d.stop()
        await model.aclose()
    return connected, warm


async def relay_rss(args: argparse.Namespace) -> tuple[float, float]:
    driver = TelegramDriver(quick=True)
    await driver.start()
    model = FakeOpenAI(record=False)
    await model.start()
    proc = start_relay(driver.tg, model)
    try:
        await asyncio.sleep(args.settle)
        connected = rss_mb(proc.pid)
        await driver.dm("idle probe 0")
        await answered(driver, "idle probe 0")
        await asyncio.sleep(args.settle)
        return connected, rss_mb(proc.pid)
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)
        await model.aclose()
        await driver.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", nargs="*", default=["telegram", "telegram,slack,discord,lark"])
    ap.add_argument("--bare", action="store_true", help="agent.tools: false")
    ap.add_argument("--settle", type=float, default=3.0, help="idle seconds before each reading")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the daemon")
    ap.add_argument("--no-relay", action="store_true")
    args = ap.parse_args()
    for item in args.env:
        name, _, value = item.partition("=")
        os.environ[name] = value
    rows: list[tuple[str, Any, Any]] = []
    if not args.no_relay:
        rows.append(("relay (telegram)", *await relay_rss(args)))
    for spec in args.sets:
        rows.append((f"chital {spec}", *await measure(spec.split(","), args)))
    tools = "off (bare)" if args.bare else "on"
    print(f"agent tools {tools}; env {' '.join(args.env) or '-'}")
    print(f"{'system':<40} {'RSS connected':>14} {'RSS after 1 DM/channel':>24}")
    for name, connected, warm in rows:
        print(f"{name:<40} {connected:11.1f} MB {warm:21.1f} MB")


if __name__ == "__main__":
    asyncio.run(main())
