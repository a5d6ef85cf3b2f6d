"""``conversation_voice`` (gateway/store/voice.py) reached by upgrading: a database left at schema
step 11 (before spoken replies) goes through step 12 (standing approvals) and 13 with its rows kept,
and the mode is then stored, replaced and forgotten. Runs on SQLite and, with
``CHITAL_TEST_POSTGRES=1``, on PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from gateway.store.connection import Connection
from gateway.store.db import PgConnection, SqliteConnection
from gateway.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate, user_version
from tests.fakes.gateway_rig import TEST_POSTGRES, store_at, test_database_url


async def connect(path: Path) -> Connection:
    if TEST_POSTGRES:
        return await PgConnection.connect(test_database_url(path))
    return await SqliteConnection.connect(path)


async def test_a_database_at_step_11_is_upgraded_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "g.sqlite"
    db = await connect(path)
    try:
        await migrate(db, MIGRATIONS[:11])
        assert await user_version(db) == 11
        async with db.transaction():
            await db.execute("INSERT INTO threads VALUES ('telegram:42', 'thread-1', 1.0)")
    finally:
        await db.close()

    store = await store_at(path)
    try:
        assert SCHEMA_VERSION >= 13 and await user_version(store._db) == SCHEMA_VERSION
        assert await store.voice_mode("telegram:42") is None, "no row: nothing is spoken"
        await store.voice_mode_set("telegram:42", "on", "telegram:7")
        await store.voice_mode_set("telegram:42", "all", "telegram:8")
        assert await store.voice_mode("telegram:42") == "all"
        async with store._db.execute("SELECT user FROM conversation_voice") as cur:
            assert [tuple(r) for r in await cur.fetchall()] == [("telegram:8",)], "who set it last"
        await store.voice_mode_set("telegram:42", None, "telegram:8")
        assert await store.voice_mode("telegram:42") is None
        async with store._db.execute(
            "SELECT thread_id FROM threads WHERE conversation = 'telegram:42'"
        ) as cur:
            assert [tuple(r) for r in await cur.fetchall()] == [("thread-1",)]
    finally:
        await store.close()
