"""Gateway benchmark over Telegram DMs with an instant fake model (run by hand, prints figures).

    python bench/bench_telegram.py                      # 1 chat x 100, then 20 chats x 10
    python bench/bench_telegram.py --chats 100 --messages 10 --conversations 1000

The daemon runs as a real subprocess (`chital run`) with journal, checkpoints and streaming on; the
fake Telegram server and fake model run in this process. Latency is from the moment an update is
queued at the fake to the moment the bot's final reply reaches it. Users are closed-loop: each chat
sends its next message once the previous one is answered. CPU and memory are the daemon's own
(/proc/<pid>/stat and status), so the fakes' cost is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

CLK = os.sysconf("SC_CLK_TCK")


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


async def one_exchange(tg: FakeTelegram, chat: int, text: str) -> float:
    t0 = time.monotonic()
    up = tg.inject_message(chat, chat, text)
    mid = up["message"]["message_id"]
    want = f"echo: {text}"

    def done() -> bool | None:
        return any(m.reply_to == mid and want in m.text for m in tg.bot_messages(chat)) or None

    await tg.wait_for(done, timeout=30, what=text)
    return time.monotonic() - t0


async def load(tg: FakeTelegram, chats: int, messages: int, first_chat: int) -> tuple[list[float], float]:
    latencies: list[float] = []

    async def user(chat: int) -> None:
        for i in range(messages):
            latencies.append(await one_exchange(tg, chat, f"m{i} from {chat}"))

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


def report(name: str, lat: list[float], wall: float, cpu: float, n: int) -> None:
    print(
        f"{name}: {n} msgs in {wall:.2f}s = {n / wall:.1f} msg/s | latency p50 {statistics.median(lat) * 1000:.1f} ms"
        f" p99 {pct(lat, 99) * 1000:.1f} ms max {max(lat) * 1000:.1f} ms | daemon CPU {cpu / n * 1000:.2f} ms/msg"
    )


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
    args = ap.parse_args()

    tg = FakeTelegram()
    await tg.start()
    model = FakeOpenAI(record=False)
    await model.start()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = base_config(Path(tmp) / "data", model.base_url, free_port())
        cfg["log_level"] = "WARNING"
        cfg["channels"]["telegram"] = {
            "enabled": True,
            "token": tg.token,
            "base_url": tg.base_url,
            "base_file_url": tg.base_file_url,
            "poll_timeout": 10,
        }
        cfg["access"] = {"allow_users": ["*"], "pairing": False}
        cfg["concurrency"]["max_turns"] = args.max_turns
        cfg["delivery"] = {"first_edit_delay": 0.6}
        cfg["agent"]["tools"] = not args.bare
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

        c0 = cpu_seconds(pid)
        lat, wall = await load(tg, 1, args.single, 100)
        report("1 chat", lat, wall, cpu_seconds(pid) - c0, len(lat))

        c0 = cpu_seconds(pid)
        lat, wall = await load(tg, args.chats, args.messages, 1000)
        report(f"{args.chats} chats x {args.messages}", lat, wall, cpu_seconds(pid) - c0, len(lat))
        print(f"daemon RSS after those turns: {rss_mb(pid):.1f} MB (+{rss_mb(pid) - rss_warm:.1f} MB)")

        if args.conversations:
            c0 = cpu_seconds(pid)
            lat, wall = await distinct_chats(tg, args.conversations, args.chats, 100_000)
            report(f"{args.conversations} new conversations", lat, wall, cpu_seconds(pid) - c0, len(lat))
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
