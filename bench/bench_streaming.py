"""Long streamed answers over Telegram DMs: Chital (tools on and off) beside a bare relay, one run.

    python bench/bench_streaming.py                       # 300 and 1,500 tokens, 1 and 20 chats
    python bench/bench_streaming.py --tokens 300 --chats 20 --messages 5 --pace 0
    python bench/bench_streaming.py --only chital-tools --profile /tmp/prof   # py-spy while loaded

The fake model streams each answer one token (a word) per SSE chunk, with no delay (``--pace 0``,
what the gateway's CPU per chunk is measured on) or at a realistic pace (``--pace 0.02``: 50 tokens/s,
where edit cadence and the last-chunk-to-final latency matter). Every system under test runs as its
own subprocess against the same fakes (which run here), so the CPU read from /proc is its own.

Printed per system and scenario: messages/s, CPU per message and per streamed chunk, platform calls
per message (by method: edits must stay paced), p50/p99 from the model's last chunk to the final
text reaching the fake Telegram, and RSS. The relay (bench/relay_telegram.py) consumes the same
stream with the openai SDK and sends the answer once: the floor any bot pays.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp import web

from bench.bench_telegram import cpu_seconds, daemon_config, pct, profiler, rss_mb, start_relay
from tests.daemon import DaemonProcess
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text
from tests.fakes.telegram_server import FakeTelegram

HERE = Path(__file__).resolve().parent
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa")


class TimedModel(FakeOpenAI):
    """The fake model, remembering when the last chunk of each streamed answer went out."""

    def __init__(self) -> None:
        super().__init__(record=False)
        self.last_chunk: dict[str, float] = {}

    async def _stream(self, request: web.Request, reply: Reply, *args: Any) -> web.StreamResponse:
        resp = await super()._stream(request, reply, *args)
        tag = reply.text.rsplit(" ", 1)[-1]
        self.last_chunk[tag] = time.monotonic()
        return resp


def answer_for(tokens: int, pace: float) -> Callable[[dict[str, Any]], Reply]:
    def make(body: dict[str, Any]) -> Reply:
        # "s3 c1002" → tag "fin3x1002": the final word, unique per message, survives formatting.
        user = last_user_text(body).split()
        tag = f"fin{user[0][1:]}x{user[1][1:]}" if len(user) >= 2 else "fin0x0"
        words = [WORDS[i % len(WORDS)] for i in range(tokens - 1)]
        return Reply(text=" ".join([*words, tag]), chunks=tokens, chunk_delay=pace)

    return make


@dataclass
class Result:
    name: str
    msgs: int
    wall: float
    cpu: float
    chunks: int
    calls: collections.Counter[str]
    tail: list[float]
    lat: list[float]
    rss: float
    notes: list[str] = field(default_factory=list)

    def line(self, relay: Result | None) -> str:
        cpu_msg = self.cpu / self.msgs * 1000
        rel = ""
        if relay is not None and relay is not self:
            rel = (
                f" | vs relay: throughput {self.msgs / self.wall / (relay.msgs / relay.wall):.2f}x,"
                f" CPU {cpu_msg / (relay.cpu / relay.msgs * 1000):.2f}x"
            )
        per = ", ".join(f"{m} {n / self.msgs:.1f}" for m, n in sorted(self.calls.items()))
        return (
            f"{self.name:<14} {self.msgs / self.wall:6.1f} msg/s  CPU {cpu_msg:6.1f} ms/msg"
            f" {self.cpu / max(1, self.chunks) * 1e6:6.0f} us/chunk | calls/msg: {per} |"
            f" last chunk→final p50 {statistics.median(self.tail) * 1000:.0f} ms"
            f" p99 {pct(self.tail, 99) * 1000:.0f} ms | RSS {self.rss:.0f} MB{rel}"
        )


async def drive(
    tg: FakeTelegram, model: TimedModel, pid: int, chats: int, messages: int, tokens: int, first: int
) -> Result:
    arrived: dict[str, float] = {}
    calls: collections.Counter[str] = collections.Counter()

    def seen(method: str, params: dict[str, Any]) -> None:
        if method == "getUpdates":
            return
        calls[method] += 1
        text = str(params.get("text") or "")
        tail = text.rsplit(" ", 1)[-1].strip()
        if tail.startswith("fin") and method in ("sendMessage", "editMessageText"):
            arrived.setdefault(tail, time.monotonic())

    tg.after_call = seen
    lat: list[float] = []

    async def user(chat: int) -> None:
        for i in range(messages):
            tag = f"fin{i}x{chat}"
            t0 = time.monotonic()
            tg.inject_message(chat, chat, f"s{i} c{chat}")
            await tg.wait_for(lambda t=tag: (t in arrived) or None, timeout=300, what=tag)  # type: ignore[misc]
            lat.append(time.monotonic() - t0)

    c0 = cpu_seconds(pid)
    t0 = time.monotonic()
    await asyncio.gather(*(user(first + c) for c in range(chats)))
    wall = time.monotonic() - t0
    await asyncio.sleep(0.5)  # trailing calls (a last draft, a reaction) count against this scenario
    cpu = cpu_seconds(pid) - c0
    tg.after_call = None
    tail = [arrived[t] - model.last_chunk[t] for t in arrived if t in model.last_chunk]
    n = chats * messages
    return Result("", n, wall, cpu, n * tokens, calls, tail, lat, rss_mb(pid))


class Relay:
    def __init__(self, tg: FakeTelegram, model: FakeOpenAI) -> None:
        self.proc = start_relay(tg, model, stream=True)
        self.pid = self.proc.pid

    async def stop(self) -> None:
        self.proc.terminate()
        await asyncio.to_thread(self.proc.wait, 10)


async def run_system(
    name: str, args: argparse.Namespace, scenarios: list[tuple[int, int, float]]
) -> list[Result]:
    tg = FakeTelegram()
    await tg.start()
    model = TimedModel()
    await model.start()
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        daemon: DaemonProcess | None = None
        relay: Relay | None = None
        if name == "relay":
            relay = Relay(tg, model)
            pid = relay.pid
        else:
            cfg = daemon_config(Path(tmp) / "data", tg, model, tools=name == "chital-tools")
            cfg["concurrency"]["max_turns"] = 32
            daemon = DaemonProcess(Path(tmp), cfg)
            await daemon.start()
            assert daemon.proc is not None
            pid = daemon.proc.pid
        # Warm up (imports, connections, the first thread) with short answers.
        model.add_rule(lambda t: t.startswith("s"), answer_for(8, 0.0))
        await drive(tg, model, pid, 1, 3, 8, 9)
        idle = rss_mb(pid)
        model._rules.clear()
        for tokens, chats, pace in scenarios:
            model._rules.clear()
            model.add_rule(lambda t: t.startswith("s"), answer_for(tokens, pace))
            spy = profiler(pid, f"{args.profile}-{name}-{tokens}x{chats}.txt") if args.profile else None
            r = await drive(tg, model, pid, chats, args.messages, tokens, 1000 + 100 * len(results))
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                await asyncio.to_thread(spy.wait, 30)
            r.name = name
            r.notes.append(f"idle RSS after warm-up {idle:.0f} MB")
            results.append(r)
        if relay is not None:
            await relay.stop()
        if daemon is not None:
            await daemon.terminate()
    await model.aclose()
    await tg.stop()
    return results


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="300,1500", help="answer lengths, comma-separated")
    ap.add_argument("--chats", default="1,20", help="concurrent chats, comma-separated")
    ap.add_argument("--messages", type=int, default=5, help="messages per chat")
    ap.add_argument("--pace", default="0,0.02", help="seconds between chunks, comma-separated")
    ap.add_argument("--only", default="relay,chital-tools,chital-bare")
    ap.add_argument("--profile", default="", help="py-spy collapsed stacks to PREFIX-system-scenario.txt")
    args = ap.parse_args()
    scenarios = [
        (int(t), int(c), float(p))
        for p in args.pace.split(",")
        for t in args.tokens.split(",")
        for c in args.chats.split(",")
    ]
    systems = args.only.split(",")
    by_system = {name: await run_system(name, args, scenarios) for name in systems}
    for i, (tokens, chats, pace) in enumerate(scenarios):
        print(f"\n== {tokens} tokens, {chats} chat(s) x {args.messages}, pace {pace * 1000:g} ms/chunk ==")
        relay = by_system.get("relay", [None] * len(scenarios))[i]
        for name in systems:
            print(by_system[name][i].line(relay))
    for name in systems:
        print(f"{name}: {by_system[name][0].notes[0]}")


if __name__ == "__main__":
    asyncio.run(main())
