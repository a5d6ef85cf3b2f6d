"""Nothing grows without bound: the journal, outbox, file and pairing rows are pruned after the
retention period, the database file gives the space back, and the in-memory maps keep their caps."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

from channels.base import Capabilities, Inbound
from gateway.config.sections import StorageConfig
from gateway.delivery.pacing import PacerPool
from gateway.store.journal import Store
from gateway.store.retention import Retention
from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.gateway_rig import TEST_POSTGRES, daemon_rows, skip_on_postgres, store_at
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

DAY = 86_400.0


def message(i: int, chat: str = "42") -> Inbound:
    return Inbound(
        platform="telegram",
        chat_id=chat,
        message_id=str(i),
        sender_id="42",
        text=f"message {i} " + "x" * 300,
        is_direct=True,
        addressed=True,
    )


async def add_finished(store: Store, i: int, state: str = "done", files: bool = False) -> str:
    inbound = message(i)
    assert await store.journal_add(inbound, "turn")
    await store.outbox_put(inbound.key, 0, f"m{i}")
    await store.outbox_put(inbound.key, 1, f"m{i}b")
    if files:
        await store.files_add(inbound.key, f"/mnt/user-data/outputs/{i}.txt", "")
    await store.journal_set(inbound.key, state)
    return inbound.key


async def age(store: Store, seconds: float, table: str = "journal", column: str = "updated") -> None:
    """Pretend every row of ``table`` was last touched ``seconds`` ago."""
    await store._db.execute(f"UPDATE {table} SET {column} = ?", (time.time() - seconds,))
    await store._db.commit()


async def test_prune_drops_old_finished_entries_only(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    try:
        old_done = await add_finished(store, 1, "done", files=True)
        old_failed = await add_finished(store, 2, "failed")
        pending = message(3)
        await store.journal_add(pending, "turn")
        running = message(4)
        await store.journal_add(running, "turn")
        await store.journal_set(running.key, "running")
        await store.outbox_put(running.key, 0, "half-sent")
        await age(store, 10 * DAY)
        recent = await add_finished(store, 5, "done")

        assert await store.journal_prune(7 * DAY) == 2
        counts = await store.journal_counts()
        assert counts == {"pending": 1, "running": 1, "done": 1}, "open entries are kept however old"
        assert await store.outbox_get(old_done) == {} and await store.outbox_get(old_failed) == {}
        assert await store.files_get(old_done) == []
        assert await store.outbox_get(running.key) == {0: "half-sent"}, "a resumed turn still edits its reply"
        assert await store.outbox_get(recent) == {0: "m5", 1: "m5b"}
        # Inside the window a redelivery is still recognised; the kept entry is not re-journaled.
        assert not await store.journal_add(message(5), "turn")
    finally:
        await store.close()


async def test_prune_works_in_batches(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    try:
        for i in range(2_500):
            await add_finished(store, i)
        await age(store, 30 * DAY)
        assert await store.journal_prune(7 * DAY, batch=700) == 2_500
        info = await store.size_info()
        assert info["rows_journal"] == 0 and info["rows_outbox"] == 0
    finally:
        await store.close()


@skip_on_postgres("SQLite's file size and auto_vacuum (PostgreSQL's autovacuum owns its disk)")
async def test_database_file_shrinks_after_pruning(tmp_path: Path) -> None:
    """An existing database (made without auto_vacuum) is converted once; freed pages go back."""
    store = await store_at(tmp_path / "g.sqlite")
    try:
        assert await store.vacuum_mode() == "none"
        for i in range(3_000):
            await add_finished(store, i)
        await store.shrink()
        full = (await store.size_info())["file_bytes"]
        assert full > 1_000_000

        retention = Retention(store, StorageConfig(retention_days=7))
        await age(store, 30 * DAY)
        await retention.start()  # prune, convert, shrink
        assert await store.vacuum_mode() == "incremental"
        info = await store.size_info()
        assert info["rows_journal"] == 0
        assert info["file_bytes"] < full / 10, info
        assert info["wal_bytes"] == 0

        # Once converted, each timed prune gives the space back by itself.
        for i in range(3_000, 6_000):
            await add_finished(store, i)
        await store.shrink()
        grown = (await store.size_info())["file_bytes"]
        await age(store, 30 * DAY)
        report = await retention.prune_once()
        assert report.journal == 3_000 and report.pages_freed > 0
        assert (await store.size_info())["file_bytes"] < grown / 10
    finally:
        await store.close()


async def test_pairing_requests_are_pruned_after_their_retention(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    try:
        now = time.time()
        rows = [("OLDCODE1", "telegram:1", now - 3 * DAY), ("NEWCODE1", "telegram:2", now - 60)]
        for code, user, created in rows:
            await store._db.execute(
                "INSERT INTO pairing(code, user, name, created) VALUES (?, ?, 'x', ?)", (code, user, created)
            )
        await store._db.commit()
        retention = Retention(store, StorageConfig(pairing_retention_hours=24))
        report = await retention.prune_once()
        assert report.pairing == 1
        async with store._db.execute("SELECT code FROM pairing") as cur:
            assert [r[0] for r in await cur.fetchall()] == ["NEWCODE1"]
    finally:
        await store.close()


def test_pairing_cutoff_outlasts_a_long_code_ttl() -> None:
    """A denial is remembered for one code TTL after the code's own: never pruned before that."""
    store = object.__new__(Store)
    retention = Retention(store, StorageConfig(pairing_retention_hours=24), code_ttls=[3600, 3 * DAY])
    assert retention.pairing_for == 6 * DAY
    assert Retention(store, StorageConfig(pairing_retention_hours=24), code_ttls=[3600]).pairing_for == DAY


