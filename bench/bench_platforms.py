"""Per-platform gateway latency and connection-recovery benchmark (run by hand, prints figures).

    python bench/bench_platforms.py --quick                 # short timeouts, ~3-4 minutes (Discord stall: 60 s)
    python bench/bench_platforms.py                         # production timeouts, ~6-7 minutes
    python bench/bench_platforms.py --platforms slack,lark --messages 100 --keep /tmp/bench-logs

For each platform the fake server and the fake model (instant "echo: <text>") run in this process and
`chital run` runs as a subprocess with only that channel on. Measured:

1. latency: injected user DM → the bot's final reply at the fake, N sequential DMs after a warm-up;
   the daemon's own CPU per message (/proc/<pid>/stat, all its threads; the fakes are not counted).
2. drop: the fake breaks the connection (close frame, TCP abort; Telegram: the server restarts), a DM
   is injected at once; time until its answer arrives, plus when /readyz showed the channel leave
   "connected" and come back, and when the fake saw the SDK reconnect.
3. stall: the connection goes half-open (the server stops answering but keeps the socket) with the
   production detection timeouts (or short ones with --quick); same figures.

Times are seconds from the moment of the break. Answers are looked for every ~2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

CLK = os.sysconf("SC_CLK_TCK")
PLATFORMS = ("telegram", "slack", "discord", "lark")


STATE_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ gateway\.app: channel (\w+): (\w+)")


def log_transitions(text: str, channel: str, wall0: float) -> tuple[float | None, float | None]:
    """First state change away from "connected" and the next "connected", from the daemon's log
    (it logs every change, so this sees changes too short for the /readyz poll to catch)."""
    down = up = None
    for line in text.splitlines():
        m = STATE_LINE.match(line)
        if m is None or m[2] != channel:
            continue
        at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() - wall0
        if m[3] != "connected" and down is None:
            down = at
        elif m[3] == "connected" and down is not None and up is None:
            up = at
    return down, up


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# -- one driver per platform: the same verbs over each fake ------------------------------------------


class Driver:
    """Start a fake, make the channel config, send a DM, count its answers, break the connection."""

    name = ""
    drop_modes: tuple[str, ...] = ()

    def __init__(self, quick: bool) -> None:
        self.quick = quick

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def channel_config(self) -> dict[str, Any]: ...
    async def dm(self, text: str) -> None: ...
    def answers(self, want: str) -> int: ...
    async def drop(self, mode: str) -> None: ...
    async def stall(self) -> None: ...
    def reconnects(self) -> int:
        """A counter the fake raises when the SDK connects again (or polls again)."""
        return 0

    async def after_daemon_start(self) -> None: ...
    async def cleanup_stall(self) -> None: ...
    def detection(self) -> str:
        """The half-open detection settings in force, for the printout."""
        return ""

    def pacing(self) -> float:
        """The adapter's sustained send spacing per chat (its Capabilities.min_send_interval)."""
        return 0.0


