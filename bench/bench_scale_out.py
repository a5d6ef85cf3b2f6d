"""One daemon on SQLite against one, two and three daemons on one PostgreSQL database, in one run.

    python bench/bench_scale_out.py                      # Slack DMs, 40 chats x 5, tools off
    python bench/bench_scale_out.py --platform telegram --chats 20 --messages 10
    python bench/bench_scale_out.py --tools              # the default tool stack (sandbox etc.)
    python bench/bench_scale_out.py --statements 25      # + the statements per message (pg_stat_statements)
    python bench/bench_scale_out.py --spy /tmp/prof      # + py-spy profiles of every daemon (raw stacks)
    taskset -c 1 python bench/bench_scale_out.py --daemon-cpus 0   # the daemons on a core of their own
    taskset -c 1 python bench/bench_scale_out.py --daemon-cpus 0 --chats 100 --messages 6 --rounds 6
        # issue 27's two ratios as means and round by round (the rounds alternate their order)

Each configuration starts fresh (a new SQLite file, or a new database on one throw-away PostgreSQL
cluster from tests/pg_server.py), warms up, then runs closed-loop users: each chat sends its next
message once the previous one is answered. The fake model answers at once. Printed per
configuration: messages/s, latency p50/p99 (event injected at the fake → answer seen there), and
CPU per message summed over all daemons, and the PostgreSQL server's own CPU per message beside it
(the postmaster and its backends, read before the daemons stop: a backend's CPU leaves /proc with
it). ``--statements N`` loads ``pg_stat_statements`` and prints, per PostgreSQL configuration, the
statements run per message (all daemons together) and the N most frequent; ``--spy DIR`` runs each
daemon under ``py-spy record`` (summarise with bench/spy_top.py; its CPU figures then include the
profiler's cost).

On Slack the fake spreads events over the daemons' sockets, as Slack does; on Telegram the leader
polls and the others send only, so the work spreads only when the leader is busy. This machine has
2 cores: more daemons than cores measure the coordination's cost, not a speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_telegram import cpu_seconds, pct
from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.pg_server import PgServer, postgres_server


def _pg_cpu(server: PgServer) -> float:
    """CPU seconds of the PostgreSQL server and its backends (children of the postmaster)."""
    assert server.proc is not None
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        if pid == server.proc.pid or int(fields[1]) == server.proc.pid:
            total += cpu_seconds(pid)
    return total


async def _exchange_slack(slack: FakeSlack, channel: str, text: str) -> float:
    t0 = time.monotonic()
    await slack.inject_dm(channel, f"U{channel}", text)
    want = f"echo: {text}"
    await slack.wait_for(lambda: any(want in t for t in slack.texts(channel)) or None, timeout=60)
    return time.monotonic() - t0


async def _exchange_tg(tg: FakeTelegram, chat: int, text: str) -> float:
    t0 = time.monotonic()
    tg.inject_message(chat, chat, text)
    want = f"echo: {text}"
    await tg.wait_for(lambda: any(want in t for t in tg.bot_texts(chat)) or None, timeout=60, what=text)
    return time.monotonic() - t0


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return out


def _daemon_pid(d: DaemonProcess) -> int:
    """The daemon's own pid (under ``--spy`` the process started is py-spy, the daemon its child)."""
    assert d.proc is not None
    if not d.prefix or d.prefix[0] == "taskset":  # taskset execs the daemon: the same process
        return d.proc.pid
    kids = _children(d.proc.pid)
    return kids[0] if kids else d.proc.pid


async def _stop_spied(daemons: list[DaemonProcess]) -> None:
    """SIGTERM the daemons under py-spy (not py-spy itself), so that it writes its profile."""
    for d in daemons:
        if d.prefix and d.proc and d.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(_daemon_pid(d), signal.SIGTERM)
    for d in daemons:
        if d.prefix and d.proc:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(d.proc.wait(), 60)


