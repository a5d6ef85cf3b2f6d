"""Retention benchmark: does the gateway database stay flat when messages never stop? (run by hand)

    python bench/bench_retention.py                       # the Store alone: 20,000 messages
    python bench/bench_retention.py --daemon 20000        # plus `chital run` with the fake Telegram

Store mode drives the real :class:`gateway.store.journal.Store` through the life of each message as the
gateway does (journal, running, two outbox parts, a presented file for one in twenty, done), for
``--messages`` messages in ``--waves`` waves, from ``--conversations`` conversations plus a stranger
asking for pairing every tenth message. Retention is ``--retention`` seconds; after each wave the
bench waits for it and runs the daemon's own prune (:class:`gateway.store.retention.Retention`). The same
workload without pruning runs first, as the baseline. Printed per wave: rows, database + WAL bytes,
free pages, and this process's RSS.

Daemon mode runs ``chital run`` as a subprocess against the fake Telegram and the instant fake model,
with ``storage.retention_days`` set to ``--daemon-retention`` seconds and a prune every
``--daemon-interval`` seconds; ``--chats`` closed-loop users send messages until the total is reached,
each moving to a new chat every ``--per-chat`` messages (20,000 messages: 2,000 conversations).
Printed every tenth: journal rows, gateway database bytes, the agent's checkpoint database bytes
(not the gateway's to prune, shown for completeness) and the daemon's RSS. The agent runs with its
tools on (``--bare``: off, so the RSS is the gateway's) and long-term memory off (the fake model
cannot answer memory extraction).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from channels.base import Inbound
from gateway.config.sections import StorageConfig
from gateway.store.journal import Store
from gateway.store.retention import DAY, Retention


def rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def mb(n: int | float) -> str:
    return f"{n / 1e6:7.2f} MB"


def db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


# -- store mode -------------------------------------------------------------------------------------
async def one_message(store: Store, i: int, conversations: int) -> None:
    chat = str(i % conversations)
    inbound = Inbound(
        platform="telegram",
        chat_id=chat,
        message_id=str(i),
        sender_id=chat,
        text=f"message {i}: " + "lorem ipsum dolor sit amet " * 12,
        is_direct=True,
        addressed=True,
    )
    await store.journal_add(inbound, "turn")
    await store.journal_set(inbound.key, "running")
    await store.thread_for(inbound.conversation)
    await store.outbox_put(inbound.key, 0, f"{i}01")
    await store.outbox_put(inbound.key, 1, f"{i}02")
    if i % 20 == 0:
        await store.files_add(inbound.key, f"/mnt/user-data/outputs/report-{i}.pdf", "the report")
    await store.journal_set(inbound.key, "done")
    if i % 10 == 0:  # a stranger asks for access
        await store._db.execute(
            "INSERT OR IGNORE INTO pairing(code, user, name, created) VALUES (?, ?, ?, ?)",
            (f"C{i:07d}", f"telegram:stranger{i}", "Stranger", time.time()),
        )
        await store._db.commit()


async def store_run(args: argparse.Namespace, prune: bool) -> list[dict[str, float]]:
    folder = Path(tempfile.mkdtemp(prefix="chital-bench-retention-"))
    store = await Store.open(folder / "gateway.sqlite", 0)
    storage = StorageConfig(
        retention_days=args.retention / DAY,
        pairing_retention_hours=args.retention / 3600,
        prune_interval=3600,
    )
    retention = Retention(store, storage)
    await retention.start()  # what the daemon does at start-up (switches to incremental vacuum)
    rows: list[dict[str, float]] = []
    per_wave = args.messages // args.waves
    i = 0
    try:
        for wave in range(1, args.waves + 1):
            t0 = time.monotonic()
            for _ in range(per_wave):
                await one_message(store, i, args.conversations)
                i += 1
            ingest = time.monotonic() - t0
            before = await store.size_info()
            rss_before = rss_mb()
            pruned, prune_s = 0, 0.0
            if prune:
                await asyncio.sleep(args.retention + 0.05)
                report = await retention.prune_once()
                pruned, prune_s = report.journal, report.seconds
            else:
                await store.shrink()  # a checkpoint, so the sizes compare like with like
            after = await store.size_info()
            rows.append(
                {
                    "wave": wave,
                    "messages": i,
                    "ingest_s": ingest,
                    "rows_before": before["rows_journal"],
                    "bytes_before": before["file_bytes"] + before["wal_bytes"],
                    "rss_before": rss_before,
                    "pruned": pruned,
                    "prune_s": prune_s,
                    "rows_after": after["rows_journal"],
                    "pairing_after": after["rows_pairing"],
                    "bytes_after": after["file_bytes"] + after["wal_bytes"],
                    "free_pages": after["freelist_count"],
                    "rss_after": rss_mb(),
                }
            )
    finally:
        await store.close()
    return rows


def print_store(title: str, rows: list[dict[str, float]]) -> None:
    print(f"\n{title}")
    print(
        " wave  messages | journal rows  db+wal before | pruned  in   | rows after  pairing  db+wal after  free pg | RSS before → after"
    )
    for r in rows:
        print(
            f" {r['wave']:>4} {r['messages']:>9,} | {r['rows_before']:>12,} {mb(r['bytes_before'])} | "
            f"{r['pruned']:>6,} {r['prune_s']:4.2f}s | {r['rows_after']:>10,} {r['pairing_after']:>8,} "
            f"{mb(r['bytes_after'])} {r['free_pages']:>8} | {r['rss_before']:6.1f} → {r['rss_after']:6.1f} MB"
        )


async def store_mode(args: argparse.Namespace) -> None:
    print(
        f"Store: {args.messages:,} messages in {args.waves} waves, {args.conversations} conversations, "
        f"retention {args.retention:g}s"
    )
    print_store("baseline, never pruned", await store_run(args, prune=False))
    print_store(
        "with retention (the daemon's Retention.prune_once after each wave)",
        await store_run(args, prune=True),
    )


# -- daemon mode ------------------------------------------------------------------------------------
async def daemon_mode(args: argparse.Namespace) -> None:
    from tests.daemon import DaemonProcess, base_config, free_port
    from tests.fakes.openai_server import FakeOpenAI
    from tests.fakes.telegram_server import FakeTelegram

    for key in [k for k in os.environ if "proxy" in k.lower()]:
        del os.environ[key]
    work = Path(tempfile.mkdtemp(prefix="chital-bench-retention-daemon-"))
    model = await FakeOpenAI(record=False).start()
    tg = await FakeTelegram().start()
    cfg = base_config(work / "data", model.base_url, free_port())
    cfg["channels"]["telegram"] = {
        "enabled": True,
        "token": tg.token,
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "poll_timeout": 1,
    }
    cfg["access"] = {"allow_users": ["*"]}
    cfg["log_level"] = "WARNING"
    cfg["concurrency"]["max_turns"] = 32
    cfg["delivery"] = {"stream": False}
    # The fake model's echo is no memory-extraction answer: without this, every turn logs a warning
    # and costs a second model call that has nothing to do with the gateway's storage.
    cfg["agent"]["memory"] = {"enabled": False}
    if args.bare:
        cfg["agent"]["tools"] = False
    cfg["storage"].update(
        {
            "retention_days": args.daemon_retention / DAY,
            "prune_interval": args.daemon_interval,
            "reserve_mb": 0,
        }
    )
    d = DaemonProcess(work, cfg)
    db = work / "data" / "gateway.sqlite"
    checkpoints = work / "data" / "checkpoints.sqlite"
    total = args.daemon
    sent = 0
    print(
        f"\nDaemon{' (bare agent)' if args.bare else ''}: {total:,} messages from {args.chats} users, "
        f"{total // args.per_chat:,} chats, retention {args.daemon_retention:g}s, "
        f"prune every {args.daemon_interval:g}s"
    )
    print("  messages | journal rows | gateway db+wal | checkpoints db | daemon RSS | msg/s")
    try:
        await d.start()
        assert d.proc is not None
        pid = d.proc.pid

        def journal_rows() -> int:
            with sqlite3.connect(db) as conn:
                return int(conn.execute("SELECT COUNT(*) FROM journal").fetchone()[0])

        def sample(t0: float) -> None:
            rate = sent / max(time.monotonic() - t0, 1e-9)
            print(
                f"  {sent:>8,} | {journal_rows():>12,} | {mb(db_bytes(db))}     | {mb(db_bytes(checkpoints))}     | "
                f"{rss_mb(pid):7.1f} MB | {rate:5.1f}"
            )

        step = max(total // 10, 1)
        next_sample = step
        t0 = time.monotonic()
        sample(t0)
        lock = asyncio.Lock()
        failed: list[str] = []

        async def user(first_chat: int) -> None:
            """Closed loop; a fresh chat every ``--per-chat`` messages, so the agent's threads stay
            short and what grows (or not) is the gateway's state, not one conversation's history."""
            nonlocal sent, next_sample
            n = 0
            chat = first_chat
            while True:
                if n and n % args.per_chat == 0:
                    chat += args.chats
                async with lock:
                    if sent >= total:
                        return
                    sent += 1
                    if sent >= next_sample:
                        next_sample += step
                        sample(t0)
                n += 1
                text = f"m{n}"
                up = tg.inject_message(chat, chat, text)
                mid = up["message"]["message_id"]
                reply = await tg.wait_for(
                    lambda mid=mid, chat=chat: next(
                        (
                            m
                            for m in tg.bot_messages(chat)
                            if m.reply_to == mid and ("echo:" in m.text or "⚠" in m.text)
                        ),
                        None,
                    ),
                    timeout=60,
                    what=text,
                )
                if f"echo: {text}" not in reply.text:
                    failed.append(reply.text[:120])

        await asyncio.gather(*(user(10_000 + c) for c in range(args.chats)))
        if failed:
            print(f"  {len(failed)} answer(s) were errors, e.g. {failed[0]!r}")
        print(
            f"  all {total:,} answered; waiting {args.daemon_retention + 2 * args.daemon_interval:g}s for the last prune"
        )
        await asyncio.sleep(args.daemon_retention + 2 * args.daemon_interval)
        sample(t0)
        await d.terminate()
    finally:
        await d.close()
        await tg.stop()
        await model.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--waves", type=int, default=10)
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--retention", type=float, default=1.0, help="seconds (store mode)")
    parser.add_argument(
        "--daemon", type=int, default=0, help="also run the daemon through this many messages"
    )
    parser.add_argument("--chats", type=int, default=20, help="concurrent users (daemon mode)")
    parser.add_argument("--bare", action="store_true", help="agent.tools off: the gateway's state alone")
    parser.add_argument("--per-chat", type=int, default=10, help="messages per chat before a user moves on")
    parser.add_argument("--daemon-retention", type=float, default=20.0, help="seconds")
    parser.add_argument("--daemon-interval", type=float, default=5.0, help="seconds between prunes")
    args = parser.parse_args()
    asyncio.run(store_mode(args))
    if args.daemon:
        asyncio.run(daemon_mode(args))


if __name__ == "__main__":
    main()
