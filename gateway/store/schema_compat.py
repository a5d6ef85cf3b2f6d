"""Which daemons may write the gateway database: its schema version and the oldest writer it allows.

Why apart from the steps (gateway/store/schema.py): during a rolling upgrade (docs/scale-out.md,
"Upgrading with no downtime") daemons of two versions share one PostgreSQL database. The newer one
runs the new steps at its start; the older ones keep running, and must learn whether what they
write is still right. They cannot learn it from the steps: an older daemon does not have them.
So the database says it, in terms every daemon from this one on reads the same way:

- **The version** (``PRAGMA user_version`` on SQLite, the row of ``chital_schema`` on PostgreSQL):
  how far the steps went.
- **The floor** (``schema_floor``): one row per step that daemons knowing only the steps before it
  must not write beside (a step made with ``older_writers=False``: a column whose meaning changed,
  a state value older code would write wrong). The floor is the highest such step, 0 when none:
  a daemon that understands fewer steps than the floor writes nothing more. A step that only adds
  (a table, a nullable column, an index) leaves it where it was, and older daemons go on.

The row is written in the step's own transaction, so the version and the floor never disagree. The
table starts empty (no step has raised it), which also keeps ``chital migrate`` from seeing a new
PostgreSQL database as "already has data".

A daemon checks at start (:func:`gateway.store.schema.migrate`: refused with :func:`refusal`'s line
when the floor is above it, allowed with :func:`newer_note`'s when only additive steps are) and,
several on one database, on every lease renewal (gateway/daemon/cluster.py), never per message.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from gateway.store.connection import POSTGRES, Connection

PG_VERSION_TABLE = "CREATE TABLE IF NOT EXISTS chital_schema (version INTEGER NOT NULL)"
"""PostgreSQL has no ``user_version``: the version is the one row of this table."""

FLOOR_TABLE = """CREATE TABLE IF NOT EXISTS schema_floor (
    version INTEGER PRIMARY KEY,
    what TEXT NOT NULL,
    raised_by TEXT NOT NULL,
    raised REAL NOT NULL
)"""
"""One row per step older daemons must not write beside: its version, what it does, and the Chital
release that ran it (what the refusal tells the operator to upgrade to)."""

FLOOR_SINCE = 15
"""The step that made ``schema_floor`` (gateway/store/schema.py); before it there is no floor."""


@dataclass(frozen=True, slots=True)
class SchemaState:
    """What the database says of its schema."""

    version: int
    """How far the steps went."""
    floor: int = 0
    """The oldest schema version a daemon may understand and still write (0: any)."""
    what: str = ""
    """The step that raised the floor to where it is ("" when none did)."""
    raised_by: str = ""
    """The Chital release that ran that step."""


def release() -> str:
    """This Chital's release, as the refusal line names it."""
    try:
        return importlib.metadata.version("chital")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
        return "unknown"


async def user_version(db: Connection) -> int:
    if db.dialect == POSTGRES:
        async with db.execute("SELECT MAX(version) FROM chital_schema") as cur:
            row = await cur.fetchone()
        return int(row[0]) if row and row[0] is not None else 0
    async with db.execute("PRAGMA user_version") as cur:
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def read_state(db: Connection) -> SchemaState:
    """The version and the floor, as committed now: two one-row reads (every lease renewal makes
    them). A database whose steps stopped before the floor existed has floor 0."""
    version = await user_version(db)
    if version < FLOOR_SINCE:
        return SchemaState(version)
    sql = "SELECT version, what, raised_by FROM schema_floor ORDER BY version DESC LIMIT 1"
    async with db.execute(sql) as cur:
        row = await cur.fetchone()
    if row is None:
        return SchemaState(version)
    return SchemaState(version, int(row[0]), str(row[1]), str(row[2]))


async def raise_floor(db: Connection, version: int, what: str, now: float) -> None:
    """Inside step ``version``'s transaction: daemons that understand less may write no more."""
    await db.execute(
        "INSERT OR IGNORE INTO schema_floor(version, what, raised_by, raised) VALUES (?, ?, ?, ?)",
        (version, what, release(), now),
    )


def refusal(state: SchemaState, known: int) -> str | None:
    """The line a daemon that understands schema ``known`` says when it must not write to a
    database in ``state`` (None: it may). The operator reads what to run instead and why."""
    if state.floor <= known:
        return None
    needs = f"Chital ≥ {state.raised_by}" if state.raised_by else "a newer Chital"
    return (
        f"database schema version {state.version} needs {needs} (schema {state.floor}: {state.what}); "
        f"this daemon is Chital {release()} and understands schema {known}: it writes nothing more, "
        "stopping intake (upgrade it)"
    )


def newer_note(state: SchemaState, known: int) -> str | None:
    """The line for a database newer than this daemon whose newer steps all keep older writers
    right (None when it is not newer, or when :func:`refusal` applies instead)."""
    if state.version <= known or state.floor > known:
        return None
    return (
        f"database schema version {state.version} is newer than this daemon's {known}; its steps since "
        "only add, so this daemon goes on (upgrade it when you can)"
    )
