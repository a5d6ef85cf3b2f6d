"""Gateway benchmark over Telegram DMs with an instant fake model (run by hand, prints figures).

    python bench/bench_telegram.py                      # relay, then Chital: 1 chat x 100, 20 chats x 10
    python bench/bench_telegram.py --only chital --chats 100 --messages 10 --conversations 1000

The daemon runs as a real subprocess (`chital run`) with journal, checkpoints and streaming on; the
fake Telegram server and fake model run in this process. Latency is from the moment an update is
queued at the fake to the moment the bot's final reply reaches it. Users are closed-loop: each chat
sends its next message once the previous one is answered. CPU and memory are the daemon's own
(/proc/<pid>/stat and status), so the fakes' cost is not counted.

The bare python-telegram-bot relay (``bench/relay_telegram.py``, non-streamed model call, one
reply) runs first on its own fakes, and Chital's figures print beside its figures of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

CLK = os.sysconf("SC_CLK_TCK")
HERE = Path(__file__).resolve().parent


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def one_exchange(
    tg: FakeTelegram, chat: int, text: str, quoted: bool = True, timeout: float = 30
) -> float:
    """One DM answered within ``timeout`` s; ``quoted``: the answer must reply to it (the relay's
    DM answers do not quote, and its texts are unique per message anyway)."""
    t0 = time.monotonic()
    up = tg.inject_message(chat, chat, text)
    mid = up["message"]["message_id"]
    want = f"echo: {text}"

    def done() -> bool | None:
        return (
            any((m.reply_to == mid or not quoted) and want in m.text for m in tg.bot_messages(chat)) or None
        )

    await tg.wait_for(done, timeout=timeout, what=text)
    return time.monotonic() - t0


async def load(
    tg: FakeTelegram, chats: int, messages: int, first_chat: int, quoted: bool = True, timeout: float = 30
) -> tuple[list[float], float]:
    latencies: list[float] = []

    async def user(chat: int) -> None:
        for i in range(messages):
            latencies.append(await one_exchange(tg, chat, f"m{i} from {chat}", quoted, timeout))

    t0 = time.monotonic()
    await asyncio.gather(*(user(first_chat + c) for c in range(chats)))
    return latencies, time.monotonic() - t0


async def distinct_chats(
    tg: FakeTelegram, total: int, concurrency: int, first_chat: int
) -> tuple[list[float], float]:
    """``total`` new conversations, one message each, ``concurrency`` users at a time."""
    latencies: list[float] = []
    chats = iter(range(first_chat, first_chat + total))

    async def user() -> None:
        for chat in chats:
            latencies.append(await one_exchange(tg, chat, f"hello from {chat}"))

    t0 = time.monotonic()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    return latencies, time.monotonic() - t0


@dataclass
class Figures:
    """One load phase: messages/s, latency, the system's CPU per message."""

    n: int
    wall: float
    cpu: float
    lat: list[float]

    def line(self, name: str, ref: Figures | None) -> str:
        text = (
            f"{name}: {self.n} msgs in {self.wall:.2f}s = {self.n / self.wall:.1f} msg/s | latency p50"
            f" {statistics.median(self.lat) * 1000:.1f} ms p99 {pct(self.lat, 99) * 1000:.1f} ms"
            f" max {max(self.lat) * 1000:.1f} ms | CPU {self.cpu / self.n * 1000:.2f} ms/msg"
        )
        if ref is not None:
            text += (
                f" | vs relay: throughput {self.n / self.wall / (ref.n / ref.wall):.2f}x,"
                f" CPU {self.cpu / self.n / (ref.cpu / ref.n):.2f}x"
            )
        return text


async def phase(
    tg: FakeTelegram, pid: int, chats: int, messages: int, first: int, quoted: bool = True
) -> Figures:
    c0 = cpu_seconds(pid)
    lat, wall = await load(tg, chats, messages, first, quoted)
    return Figures(len(lat), wall, cpu_seconds(pid) - c0, lat)


