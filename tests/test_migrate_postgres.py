"""``chital migrate`` (gateway/cli/migrate.py): a SQLite deployment's state moves into a
real PostgreSQL server (tests/pg_server.py) and the daemon carries on from it."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from channels.base import Inbound
from gateway.cli.migrate import Refused, migrate
from gateway.store.entries import JournalKind
from gateway.store.journal import Store
from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

ADMIN, MEMBER, STRANGER = 1001, 1002, 6666


def sqlite_config(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> dict[str, Any]:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["storage"].pop("url", None)  # the deployment before: SQLite, also in the PostgreSQL pass
    cfg["channels"]["telegram"] = tg.channel_settings()
    cfg["access"] = {"admins": [str(ADMIN)], "allow_users": [str(MEMBER)], "pairing": True}
    return cfg


async def answer(tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str) -> str:
    mid = update["message"]["message_id"]

    def check() -> str:
        hits = [m.text for m in tg.bot_messages(chat) if m.reply_to == mid and needle in m.text]
        return str(hits[0]) if hits else ""

    return await tg.wait_for(check, timeout=20, what=f"reply with {needle!r}")


def digests(data: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(data.glob("*.sqlite*"))}


async def test_a_sqlite_deployment_carries_on_on_postgres(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, pg_url: str
) -> None:
    d = DaemonProcess(tmp_path, sqlite_config(tmp_path, tg, model))
    data = tmp_path / "data"
    await d.start()
    try:
        first = tg.inject_message(MEMBER, MEMBER, "my favourite colour is teal")
        await answer(tg, MEMBER, first, "echo: my favourite colour is teal")
        ask = tg.inject_message(STRANGER, STRANGER, "let me in")
        text = await answer(tg, STRANGER, ask, "pairing code is")
        code = re.search(r"pairing code is ([A-Z0-9]{8})", text).group(1)  # type: ignore[union-attr]
        approve = tg.inject_command(ADMIN, ADMIN, "approve", code, chat_type="private", at=None)
        await answer(tg, ADMIN, approve, "Approved")

        rc, out = await d.cli("migrate", "--to", pg_url)
        assert rc == 1 and "a daemon is running" in out, out
    finally:
        assert await d.terminate() == 0
    before = digests(data)
    assert "gateway.sqlite" in before and "checkpoints.sqlite" in before

    rc, out = await d.cli("migrate", "--to", pg_url)
    assert rc == 0, out
    counts = {m[0]: int(m[1]) for m in re.findall(r"^  (\w+)\s+(\d+) ", out, re.M)}
    with sqlite3.connect(f"{(data / 'gateway.sqlite').as_uri()}?immutable=1", uri=True) as db:
        for table in (
            "journal",
            "outbox",
            "threads",
            "pairing",
            "approved_users",
            "schedules",
            "token_usage",
        ):
            (n,) = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
            assert counts[table] == n, (table, out)
    assert counts["journal"] >= 3 and counts["approved_users"] == 1
    assert counts["checkpoints"] > 0 and "password" not in out
    assert digests(data) == before, "the SQLite files were written to"

    rc, again = await d.cli("migrate", "--to", pg_url)
    assert rc == 0 and "copied before" in again and "(copied before)" in again.split("journal")[1], again

    d.config["storage"]["url"] = pg_url
    await d.start()
    try:
        tg.redeliver(first)  # Telegram serving an update the SQLite daemon had already answered
        follow = tg.inject_message(MEMBER, MEMBER, "what colour did I say?")
        await answer(tg, MEMBER, follow, "echo: what colour did I say?")
        history = [str(m.get("content")) for m in model.requests[-1]["messages"]]
        assert any("my favourite colour is teal" in h for h in history), history
        answered = [m for m in tg.bot_messages(MEMBER) if m.reply_to == first["message"]["message_id"]]
        assert len(answered) == 1, "the redelivered update was answered again"

        # The pairing approval moved: the stranger is let in without a new code.
        await answer(tg, STRANGER, tg.inject_message(STRANGER, STRANGER, "hello again"), "echo: hello again")
    finally:
        assert await d.terminate() == 0
    assert digests(data) == before


def message(i: int) -> Inbound:
    return Inbound("telegram", "42", str(i), "42", f"message {i}", True, True)


async def old_deployment(data: Path, messages: int = 5) -> None:
    store = await Store.open(data / "gateway.sqlite", reserve_bytes=0)
    try:
        for i in range(messages):
            await store.journal_add(message(i), JournalKind.TURN)
            await store.journal_set(message(i).key, "done")
        await store.pairing_code_for("telegram:7", "Eve")
        await store.thread_for("telegram:42")
        for n in (1, 2, 3):
            await schedule(store, n)
        await store.schedule_cancel(3)
        assert await store.schedules_prune(older_than=-1) == 1  # number 3 is gone, and never reused
    finally:
        await store.close()


async def schedule(store: Store, n: int) -> int:
    made, _ = await store.schedule_add(
        origin=f"origin-{n}", template=message(0), creator="telegram:42", text=f"remind {n}",
        cron=None, tz="UTC", next_fire=time.time() + 3600,
    )  # fmt: skip
    return made.id


async def memories(data: Path) -> None:
    import aiosqlite
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    async with aiosqlite.connect(str(data / "memory.sqlite"), isolation_level=None) as conn:
        store = AsyncSqliteStore(conn)
        await store.setup()
        for user in ("alice", "bob"):
            for i in range(3):
                await store.aput(("memory", user), f"fact-{i}", {"text": f"{user} likes {i}"}, index=False)


async def test_an_interrupted_run_finishes_and_a_full_target_is_refused(tmp_path: Path, pg_url: str) -> None:
    data = tmp_path / "data"
    await old_deployment(data)
    await memories(data)
    lines: list[str] = []

    def crash_after_journal(line: str) -> None:
        lines.append(line)
        if line.lstrip().startswith("journal"):
            raise KeyboardInterrupt  # the operator's Ctrl-C, or a crash, half-way

    with pytest.raises(KeyboardInterrupt):
        await migrate(data, data / "memory.sqlite", pg_url, force=False, say=crash_after_journal)

    lines.clear()
    await migrate(data, data / "memory.sqlite", pg_url, force=False, say=lines.append)
    text = "\n".join(lines)
    assert "resuming" in text and re.search(r"journal\s+5 rows \(copied before\)", text), text
    assert re.search(r"pairing\s+1 rows$", text, re.M) and re.search(
        r"memory\s+6 items in 2 namespaces", text
    )

    store = await Store.open_postgres(pg_url)
    try:
        assert await store.journal_counts() == {"done": 5}
        assert not await store.journal_add(message(3), JournalKind.TURN), "the journal's keys moved"
        assert [r.user for r in await store.pairing_list()] == ["telegram:7"]
        assert [s.text for s in await store.schedules_active("telegram:42")] == ["remind 1", "remind 2"]
        assert await schedule(store, 4) == 4, "a deleted schedule's number was given again"
    finally:
        await store.close()
    from agent.postgres import postgres_store

    pg_memory, close = await postgres_store(pg_url)
    try:
        found = await pg_memory.asearch(("memory", "bob"))
        assert sorted(i.value["text"] for i in found) == ["bob likes 0", "bob likes 1", "bob likes 2"]
    finally:
        await close()

    # Another deployment into the same, now full, database: refused, nothing written.
    other = tmp_path / "other"
    await old_deployment(other, messages=2)
    with pytest.raises(Refused, match="already has data"):
        await migrate(other, other / "memory.sqlite", pg_url, force=False, say=lines.append)
    lines.clear()
    await migrate(other, other / "memory.sqlite", pg_url, force=True, say=lines.append)
    assert re.search(r"journal\s+2 rows$", "\n".join(lines), re.M)


async def test_every_checkpoint_and_write_of_a_thread_is_copied(
    tmp_path: Path, pg_url: str, fake: FakeOpenAI, harnesses: list[Any]
) -> None:
    """The copy writes through the daemon's own PostgreSQL saver, which holds a turn's input and
    the model's writes only inside a turn: copying a thread (newest checkpoint first) stores every
    row, and the thread reads back whole (a hostile review found its oldest input and model writes
    held and never sent)."""
    from agent.harness import Harness
    from gateway.cli.migrate import _copy_checkpoints
    from tests.harness_support import FAST, spec, turn

    path = tmp_path / "checkpoints.sqlite"
    source = Harness(FAST, spec(fake), path)
    await source.start()
    harnesses.append(source)
    for n in range(3):
        await turn(source, f"turn {n}", f"m{n}")
    messages = await source.message_count("t1")
    with sqlite3.connect(path) as db:
        [(checkpoints,)] = db.execute("SELECT count(*) FROM checkpoints").fetchall()
        [(writes,)] = db.execute("SELECT count(*) FROM writes").fetchall()
    assert (checkpoints, writes) == (9, 9) and messages == 6
    copied = await _copy_checkpoints(path, pg_url)
    assert copied[:2] == (checkpoints, writes)
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        [(got_checkpoints,)] = await (await conn.execute("SELECT count(*) FROM checkpoints")).fetchall()
        [(got_writes,)] = await (await conn.execute("SELECT count(*) FROM checkpoint_writes")).fetchall()
    assert (got_checkpoints, got_writes) == (checkpoints, writes)
    target = Harness(FAST, spec(fake), tmp_path / "unused.sqlite", checkpoint_url=pg_url)
    await target.start()
    harnesses.append(target)
    assert await target.message_count("t1") == messages