async def _sql(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(sql)
        return list(await cur.fetchall()) if cur.description else []


async def _statements(url: str) -> list[tuple[str, int, float]]:
    """(statement, calls, ms of execution) in this database since the last reset, most called first."""
    rows = await _sql(
        url,
        "SELECT query, calls, total_exec_time FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " ORDER BY calls DESC",
    )
    return [(str(q), int(c), float(t)) for q, c, t in rows]


async def run_config(
    name: str,
    daemons_n: int,
    url: str | None,
    args: argparse.Namespace,
    model: FakeOpenAI,
    root: Path,
    pg: PgServer | None = None,
) -> tuple[str, float, list[float], float, int, float, list[tuple[str, int, float]]]:
    tg = FakeTelegram()
    await tg.start()
    slack = FakeSlack()
    slack.spread = True
    await slack.start()
    daemons: list[DaemonProcess] = []
    try:
        for n in range(daemons_n):
            cfg = base_config(root / name / f"data-{n}", model.base_url, free_port())
            cfg["log_level"] = "WARNING"
            if url:
                cfg["storage"]["url"] = url
            cfg["agent"]["tools"] = args.tools
            cfg["concurrency"]["max_turns"] = 32
            cfg["access"] = {"allow_users": ["*"], "pairing": False}
            if args.platform == "slack":
                cfg["channels"]["slack"] = {
                    "enabled": True, "bot_token": slack.bot_token, "app_token": slack.app_token,
                    "api_base_url": slack.api_base_url,
                }  # fmt: skip
            else:
                cfg["channels"]["telegram"] = {
                    "enabled": True, "token": tg.token, "base_url": tg.base_url,
                    "base_file_url": tg.base_file_url, "poll_timeout": 10,
                }  # fmt: skip
            d = DaemonProcess(root / name / f"d{n}", cfg)
            d.workdir.mkdir(parents=True, exist_ok=True)
            if args.daemon_cpus:
                d.prefix = ["taskset", "-c", args.daemon_cpus]
            if args.spy:
                out = Path(args.spy) / f"{name}-d{n}.raw"
                out.parent.mkdir(parents=True, exist_ok=True)
                gil = ["--gil"] if args.spy_gil else []
                d.prefix = [args.py_spy, "record", *gil, "--format", "raw", "-r", "200", "-o", str(out), "--"]
            daemons.append(d)
        await asyncio.gather(*(d.start(timeout=120) for d in daemons))

        async def exchange(chat: int, text: str) -> float:
            if args.platform == "slack":
                return await _exchange_slack(slack, f"D{chat:05d}", text)
            return await _exchange_tg(tg, chat, text)

        for i in range(3):  # warm-up: imports, connections, first threads
            await exchange(1, f"warm {i}")
        pids = [_daemon_pid(d) for d in daemons]
        if args.idle:
            i0, t_idle = sum(cpu_seconds(p) for p in pids), time.monotonic()
            await asyncio.sleep(args.idle)
            idle = (sum(cpu_seconds(p) for p in pids) - i0) / (time.monotonic() - t_idle)
            print(f"  {name}: idle, all daemons together: {idle * 1000:.1f} ms CPU per second", flush=True)
        if url and args.statements:
            await _sql(url, "SELECT pg_stat_statements_reset()")
        c0 = sum(cpu_seconds(p) for p in pids)
        pg0 = _pg_cpu(pg) if pg else 0.0
        lat: list[float] = []

        async def user(chat: int) -> None:
            for i in range(args.messages):
                lat.append(await exchange(chat, f"m{i} c{chat}"))

        calls0 = len(slack.calls)
        t0 = time.monotonic()
        await asyncio.gather(*(user(1000 + c) for c in range(args.chats)))
        wall = time.monotonic() - t0
        cpu = sum(cpu_seconds(p) for p in pids) - c0
        pg_cpu = _pg_cpu(pg) - pg0 if pg else 0.0  # before the daemons (and their backends) go
        stmts = await _statements(url) if url and args.statements else []
        if args.platform == "slack":
            methods = collections.Counter(c.method for c in slack.calls[calls0:])
            per = ", ".join(f"{m} {k / len(lat):.2f}" for m, k in methods.most_common(6))
            print(f"  {name}: Slack calls per message: {per}", flush=True)
        return name, wall, lat, cpu, len(lat), pg_cpu, stmts
    finally:
        await _stop_spied(daemons)
        await asyncio.gather(*(d.close() for d in daemons), return_exceptions=True)
        await slack.stop()
        await tg.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--platform", choices=["slack", "telegram"], default="slack")
    ap.add_argument("--chats", type=int, default=40)
    ap.add_argument("--messages", type=int, default=5)
    ap.add_argument(
        "--tools", action="store_true", help="the default tool stack (default: agent.tools false)"
    )
    ap.add_argument("--max", type=int, default=3, help="most daemons on PostgreSQL")
    ap.add_argument("--only", default="", help="only these configurations, e.g. sqlite-1,postgres-3")
    ap.add_argument("--statements", type=int, default=0, help="print the N most run statements")
    ap.add_argument("--spy", default="", help="py-spy profiles of every daemon into this directory")
    ap.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    ap.add_argument(
        "--daemon-cpus",
        default="",
        help="run the daemons on these CPUs only (taskset -c), e.g. 0; start this script itself with"
        " `taskset -c 1` so that it, its fakes and PostgreSQL keep off them: the daemons' CPU per"
        " message then leaves out what sharing their cores with the database costs them",
    )
    ap.add_argument(
        "--idle", type=float, default=0, help="also measure N seconds of idling, after the warm-up"
    )
    ap.add_argument(
        "--spy-gil",
        action="store_true",
        help="sample only the thread holding the GIL (py-spy --gil): CPU spent in Python, not a wait"
        " inside a C call that released the GIL, which plain sampling counts as busy",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the configurations N times, in alternating order, and print the means and the"
        " ratios issue 27 names (one PostgreSQL daemon / SQLite, three / one) round by round",
    )
    args = ap.parse_args()
    model = FakeOpenAI(record=False)
    await model.start()
    rows: list[Row] = []
    stats: dict[str, list[tuple[str, int, float]]] = {}
    wanted = set(filter(None, args.only.split(",")))
    configs = [
        c
        for c in ["sqlite-1", *(f"postgres-{k}" for k in range(1, args.max + 1))]
        if not wanted or c in wanted
    ]
    settings = ("shared_preload_libraries = 'pg_stat_statements'",) if args.statements else ()
    with tempfile.TemporaryDirectory() as tmp, postgres_server(settings) as pg:
        for r in range(args.rounds):
            root = Path(tmp) / f"round-{r}"
            for config in configs if r % 2 == 0 else configs[::-1]:  # drift spreads over both ends
                if config == "sqlite-1":
                    name, wall, lat, cpu, n, _, _ = await run_config(config, 1, None, args, model, root)
                    rows.append(Row(r, name, wall, lat, cpu, n, 0.0))
                    continue
                k = int(config.split("-")[1])
                url = pg.create_db(f"bench{k}r{r}")
                if args.statements:
                    await _sql(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                name, wall, lat, cpu, n, pg_cpu, stmts = await run_config(
                    config, k, url, args, model, root, pg
                )
                rows.append(Row(r, name, wall, lat, cpu, n, pg_cpu))
                if args.statements:
                    stats[name] = [(q, c, t) for q, c, t in stmts if "pg_stat_statements" not in q]
    await model.aclose()
    for name, stmts in stats.items():  # the last round's
        n = next(row.n for row in reversed(rows) if row.name == name)
        calls = sum(c for _, c, _ in stmts)
        print(f"\n-- {name}: {calls / n:.1f} statements per message ({calls} in all), most run first")
        for q, c, t in stmts[: args.statements]:
            print(f"{c / n:7.2f}/msg {t / max(c, 1) * 1000:6.0f} us  {' '.join(q.split())[:150]}")
    what = f"{args.platform} DMs, {args.chats} chats x {args.messages}, tools {'on' if args.tools else 'off'}"
    print(f"\n== {what} ==")
    print(f"{'config':<16} {'msg/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/msg':>11} {'(+postgres)':>12}")
    for row in rows:
        base = next((b for b in rows if b.round == row.round and b.name == "sqlite-1"), None)
        rel = f"   ({row.rate / base.rate:.2f}x sqlite-1)" if base else ""
        label = row.name if args.rounds == 1 else f"{row.name} r{row.round + 1}"
        print(
            f"{label:<16} {row.rate:7.1f} {statistics.median(row.lat) * 1000:8.0f}"
            f" {pct(row.lat, 99) * 1000:8.0f} {row.cpu_ms:11.2f} {row.pg_ms:12.2f}{rel}"
        )
    if args.rounds > 1:
        print(summary(rows, configs))


class Row(NamedTuple):
    round: int
    name: str
    wall: float
    lat: list[float]
    cpu: float
    n: int
    pg_cpu: float

    @property
    def rate(self) -> float:
        return self.n / self.wall

    @property
    def cpu_ms(self) -> float:
        """Daemon CPU per message (all daemons together), ms."""
        return self.cpu / self.n * 1000

    @property
    def pg_ms(self) -> float:
        return self.pg_cpu / self.n * 1000


def summary(rows: list[Row], configs: list[str]) -> str:
    """Per configuration the mean, median and spread of CPU per message over the rounds, then the
    two ratios of issue 27, item 4: as the ratio of the means, and round by round (the machine's
    noise shows in the spread of the second)."""
    out = [f"\n== over {len({r.round for r in rows})} rounds: daemon CPU ms per message ==",
           f"{'config':<12} {'mean':>7} {'median':>7} {'min':>7} {'max':>7} {'(+postgres)':>12}"]  # fmt: skip
    mean: dict[str, float] = {}
    for config in configs:
        values = [r.cpu_ms for r in rows if r.name == config]
        mean[config] = statistics.fmean(values)
        server = statistics.fmean(r.pg_ms for r in rows if r.name == config)
        out.append(
            f"{config:<12} {mean[config]:7.2f} {statistics.median(values):7.2f} {min(values):7.2f}"
            f" {max(values):7.2f} {server:12.2f}"
        )
    for top, bottom in (("postgres-1", "sqlite-1"), ("postgres-3", "postgres-1")):
        if top not in mean or bottom not in mean:
            continue
        by_round = {r.round: r.cpu_ms for r in rows if r.name == bottom}
        ratios = sorted(r.cpu_ms / by_round[r.round] for r in rows if r.name == top and r.round in by_round)
        out.append(
            f"{top} / {bottom}: {mean[top] / mean[bottom]:.2f} (ratio of the means); round by round"
            f" median {statistics.median(ratios):.2f}, {ratios[0]:.2f}–{ratios[-1]:.2f}; target 1.25"
        )
    return "\n".join(out)


if __name__ == "__main__":
    asyncio.run(main())