# -- in-memory caps --------------------------------------------------------------------------------
async def test_thread_cache_is_capped(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    try:
        ids = {f"telegram:{i}": await store.thread_for(f"telegram:{i}") for i in range(120)}
        for conversation in ids:  # read back once: now cached
            assert await store.thread_for(conversation) == ids[conversation]
        assert store.trim_caches(max_threads=500) == 0
        assert store.trim_caches(max_threads=100) == 120
        assert len(store._threads) == 0
        assert await store.thread_for("telegram:7") == ids["telegram:7"], "read through after the trim"
    finally:
        await store.close()


async def test_pacer_pool_is_capped_under_a_flood_of_chats() -> None:
    caps = Capabilities(max_message_len=4096, edit_interval=1.0, can_edit=True)
    pool = PacerPool(idle_ttl=600.0, max_pacers=1_000)
    busy = pool.get("telegram", "busy-chat", caps, lambda: None)
    async with busy._lock:  # a send in flight in this chat
        for i in range(25_000):
            pool.get("telegram", f"stranger-{i}", caps, lambda: None)
            assert len(pool) <= 1_000
        assert pool.get("telegram", "busy-chat", caps, lambda: None) is busy, "a busy pacer is never dropped"
    recent = pool.get("telegram", "stranger-24999", caps, lambda: None)
    assert pool.get("telegram", "stranger-24999", caps, lambda: None) is recent


# -- the daemon prunes on its own ------------------------------------------------------------------
async def test_daemon_prunes_on_a_timer(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> None:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"]["telegram"] = tg.channel_settings(poll_timeout=1)
    cfg["access"] = {"allow_users": ["1001"]}
    cfg["storage"].update({"retention_days": 2 / DAY, "prune_interval": 0.5})  # 2 s, pruned twice a second
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        for i in range(5):
            up = tg.inject_message(1001, 1001, f"hello {i}")
            mid = up["message"]["message_id"]
            await tg.wait_for(
                lambda mid=mid, i=i: any(
                    m.reply_to == mid and f"echo: hello {i}" in m.text for m in tg.bot_messages(1001)
                ),
                timeout=20,
                what=f"answer {i}",
            )

        def journal_rows() -> int:
            return int(daemon_rows(d.config["storage"], "SELECT COUNT(*) FROM journal")[0][0])

        assert journal_rows() >= 5
        deadline = time.monotonic() + 20
        while journal_rows() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert journal_rows() == 0, d.logs()
        metrics = await d.metrics()
        pruned = re.search(r'chital_pruned_rows_total\{table="journal"\} ([0-9.]+)', metrics)
        assert pruned and float(pruned.group(1)) >= 5
        if not TEST_POSTGRES:  # the SQLite file's size (PostgreSQL's disk is the server's)
            assert re.search(r"chital_db_bytes [1-9]", metrics)
        assert re.search(r"pruned [1-9][0-9]* journal entries", d.logs())
        assert await d.terminate() == 0
    finally:
        await d.close()