def profiler(pid: int, out: str) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` into collapsed stacks (``--format raw``), stopped with SIGINT."""
    cmd = [
        "py-spy",
        "record",
        "--pid",
        str(pid),
        "--rate",
        "250",
        "--format",
        "raw",
        "-o",
        out,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def relay_argv(tg: FakeTelegram, model: FakeOpenAI, *, stream: bool = False) -> list[str]:
    """The command line of ``bench/relay_telegram.py`` on these fakes."""
    cmd = [sys.executable, str(HERE / "relay_telegram.py"), "--token", tg.token, "--base-url", tg.base_url]
    return [*cmd, "--model-url", model.base_url, *(["--stream"] if stream else [])]


def daemon_config(data: Path, tg: FakeTelegram, model: FakeOpenAI, *, tools: bool) -> dict[str, Any]:
    """``chital run`` with Telegram alone on these fakes, every user let in (no pairing), quiet logs;
    the benches add their own concurrency and delivery settings."""
    cfg = base_config(data, model.base_url, free_port())
    cfg["log_level"] = "WARNING"
    cfg["channels"]["telegram"] = {
        "enabled": True,
        "token": tg.token,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "poll_timeout": 10,
    }
    cfg["access"] = {"allow_users": ["*"], "pairing": False}
    cfg["agent"]["tools"] = tools
    return cfg


def start_relay(tg: FakeTelegram, model: FakeOpenAI, *, stream: bool = False) -> subprocess.Popen[bytes]:
    """``bench/relay_telegram.py`` as a subprocess on these fakes (proxy variables blanked)."""
    cmd = relay_argv(tg, model, stream=stream)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def run_relay(args: argparse.Namespace) -> tuple[Figures, Figures, float]:
    """The bare relay on its own fakes: (one chat, many chats, idle RSS after warm-up)."""
    tg = FakeTelegram()
    await tg.start()
    model = FakeOpenAI(record=False)
    await model.start()
    proc = start_relay(tg, model)
    try:
        await load(tg, 1, 5, 10, quoted=False)
        rss = rss_mb(proc.pid)
        one = await phase(tg, proc.pid, 1, args.single, 100, quoted=False)
        many = await phase(tg, proc.pid, args.chats, args.messages, 1000, quoted=False)
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)
        await model.aclose()
        await tg.stop()
    return one, many, rss


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chats", type=int, default=20)
    ap.add_argument("--messages", type=int, default=10)
    ap.add_argument("--single", type=int, default=100, help="messages in the one-chat latency run")
    ap.add_argument("--conversations", type=int, default=0, help="extra distinct chats for the memory figure")
    ap.add_argument("--max-turns", type=int, default=32)
    ap.add_argument(
        "--bare", action="store_true", help="agent.tools: false (plain chat model, no sandbox/tools)"
    )
    ap.add_argument("--only", default="relay,chital", help="relay, chital or both (relay first)")
    ap.add_argument("--profile", default="", help="py-spy collapsed stacks of the many-chats phase to FILE")
    args = ap.parse_args()
    systems = args.only.split(",")

    ref: tuple[Figures, Figures, float] | None = None
    if "relay" in systems:
        ref = await run_relay(args)
        print(f"relay (PTB + openai SDK, one reply): RSS idle after warm-up {ref[2]:.1f} MB")
        print(ref[0].line("relay 1 chat", None))
        print(ref[1].line(f"relay {args.chats} chats x {args.messages}", None))
    if "chital" not in systems:
        return

    tg = FakeTelegram()
    await tg.start()
    model = FakeOpenAI(record=False)
    await model.start()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = daemon_config(Path(tmp) / "data", tg, model, tools=not args.bare)
        cfg["concurrency"]["max_turns"] = args.max_turns
        cfg["delivery"] = {"first_edit_delay": 0.6}
        print(
            f"agent tools: {'off (bare)' if args.bare else 'on (sandbox, sub-agents, skills, memory, context)'}"
        )
        d = DaemonProcess(Path(tmp), cfg)
        await d.start()
        pid = d.proc.pid  # type: ignore[union-attr]
        await asyncio.sleep(1.0)
        print(f"daemon RSS idle (fresh start): {rss_mb(pid):.1f} MB")

        await load(tg, 1, 5, 10)  # warm-up: imports, first connections
        rss_warm = rss_mb(pid)
        print(f"daemon RSS idle after warm-up: {rss_warm:.1f} MB")

        one = await phase(tg, pid, 1, args.single, 100)
        print(one.line("1 chat", ref[0] if ref else None))
        spy = profiler(pid, args.profile) if args.profile else None
        many = await phase(tg, pid, args.chats, args.messages, 1000)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            await asyncio.to_thread(spy.wait, 30)
        print(many.line(f"{args.chats} chats x {args.messages}", ref[1] if ref else None))
        print(f"daemon RSS after those turns: {rss_mb(pid):.1f} MB (+{rss_mb(pid) - rss_warm:.1f} MB)")

        if args.conversations:
            c0 = cpu_seconds(pid)
            lat, wall = await distinct_chats(tg, args.conversations, args.chats, 100_000)
            extra = Figures(len(lat), wall, cpu_seconds(pid) - c0, lat)
            print(extra.line(f"{args.conversations} new conversations", None))
            await asyncio.sleep(1.0)
            print(
                f"daemon RSS after {args.conversations} conversations: {rss_mb(pid):.1f} MB "
                f"(+{rss_mb(pid) - rss_warm:.1f} MB)"
            )
        rc = await d.terminate()
        print(f"daemon exit code {rc}")
    await model.aclose()
    await tg.stop()


if __name__ == "__main__":
    asyncio.run(main())
