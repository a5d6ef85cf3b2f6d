"""The gateway database's schema version and forward migrations (gateway/store/schema.py), and the
journal's enums reading the strings older versions wrote."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from channels.base import Inbound
from gateway.daemon.lifecycle import database_error
from gateway.store.connection import Connection
from gateway.store.db import SqliteConnection
from gateway.store.entries import JournalKind, JournalState
from gateway.store.journal import Store
from gateway.store.schema import MIGRATIONS, SCHEMA_VERSION, Migration, SchemaTooNew, migrate, user_version
from tests.fakes.gateway_rig import store_at

FIRST_SCHEMA = """
CREATE TABLE journal (
    key TEXT PRIMARY KEY, conversation TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL,
    state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, updated REAL NOT NULL
);
CREATE INDEX journal_open ON journal(state) WHERE state IN ('pending', 'running');
CREATE TABLE outbox (
    key TEXT NOT NULL, part INTEGER NOT NULL, message_id TEXT NOT NULL,
    text_hash TEXT NOT NULL DEFAULT '', PRIMARY KEY (key, part)
);
CREATE TABLE threads (conversation TEXT PRIMARY KEY, thread_id TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE pairing (code TEXT PRIMARY KEY, user TEXT NOT NULL UNIQUE, name TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE approved_users (user TEXT PRIMARY KEY, approved REAL NOT NULL, code TEXT);
"""
"""The schema of the first release (no files_out, command_results, dm_chats; pairing without expiry)."""

PAYLOAD = (
    '{"platform":"telegram","chat_id":"42","message_id":"7","sender_id":"42","text":"still open",'
    '"is_direct":true,"addressed":true,"thread_id":null,"sender_name":"","chat_title":"",'
    '"attachments":[],"received_at":1.0,"extra":{},"unsupported":""}'
)
TABLES = {
    "journal", "outbox", "files_out", "threads", "pairing", "approved_users", "command_results", "dm_chats",
    "schedules", "sqlite_sequence", "conversation_models", "token_usage", "approvals", "token_ledger",
    "conversation_busy",
    "background_tasks",
    "conversation_voice",
    "approval_grants",
    "approval_log",
    "choices",
    "schema_floor",
    "web_messages",
    "web_files",
}  # fmt: skip


def old_database(path: Path) -> float:
    """A database as the first release left it, with an open entry, a done one and a pairing code."""
    made = time.time() - 60
    with sqlite3.connect(path) as db:
        db.executescript(FIRST_SCHEMA)
        db.execute(
            "INSERT INTO journal VALUES ('telegram:42:7', 'telegram:42', 'turn', ?, 'running', 1, ?, ?)",
            (PAYLOAD, made, made),
        )
        db.execute(
            "INSERT INTO journal VALUES ('telegram:42:6', 'telegram:42', 'command', ?, 'done', 1, ?, ?)",
            (PAYLOAD.replace('"7"', '"6"'), made, made),
        )
        db.execute("INSERT INTO outbox(key, part, message_id) VALUES ('telegram:42:7', 0, '900')")
        db.execute("INSERT INTO pairing VALUES ('ABCDEFGH', 'telegram:5', 'Eve', ?)", (made,))
        db.execute("INSERT INTO threads VALUES ('telegram:42', 'thread-1', ?)", (made,))
    db.close()
    return made


def msg(text: str, *, mid: str) -> Inbound:
    return Inbound("telegram", "42", mid, "42", text, is_direct=True, addressed=True)


async def tables(store: Store) -> set[str]:
    async with store._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'") as cur:
        return {str(name) for (name,) in await cur.fetchall()}


async def test_a_new_database_is_at_the_current_version(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "g.sqlite", 0)
    try:
        assert SCHEMA_VERSION == len(MIGRATIONS)
        assert await user_version(store._db) == SCHEMA_VERSION
        assert await tables(store) == TABLES
    finally:
        await store.close()


async def test_a_database_of_the_first_release_is_brought_to_version_1(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite"
    made = old_database(path)
    store = await Store.open(path, 0)
    try:
        assert await user_version(store._db) == SCHEMA_VERSION
        assert await tables(store) == TABLES
        (entry,) = await store.journal_open()
        assert (entry.key, entry.kind, entry.state, entry.attempts) == ("telegram:42:7", "turn", "running", 1)
        assert entry.kind is JournalKind.TURN and entry.state is JournalState.RUNNING
        assert entry.inbound.text == "still open"
        assert await store.journal_counts() == {"done": 1, "running": 1}
        assert await store.outbox_get("telegram:42:7") == {0: "900"}
        assert await store.thread_get("telegram:42") == "thread-1"
        (request,) = await store.pairing_list()
        assert request.expires == pytest.approx(made + 3600) and request.chat_id == "" and not request.denied
        await store.files_add("telegram:42:7", "/out/a", "")  # the new tables work
        await store.dm_chat_remember("telegram:1", "1")
        assert await store.command_result_put("k", "v") == ("v", pytest.approx(time.time(), abs=5))
    finally:
        await store.close()


async def test_an_unversioned_database_of_the_current_shape_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite"
    store = await Store.open(path, 0)
    msg_store_rows = await _fill(store)
    await store._db.execute("PRAGMA user_version = 0")  # as every file made before versioning
    await store._db.commit()
    await store.close()

    store = await Store.open(path, 0)
    try:
        assert await user_version(store._db) == SCHEMA_VERSION
        assert await _rows(store) == msg_store_rows
    finally:
        await store.close()


async def test_the_baseline_step_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite"
    old_database(path)
    db = await SqliteConnection.connect(path)
    try:
        await migrate(db)
        for _ in range(2):  # a step re-run (after a crash before its commit) changes nothing
            await MIGRATIONS[0].run(db)
            await db.commit()
        assert await migrate(db) == SCHEMA_VERSION, "already current: nothing to run"
        async with db.execute("PRAGMA table_info(pairing)") as cur:
            columns = [row[1] for row in await cur.fetchall()]
        assert columns == ["code", "user", "name", "created", "expires", "chat_id", "denied"]
    finally:
        await db.close()


async def test_a_failing_step_leaves_the_previous_version_and_runs_again(tmp_path: Path) -> None:
    async def broken(db: Connection) -> None:
        await db.execute("CREATE TABLE half_done (x INTEGER)")
        raise RuntimeError("disk said no")

    async def fixed(db: Connection) -> None:
        await db.execute("CREATE TABLE half_done (x INTEGER)")

    db = await SqliteConnection.connect(tmp_path / "g.sqlite")
    try:
        with pytest.raises(RuntimeError):
            await migrate(db, (*MIGRATIONS, Migration(SCHEMA_VERSION + 1, "broken", broken)))
        assert await user_version(db) == SCHEMA_VERSION
        async with db.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'") as cur:
            assert await cur.fetchone() is None, "the step's own changes were rolled back"
        fixed_step = Migration(SCHEMA_VERSION + 1, "fixed", fixed)
        assert await migrate(db, (*MIGRATIONS, fixed_step)) == SCHEMA_VERSION
        assert await user_version(db) == SCHEMA_VERSION + 1
    finally:
        await db.close()


async def test_steps_must_be_numbered_in_order(tmp_path: Path) -> None:
    db = await SqliteConnection.connect(tmp_path / "g.sqlite")
    try:
        with pytest.raises(ValueError, match="numbered"):
            await migrate(db, (Migration(2, "skips one", MIGRATIONS[0].run),))
    finally:
        await db.close()


async def test_a_database_from_a_newer_version_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(SchemaTooNew) as err:
        await Store.open(path, 0)
    line = str(database_error(path, err.value))
    assert "schema version 99 is newer" in line and "\n" not in line


async def test_vacuum_keeps_the_version(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "g.sqlite", 0)
    try:
        await store.use_incremental_vacuum()
        assert await store.vacuum_mode() == "incremental"
        assert await user_version(store._db) == SCHEMA_VERSION
    finally:
        await store.close()


# -- the journal's enums -----------------------------------------------------------------------------
def test_enum_values_are_the_stored_strings() -> None:
    assert [k.value for k in JournalKind] == ["turn", "command", "notice"]
    assert [s.value for s in JournalState] == ["pending", "running", "done", "failed", "waiting"]
    assert JournalState.DONE == "done" and f"{JournalKind.TURN}" == "turn"


async def test_the_store_takes_enums_or_their_strings_and_refuses_others(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    try:
        assert await store.journal_add(msg("a", mid="1"), JournalKind.TURN)
        assert await store.journal_add(msg("b", mid="2"), "notice", "a note")
        await store.journal_set("telegram:42:1", JournalState.DONE)
        await store.journal_set("telegram:42:2", "running")
        async with store._db.execute("SELECT key, kind, state FROM journal ORDER BY key") as cur:
            rows = [tuple(r) for r in await cur.fetchall()]
        assert rows == [("telegram:42:1", "turn", "done"), ("telegram:42:2", "notice", "running")]
        with pytest.raises(ValueError):
            await store.journal_set("telegram:42:2", "finished")
        with pytest.raises(ValueError):
            await store.journal_add(msg("c", mid="3"), "chore")
    finally:
        await store.close()


async def _fill(store: Store) -> dict[str, list[tuple[object, ...]]]:
    await store.journal_add(msg("a", mid="1"), JournalKind.TURN)
    await store.outbox_put("telegram:42:1", 0, "5")
    await store.files_add("telegram:42:1", "/out/x", "cap")
    await store.thread_for("telegram:42")
    await store.pairing_request("telegram:9", "Bob", "9", ttl=60, max_pending=5)
    await store.command_result_put("telegram:42:1", "ok")
    await store.dm_chat_remember("telegram:1", "1")
    return await _rows(store)


async def _rows(store: Store) -> dict[str, list[tuple[object, ...]]]:
    out = {}
    for table in sorted(TABLES):
        async with store._db.execute(f"SELECT * FROM {table} ORDER BY rowid") as cur:
            out[table] = [tuple(r) for r in await cur.fetchall()]
    return out
