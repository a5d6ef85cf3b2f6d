"""The writer floor (gateway/store/schema_compat.py) on SQLite: which daemon may write a database
that a newer Chital migrated, and the line it says when it may not.

Version N is this checkout's :data:`MIGRATIONS`; N+1 is the same list with the step the rolling
upgrade test's launcher appends (tests/upgraded_daemon.py), additive or breaking. The daemons
across processes on PostgreSQL are tests/test_rolling_upgrade.py.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from gateway.daemon.lifecycle import database_error
from gateway.store.connection import Connection
from gateway.store.db import SqliteConnection
from gateway.store.journal import Store
from gateway.store.schema import MIGRATIONS, SCHEMA_VERSION, Migration, SchemaTooNew, migrate
from gateway.store.schema_compat import SchemaState, newer_note, read_state, refusal, release
from tests.upgraded_daemon import PROBE_TABLE, next_step

N = SCHEMA_VERSION


async def _at(path: Path, steps: tuple[Migration, ...]) -> None:
    """The database at ``path`` migrated by a daemon whose steps are ``steps``."""
    db = await SqliteConnection.connect(path)
    try:
        await migrate(db, steps)
    finally:
        await db.close()


def test_the_policy_on_its_own() -> None:
    # Not newer, or newer with additive steps only: this daemon writes.
    assert refusal(SchemaState(N), N) is None and newer_note(SchemaState(N), N) is None
    assert refusal(SchemaState(N + 2, floor=N), N) is None
    note = newer_note(SchemaState(N + 2, floor=N), N)
    assert note is not None and f"version {N + 2} is newer than this daemon's {N}" in note
    # A step above what it understands raised the floor: it must not write, and says what to run.
    state = SchemaState(N + 2, floor=N + 1, what="journal states renamed", raised_by="9.9.9")
    line = refusal(state, N)
    assert line == (
        f"database schema version {N + 2} needs Chital ≥ 9.9.9 (schema {N + 1}: journal states renamed); "
        f"this daemon is Chital {release()} and understands schema {N}: it writes nothing more, "
        "stopping intake (upgrade it)"
    )
    assert newer_note(state, N) is None  # refused, not "goes on"
    assert refusal(state, N + 1) is None  # the daemon that ran the step writes on


async def test_a_new_database_has_no_floor(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "g.sqlite", 0)
    try:
        assert store.schema == SchemaState(N) and await store.schema_state() == SchemaState(N)
    finally:
        await store.close()


async def test_an_additive_step_lets_the_older_daemon_start_and_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "g.sqlite"
    await _at(path, (*MIGRATIONS, next_step(breaking=False)))
    with caplog.at_level(logging.WARNING, logger="gateway.store.schema"):
        store = await Store.open(path, 0)  # version N on a database at N+1: allowed
    try:
        assert store.schema == SchemaState(N + 1)
        assert f"database schema version {N + 1} is newer than this daemon's {N}" in caplog.text
        assert refusal(store.schema, N) is None
        thread = await store.thread_for("telegram:1")  # it writes
        assert await store.thread_get("telegram:1") == thread
    finally:
        await store.close()


async def test_a_breaking_step_raises_the_floor_and_the_older_daemon_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "g.sqlite"
    step = next_step(breaking=True)
    await _at(path, (*MIGRATIONS, step))
    with sqlite3.connect(path) as raw:
        rows = raw.execute("SELECT version, what, raised_by FROM schema_floor").fetchall()
    raw.close()
    assert rows == [(N + 1, step.what, release())]
    with pytest.raises(SchemaTooNew) as err:
        await Store.open(path, 0)
    line = str(database_error(path, err.value))
    assert "\n" not in line
    assert f"database schema version {N + 1} needs Chital ≥ {release()} (schema {N + 1}:" in line
    assert f"understands schema {N}: it writes nothing more" in line
    # The daemon of version N+1 (and later ones) opens it as usual; a later additive step keeps
    # the floor where the breaking one put it.
    later = Migration(N + 2, "another table (test)", _another)
    await _at(path, (*MIGRATIONS, step, later))
    db = await SqliteConnection.connect(path)
    try:
        state = await read_state(db)
        assert (state.version, state.floor, state.what) == (N + 2, N + 1, step.what)
        assert refusal(state, N + 1) is None and refusal(state, N) is not None
    finally:
        await db.close()


async def _another(db: Connection) -> None:
    await db.execute("CREATE TABLE IF NOT EXISTS another_probe (x INTEGER)")


async def test_a_breaking_step_that_fails_raises_nothing(tmp_path: Path) -> None:
    """The floor row goes in with the step and its version, or not at all: a step that fails
    half-way leaves neither the table it began nor a floor that would stop the older daemons."""
    path = tmp_path / "g.sqlite"

    async def half_done(db: Connection) -> None:
        await db.execute(f"CREATE TABLE {PROBE_TABLE} (name TEXT)")
        raise sqlite3.OperationalError("disk I/O error (test)")

    await _at(path, MIGRATIONS)
    with pytest.raises(sqlite3.OperationalError):
        await _at(path, (*MIGRATIONS, Migration(N + 1, "fails", half_done, older_writers=False)))
    db = await SqliteConnection.connect(path)
    try:
        assert await read_state(db) == SchemaState(N)
        async with db.execute("SELECT name FROM sqlite_master WHERE name = ?", (PROBE_TABLE,)) as cur:
            assert await cur.fetchone() is None
    finally:
        await db.close()


async def test_a_running_daemon_reads_the_floor_another_process_raised(tmp_path: Path) -> None:
    """What the cluster's heartbeat reads (:meth:`Store.schema_state`): the floor a newer daemon
    committed after this one opened the database, on the connection it already has."""
    path = tmp_path / "g.sqlite"
    store = await Store.open(path, 0)
    try:
        assert refusal(await store.schema_state(), N) is None
        await _at(path, (*MIGRATIONS, next_step(breaking=True)))  # the newer daemon starts beside it
        state = await store.schema_state()
        assert state.version == N + 1 and state.floor == N + 1 and store.schema == state
        line = refusal(state, N)
        assert line is not None and "stopping intake" in line
    finally:
        await store.close()