class TelegramDriver(Driver):
    name = "telegram"
    drop_modes = ("restart", "down-1s")
    chat = 4242

    async def start(self) -> None:
        self.tg = FakeTelegram()
        await self.tg.start()
        self._unstaller: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        await self.cleanup_stall()
        await self.tg.stop()

    def poll_timeout(self) -> int:
        return 1 if self.quick else 25

    def channel_config(self) -> dict[str, Any]:
        t = self.tg
        return {"enabled": True, "token": t.token, "base_url": t.base_url,
                "base_file_url": t.base_file_url, "poll_timeout": self.poll_timeout()}  # fmt: skip

    async def dm(self, text: str) -> None:
        self.tg.inject_message(self.chat, self.chat, text)

    def answers(self, want: str) -> int:
        return sum(want in m.text for m in self.tg.bot_messages(self.chat))

    async def drop(self, mode: str) -> None:
        # The fake has no connection to break: stop serving (waiting polls end, new ones are refused)
        # and serve again on the same port with the same state, at once or after a 1 s outage.
        await self.tg.stop()
        if mode == "down-1s":
            await asyncio.sleep(1.0)
        await self.tg.start()

    async def stall(self) -> None:
        # stall_polls() hangs *every* poll until lifted, new connections' too, so alone it never
        # recovers. A half-open connection only hangs the poll in flight: emulate that by lifting the
        # stall when the bot gives up on that poll and sends a new one. First let the bot go idle so
        # the poll in flight is the one that hangs.
        await self._idle_poll()
        stalled_at = time.monotonic()
        self.tg.stall_polls(True)

        async def unstall() -> None:
            await self.tg.wait_for(
                lambda: any(c.time > stalled_at for c in self.tg.calls_to("getUpdates")), timeout=3600
            )
            self.tg.stall_polls(False)

        self._unstaller = asyncio.create_task(unstall())

    async def _idle_poll(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            polls = self.tg.calls_to("getUpdates")
            if polls and time.monotonic() - polls[-1].time > 0.3 and not self.tg.pending_updates:
                return
            await asyncio.sleep(0.05)

    async def cleanup_stall(self) -> None:
        if self._unstaller is not None:
            self._unstaller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._unstaller
            self._unstaller = None
        self.tg.stall_polls(False)

    def reconnects(self) -> int:
        return len(self.tg.calls_to("getUpdates"))

    def pacing(self) -> float:
        from channels.telegram import TelegramChannel as cls

        return cls.capabilities.min_send_interval

    def detection(self) -> str:
        return f"poll_timeout {self.poll_timeout()} s (+10 s read timeout)"


class SlackDriver(Driver):
    name = "slack"
    drop_modes = ("close", "abort")
    channel = "D_BENCH"
    user = "U_BENCH"

    async def start(self) -> None:
        self.slack = FakeSlack()
        await self.slack.start()

    async def stop(self) -> None:
        await self.slack.stop()

    def ping(self) -> float:
        return 1.0 if self.quick else 10.0

    def channel_config(self) -> dict[str, Any]:
        s = self.slack
        return {"enabled": True, "bot_token": s.bot_token, "app_token": s.app_token,
                "api_base_url": s.api_base_url, "ping_interval": self.ping()}  # fmt: skip

    async def after_daemon_start(self) -> None:
        await self.slack.wait_connected(timeout=30)

    async def dm(self, text: str) -> None:
        await self.slack.inject_dm(self.channel, self.user, text)

    def answers(self, want: str) -> int:
        return sum(want in t for t in self.slack.texts(self.channel))

    async def drop(self, mode: str) -> None:
        if mode == "close":
            await self.slack.close_ws()
        else:
            self.slack.abort_ws()

    async def stall(self) -> None:
        self.slack.stall()

    def reconnects(self) -> int:
        return self.slack.connections

    def pacing(self) -> float:
        from channels.slack import SlackChannel as cls

        return cls.capabilities.min_send_interval

    def detection(self) -> str:
        return f"ping_interval {self.ping():g} s"


class DiscordDriver(Driver):
    name = "discord"
    drop_modes = ("close", "abort")
    user = "424242424242424242"

    def heartbeat(self) -> float:
        return 1.0 if self.quick else 41.25

    async def start(self) -> None:
        self.dc = FakeDiscord(heartbeat_interval=self.heartbeat())
        await self.dc.start()

    async def stop(self) -> None:
        await self.dc.stop()

    def channel_config(self) -> dict[str, Any]:
        d = self.dc
        return {
            "enabled": True,
            "token": d.token,
            "api_base_url": d.api_base_url,
            "gateway_url": d.gateway_url,
            "heartbeat_timeout": self.heartbeat_timeout(),
        }

    def heartbeat_timeout(self) -> float:
        return 3.0 if self.quick else 60.0

    async def after_daemon_start(self) -> None:
        await self.dc.wait_connected(timeout=30)

    async def dm(self, text: str) -> None:
        await self.dc.inject_dm(self.user, text)

    def answers(self, want: str) -> int:
        return sum(want in m.content for m in self.dc.bot_messages())

    async def drop(self, mode: str) -> None:
        await self.dc.drop_connection(mode)  # type: ignore[arg-type]

    async def stall(self) -> None:
        await self.dc.drop_connection("stall")

    def reconnects(self) -> int:
        return self.dc.identifies + self.dc.resumes

    def pacing(self) -> float:
        from channels.discord import DiscordChannel as cls

        return cls.capabilities.min_send_interval

    def detection(self) -> str:
        return f"heartbeat_interval {self.heartbeat():g} s, heartbeat_timeout {self.heartbeat_timeout():g} s"


class LarkDriver(Driver):
    name = "lark"
    drop_modes = ("close", "abort")
    chat = "oc_bench_dm"
    user = "ou_bench_user"

    def liveness(self) -> float:
        return 3.0 if self.quick else 90.0

    async def start(self) -> None:
        self.lark = FakeLark().start()  # its own thread: lark-oapi makes blocking calls

    async def stop(self) -> None:
        await asyncio.to_thread(self.lark.stop)

    def channel_config(self) -> dict[str, Any]:
        k = self.lark
        return {"enabled": True, "app_id": k.app_id, "app_secret": k.app_secret, "domain": k.base_url,
                "liveness_timeout": self.liveness()}  # fmt: skip

    async def after_daemon_start(self) -> None:
        await self.lark.wait_for_async(lambda f: f.live_connections > 0, timeout=30)

    async def dm(self, text: str) -> None:
        self.lark.inject_message(self.chat, self.user, text)  # blocks for the send only (<1 ms)

    def answers(self, want: str) -> int:
        return sum(want in m.text for m in self.lark.bot_messages(self.chat))

    async def drop(self, mode: str) -> None:
        self.lark.drop_connection(mode)

    async def stall(self) -> None:
        self.lark.drop_connection("stall")

    def reconnects(self) -> int:
        return self.lark.connections

    def pacing(self) -> float:
        from channels.lark import LarkChannel as cls

        return cls.capabilities.min_send_interval

    def detection(self) -> str:
        return f"liveness_timeout {self.liveness():g} s (fake: PingInterval 30, ReconnectInterval 1)"


DRIVERS: dict[str, type[Driver]] = {
    "telegram": TelegramDriver, "slack": SlackDriver, "discord": DiscordDriver, "lark": LarkDriver,
}  # fmt: skip


# -- measuring -------------------------------------------------------------------------------------


@dataclass
class Row:
    platform: str
    scenario: str
    answer: float | None = None
    down: float | None = None
    up: float | None = None
    reconnect: float | None = None
    log_down: float | None = None
    log_up: float | None = None
    note: str = ""
    figures: str = ""


@dataclass
class ReadyWatch:
    """Polls /readyz every 20 ms and the fake's reconnect counter; times are from ``t0``."""

    port: int
    channel: str
    counter: Callable[[], int]
    t0: float
    down: float | None = None
    up: float | None = None
    reconnect: float | None = None
    reasons: list[str] = field(default_factory=list)
    up_seen: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, stop: asyncio.Event) -> None:
        base = self.counter()
        url = f"http://127.0.0.1:{self.port}/readyz"
        async with aiohttp.ClientSession() as s:
            while not stop.is_set():
                now = time.monotonic() - self.t0
                if self.reconnect is None and self.counter() != base:
                    self.reconnect = now
                try:
                    async with s.get(url) as r:
                        info = (await r.json())["channels"].get(self.channel, {})
                except (aiohttp.ClientError, ValueError, KeyError):
                    info = {}
                state, reason = info.get("state"), info.get("reason")
                if state != "connected" and self.down is None:
                    self.down = now
                if state != "connected" and reason and reason not in self.reasons:
                    self.reasons.append(str(reason))
                if state == "connected" and self.down is not None and self.up is None:
                    self.up = now
                    self.up_seen.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.02)


async def wait_answer(drv: Driver, want: str, timeout: float, count: int = 1) -> float | None:
    """Monotonic time when ``count`` answers containing ``want`` are seen, or None at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if drv.answers(want) >= count:
            return time.monotonic()
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.002)


class Bench:
    def __init__(self, args: argparse.Namespace, drv: Driver, model: FakeOpenAI, workdir: Path) -> None:
        self.args, self.drv, self.model, self.workdir = args, drv, model, workdir
        self.rows: list[Row] = []
        self.seq = 0
        self.d: DaemonProcess | None = None

    def text(self, tag: str) -> str:
        self.seq += 1
        return f"bench {self.drv.name} {tag} #{self.seq}"

    async def exchange(self, tag: str, timeout: float = 30) -> float | None:
        text = self.text(tag)
        t0 = time.monotonic()
        await self.drv.dm(text)
        done = await wait_answer(self.drv, f"echo: {text}", timeout)
        return None if done is None else done - t0

    async def start_daemon(self) -> None:
        cfg = base_config(self.workdir / "data", self.model.base_url, free_port())
        cfg["log_level"] = self.args.log_level
        cfg["channels"][self.drv.name] = self.drv.channel_config()
        cfg["access"] = {"allow_users": ["*"], "pairing": False}
        cfg["delivery"] = {"first_edit_delay": 0.6}
        self.d = DaemonProcess(self.workdir, cfg)
        t0 = time.monotonic()
        await self.d.start(timeout=60)
        await self.drv.after_daemon_start()
        print(f"  daemon ready in {time.monotonic() - t0:.2f}s (pid {self.d.proc.pid})")  # type: ignore[union-attr]

    async def restart_daemon(self) -> None:
        assert self.d is not None
        with contextlib.suppress(TimeoutError):
            await self.d.terminate()
        await self.d.close()
        await self.d.start(timeout=60)
        await self.drv.after_daemon_start()

    def log_mark(self) -> int:
        assert self.d is not None
        return self.d.log_path.stat().st_size if self.d.log_path.exists() else 0

    def log_since(self, mark: int) -> str:
        assert self.d is not None
        with self.d.log_path.open("rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace")

    @staticmethod
    def indent(text: str, lines: int = 40) -> str:
        shown = text.splitlines()[-lines:] or ["(nothing logged)"]
        return "\n".join("      | " + line[:220] for line in shown)

    async def latency(self) -> None:
        """Spaced DMs (one per pacing interval: the per-chat send pacer never holds a reply, so this is
        the gateway's own latency), then back-to-back DMs (what a user typing fast sees: the pacer
        spaces the replies). CPU is net of the daemon's idle CPU (pings, heartbeats, polls)."""
        d, n, drv = self.d, self.args.messages, self.drv
        assert d is not None and d.proc is not None
        pid = d.proc.pid
        for _ in range(self.args.warmup):
            if await self.exchange("warm-up") is None:
                raise RuntimeError(f"{drv.name}: warm-up message not answered\n{d.logs()}")
        await asyncio.sleep(drv.pacing() * 3)  # let the send bucket fill again
        c0, w0 = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(self.args.idle)
        idle_rate = (cpu_seconds(pid) - c0) / (time.monotonic() - w0)
        for tag, count, gap in (("spaced", n, drv.pacing()), ("back-to-back", self.args.burst, 0.0)):
            if count <= 0:
                continue
            lat: list[float] = []
            c0, w0 = cpu_seconds(pid), time.monotonic()
            for _ in range(count):
                took = await self.exchange(tag)
                if took is None:
                    raise RuntimeError(f"{drv.name}: {tag} message not answered\n{d.logs()}")
                lat.append(took)
                if gap:
                    await asyncio.sleep(gap)
            cpu, wall = cpu_seconds(pid) - c0, time.monotonic() - w0
            net = max(0.0, cpu - idle_rate * wall) / count
            figures = (f"p50 {statistics.median(lat) * 1000:.1f} ms  p99 {pct(lat, 99) * 1000:.1f} ms  "
                       f"max {max(lat) * 1000:.1f} ms  CPU {net * 1000:.1f} ms/msg")  # fmt: skip
            how = f"gap {gap:g}s" if gap else "closed loop"
            print(f"  {tag} ({count} DMs, one chat, {how}): {figures}")
            self.rows.append(Row(drv.name, tag, figures=figures))
            await asyncio.sleep(drv.pacing() * 3)
        print(f"  daemon idle CPU {idle_rate * 1000:.1f} ms/s (subtracted above)")

    async def recovery(self, scenario: str, breaker: Callable[[], Any]) -> None:
        """Break the connection, inject a DM at once, time its answer; watch /readyz meanwhile."""
        d, drv, cap = self.d, self.drv, self.args.cap
        assert d is not None
        await self.ensure_healthy()
        mark = self.log_mark()
        text = self.text(scenario)
        want = f"echo: {text}"
        t0, wall0 = time.monotonic(), time.time()
        watch = ReadyWatch(d.port, drv.name, drv.reconnects, t0)
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch.run(stop))
        await breaker()
        await drv.dm(text)
        done = await wait_answer(drv, want, cap)
        row = Row(drv.name, scenario)
        if done is not None:
            row.answer = done - t0
            # Let /readyz catch up (it may show "connected" again a moment after the answer).
            if watch.down is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watch.up_seen.wait(), 3)
        stop.set()
        await watcher
        row.down, row.up, row.reconnect = watch.down, watch.up, watch.reconnect
        log = self.log_since(mark)
        row.log_down, row.log_up = log_transitions(log, drv.name, wall0)
        if watch.reasons:
            row.note = "; ".join(watch.reasons)[:160]
        if done is None:
            row.note = f"NOT RECOVERED within {cap:g}s" + (f" ({row.note})" if row.note else "")
        self.rows.append(row)
        print(f"  {scenario}: " + fmt_row(row))
        if done is None or self.args.verbose:
            print(f"    daemon log since the break:\n{self.indent(log)}")
        await drv.cleanup_stall()
        if done is None:
            return
        # Exactly once? Count again a little later (a replay after the reconnect could double it).
        await asyncio.sleep(0.5)
        if (n := drv.answers(want)) != 1:
            row.note = (row.note + f"; answered {n} times").lstrip("; ")
            print(f"    !! the DM was answered {n} times")

    async def ensure_healthy(self) -> None:
        """Before each scenario: the channel is connected and a DM gets answered, else restart."""
        assert self.d is not None
        with contextlib.suppress(AssertionError):
            await self.d.wait_channel_state(self.drv.name, "connected", timeout=60)
            if await self.exchange("probe", timeout=60) is not None:
                await asyncio.sleep(0.3)
                return
        print("  channel not healthy before the next scenario: restarting the daemon")
        await self.restart_daemon()

    async def run(self) -> None:
        drv = self.drv
        print(f"\n== {drv.name} ({drv.detection()})")
        await drv.start()
        try:
            await self.start_daemon()
            await self.latency()
            for mode in drv.drop_modes:
                await self.recovery(f"drop:{mode}", lambda m=mode: drv.drop(m))
            await self.recovery("stall", drv.stall)
            assert self.d is not None
            rc = await self.d.terminate()
            print(f"  daemon exit code {rc}")
        finally:
            if self.d is not None:
                await self.d.close()
            await drv.stop()


def secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def fmt_row(r: Row) -> str:
    if r.figures:
        return r.figures
    return (f"answer {secs(r.answer)} | readyz down {secs(r.down)} up {secs(r.up)} | "
            f"log down {secs(r.log_down)} up {secs(r.log_up)} | fake saw reconnect {secs(r.reconnect)}" + (f" | {r.note}" if r.note else ""))  # fmt: skip


def table(rows: list[Row]) -> None:
    print("\n== summary (times in seconds from the break; '-' = not observed)")
    print("answer: the DM sent right after the break is answered; down/up: /readyz (polled every 20 ms)")
    print("and the daemon log show the channel leave / regain 'connected'; reconn: the fake sees the SDK")
    print("connect (or poll) again.")
    head = (f"{'platform':9} {'scenario':12} {'answer':>9} {'ready↓':>7} {'ready↑':>7} {'log↓':>7} "
            f"{'log↑':>7} {'reconn':>7}  note")  # fmt: skip
    print(head)
    print("-" * len(head))
    for r in rows:
        if r.figures:
            print(f"{r.platform:9} {r.scenario:12} {r.figures}")
            continue
        answer = secs(r.answer) if r.answer is not None else "FAILED"
        print(f"{r.platform:9} {r.scenario:12} {answer:>9} {secs(r.down):>7} {secs(r.up):>7} "
              f"{secs(r.log_down):>7} {secs(r.log_up):>7} {secs(r.reconnect):>7}  {r.note[:90]}")  # fmt: skip


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--platforms", default=",".join(PLATFORMS), help="comma-separated subset")
    ap.add_argument("--messages", type=int, help="spaced DMs in the latency run (default 50, --quick 20)")
    ap.add_argument("--burst", type=int, help="back-to-back DMs after the spaced run (default 10, --quick 6)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measured first")
    ap.add_argument("--quick", action="store_true", help="short detection timeouts (ping 1 s etc.)")
    ap.add_argument("--cap", type=float, default=180.0, help="longest wait for a recovery answer (s)")
    ap.add_argument("--log-level", default="INFO", help="the daemon's log level")
    ap.add_argument("--keep", type=Path, help="keep configs and daemon logs under this directory")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the daemon log of every scenario")
    args = ap.parse_args()
    if args.messages is None:
        args.messages = 20 if args.quick else 50
    if args.burst is None:
        args.burst = 6 if args.quick else 10
    names = [p.strip() for p in args.platforms.split(",") if p.strip()]
    unknown = [p for p in names if p not in DRIVERS]
    if unknown:
        ap.error(f"unknown platform(s): {', '.join(unknown)}")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        os.environ.pop(var, None)  # slack_sdk honours these and ignores NO_PROXY

    model = FakeOpenAI(record=False)
    await model.start()
    rows: list[Row] = []
    started = time.monotonic()
    try:
        for name in names:
            workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
            bench = Bench(args, DRIVERS[name](args.quick), model, workdir)
            try:
                await bench.run()
            except Exception as exc:  # one platform failing must not hide the others' figures
                print(f"  {name}: benchmark aborted: {exc}")
                bench.rows.append(Row(name, "aborted", note=str(exc).splitlines()[0][:160]))
            finally:
                rows.extend(bench.rows)
                if args.keep:
                    dest = args.keep / name
                    shutil.rmtree(dest, ignore_errors=True)
                    shutil.copytree(workdir, dest, ignore=shutil.ignore_patterns("data"))
                shutil.rmtree(workdir, ignore_errors=True)
    finally:
        await model.aclose()
    table(rows)
    print(f"\n({'quick' if args.quick else 'production'} timeouts; total {time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    asyncio.run(main())
