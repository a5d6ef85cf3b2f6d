"""The gateway database's schema version and the steps that bring any older file up to it.

Why a version: the schema grew by ``CREATE TABLE IF NOT EXISTS`` and probing ``table_info`` at every
start, which only works for additions. A change that must rewrite data (a renamed column, a new
index over old rows, a changed state value) needs to know what the file already went through.

The version lives in SQLite's own header field, ``PRAGMA user_version`` (0 in any file that never
set it). :data:`MIGRATIONS` is an ordered list; step ``n`` takes a file from version ``n - 1`` to
``n``. At every start :func:`migrate` runs the steps above the file's version, each in its own
transaction together with the new ``user_version``: a crash (or a full disk) in the middle of a step
leaves the file at the previous version, and the next start runs that step again. So every step must
be idempotent against the state its transaction left behind (SQLite DDL is transactional, so that
state is simply the previous version).

Version 1 is the schema as it stood when versioning began. A file made before (``user_version`` 0)
may be of any earlier shape: tables missing (``files_out``, ``command_results``, ``dm_chats``),
``pairing`` without its later columns, or already complete. Step 1 creates what is missing and adds
what is absent, so it brings each of those shapes, and a fresh file, to the same version 1.

Adding a change: append a step, never edit a released one. A step that daemons knowing only the
earlier steps must not write beside (a changed meaning, not an addition) says ``older_writers=False``:
it raises the database's writer floor, and those daemons stop writing (gateway/store/schema_compat.py,
docs/scale-out.md "Upgrading with no downtime").
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.store.access import ACCESS_TABLES, PAIRING_COLUMNS
from gateway.store.approvals import APPROVAL_TABLES
from gateway.store.background import BACKGROUND_TABLES
from gateway.store.busy import BUSY_TABLES
from gateway.store.choices import CHOICE_TABLES
from gateway.store.connection import POSTGRES, Connection
from gateway.store.grants import GRANT_TABLES
from gateway.store.leases import LEASE_COLUMNS, LEASE_INDEX, LEASE_WORK_INDEXES
from gateway.store.schedules import LAST_RUN_COLUMNS, PROVENANCE_COLUMNS, SCHEDULE_TABLES
from gateway.store.schema_compat import (
    FLOOR_SINCE,
    FLOOR_TABLE,
    PG_VERSION_TABLE,
    newer_note,
    raise_floor,
    read_state,
    refusal,
    user_version,
)
from gateway.store.usage import USAGE_COST_COLUMNS
from gateway.store.voice import VOICE_TABLES
from gateway.store.webchat import WEB_TABLES

log = logging.getLogger(__name__)

GATEWAY_TABLES = (
    """CREATE TABLE IF NOT EXISTS journal (
    key TEXT PRIMARY KEY,
    conversation TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    updated REAL NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS journal_open ON journal(state) WHERE state IN ('pending', 'running')",
    """CREATE TABLE IF NOT EXISTS outbox (
    key TEXT NOT NULL,
    part INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    text_hash TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (key, part)
)""",
    """CREATE TABLE IF NOT EXISTS files_out (
    key TEXT NOT NULL,
    path TEXT NOT NULL,
    caption TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (key, path)
)""",
    """CREATE TABLE IF NOT EXISTS threads (
    conversation TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    created REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS pairing (
    code TEXT PRIMARY KEY,
    user TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    created REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS approved_users (
    user TEXT PRIMARY KEY,
    approved REAL NOT NULL,
    code TEXT
)""",
)
"""One statement each: a step runs statement by statement inside its transaction
(``executescript`` would commit half-way)."""


class SchemaTooNew(sqlite3.DatabaseError):
    """The file was written by a newer Chital whose steps this one must not write beside (the
    writer floor is above it). Starting anyway could write rows wrong, so the daemon refuses; as a
    ``DatabaseError`` it ends in the usual one-line start-up error."""


Step = Callable[[Connection], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    """The ``user_version`` the file has once this step is done."""
    what: str
    run: Step
    older_writers: bool = True
    """Daemons that know only the steps before this one may go on writing once it ran (it only
    adds). False raises the writer floor to this step (gateway/store/schema_compat.py)."""


async def _columns(db: Connection, table: str) -> set[str]:
    if db.dialect == POSTGRES:
        sql = "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        async with db.execute(f"{sql} AND table_name = ?", (table,)) as cur:
            return {str(row[0]) for row in await cur.fetchall()}
    async with db.execute(f"PRAGMA table_info({table})") as cur:
        return {str(row[1]) for row in await cur.fetchall()}


async def _v1_baseline(db: Connection) -> None:
    """Any pre-versioning file (or a new one) → the schema of version 1."""
    for statement in (*GATEWAY_TABLES, *ACCESS_TABLES):
        await db.execute(statement)
    have = await _columns(db, "pairing")
    for name, decl in PAIRING_COLUMNS.items():
        if name not in have:
            await db.execute(f"ALTER TABLE pairing ADD COLUMN {name} {decl}")
    # Codes from before expiry existed get the default hour from when they were made.
    await db.execute("UPDATE pairing SET expires = created + 3600 WHERE expires = 0")


async def _v2_schedules(db: Connection) -> None:
    """The ``schedules`` table (gateway/store/schedules.py)."""
    for statement in SCHEDULE_TABLES:
        await db.execute(statement)


MODELS_USAGE_TABLES = (
    """CREATE TABLE IF NOT EXISTS conversation_models (
    conversation TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    user TEXT NOT NULL,
    updated REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS token_usage (
    user TEXT NOT NULL,
    day TEXT NOT NULL,
    conversation TEXT NOT NULL,
    model TEXT NOT NULL,
    purpose TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    calls INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user, day, conversation, model, purpose)
)""",
    "CREATE INDEX IF NOT EXISTS token_usage_day ON token_usage(day)",
)
"""A conversation's chosen model (``/model``, gateway/intake/profiles.py) and token usage summed per
user, day, conversation, model and purpose (gateway/store/usage.py): one row per combination and day,
not per call, so the table stays small however busy the bot is."""


async def _v3_models_usage(db: Connection) -> None:
    for statement in MODELS_USAGE_TABLES:
        await db.execute(statement)


async def _v4_approvals(db: Connection) -> None:
    """The ``approvals`` table (gateway/store/approvals.py)."""
    for statement in APPROVAL_TABLES:
        await db.execute(statement)


async def _v5_leases(db: Connection) -> None:
    """Journal leases for several daemons on one database (gateway/store/leases.py)."""
    have = await _columns(db, "journal")
    for name, decl in LEASE_COLUMNS.items():
        if name not in have:
            await db.execute(f"ALTER TABLE journal ADD COLUMN {name} {decl}")
    await db.execute(LEASE_INDEX)


BUDGET_LEDGER_TABLE = """CREATE TABLE IF NOT EXISTS token_ledger (
    user TEXT NOT NULL,
    day TEXT NOT NULL,
    used INTEGER NOT NULL DEFAULT 0,
    held INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (user, day)
)"""
"""Per user and day: the tokens spent and those held for calls in flight, for users with a budget
(gateway/turns/budget.py). One row per user and day, so the check before a model call is one atomic
``UPDATE`` on both engines, shared by every daemon on the database."""


async def _v6_budget_ledger(db: Connection) -> None:
    """``token_ledger``, and ``token_usage.estimated_tokens``: the part of a row's tokens that are
    our estimate because the provider reported none (gateway/turns/usage.py)."""
    if "estimated_tokens" not in await _columns(db, "token_usage"):
        await db.execute("ALTER TABLE token_usage ADD COLUMN estimated_tokens INTEGER NOT NULL DEFAULT 0")
    await db.execute(BUDGET_LEDGER_TABLE)


async def _v7_schedule_provenance(db: Connection) -> None:
    """Schedules remember the untrusted sources they were made after, and who confirmed them
    (gateway/store/schedules.py). Existing rows stay untainted: NULL."""
    have = await _columns(db, "schedules")
    for name, decl in PROVENANCE_COLUMNS.items():
        if name not in have:
            await db.execute(f"ALTER TABLE schedules ADD COLUMN {name} {decl}")


async def _v8_busy_modes(db: Connection) -> None:
    """``conversation_busy``: the busy mode ``/busy`` chose per conversation (gateway/store/busy.py)."""
    for statement in BUSY_TABLES:
        await db.execute(statement)


async def _v9_background_tasks(db: Connection) -> None:
    """The ``background_tasks`` table (gateway/store/background.py)."""
    for statement in BACKGROUND_TABLES:
        await db.execute(statement)


async def _v10_schedule_last_run(db: Connection) -> None:
    """Schedules remember when they last ran and whether that run was silent (gateway/turns/quiet.py)."""
    have = await _columns(db, "schedules")
    for name, decl in LAST_RUN_COLUMNS.items():
        if name not in have:
            await db.execute(f"ALTER TABLE schedules ADD COLUMN {name} {decl}")


async def _v11_usage_cost(db: Connection) -> None:
    """Usage in money: cached and unpriced tokens and the cost per usage row, money in the budget
    ledger (gateway/store/usage.py, gateway/turns/pricing.py)."""
    for (table, name), decl in USAGE_COST_COLUMNS.items():
        if name not in await _columns(db, table):
            await db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
            if name == "unpriced_tokens":  # recorded without a cost: unknown, never 0
                await db.execute("UPDATE token_usage SET unpriced_tokens = prompt_tokens + completion_tokens")


async def _v12_approval_grants(db: Connection) -> None:
    """Standing permissions ("Allow here", "Always") and the approvals' decision log
    (gateway/store/grants.py)."""
    for statement in GRANT_TABLES:
        await db.execute(statement)


async def _v13_voice_modes(db: Connection) -> None:
    """``conversation_voice``: spoken replies per conversation, as ``/voice`` chose
    (gateway/store/voice.py)."""
    for statement in VOICE_TABLES:
        await db.execute(statement)


async def _v14_choices(db: Connection) -> None:
    """The ``choices`` table: questions asked with options as buttons (gateway/store/choices.py)."""
    for statement in CHOICE_TABLES:
        await db.execute(statement)


async def _v15_schema_floor(db: Connection) -> None:
    """``schema_floor``: the oldest schema a daemon may understand and still write (rolling upgrades,
    gateway/store/schema_compat.py). Empty: no step so far needs more than its own version."""
    await db.execute(FLOOR_TABLE)


async def _v16_web_chat(db: Connection) -> None:
    """The web chat's messages and files (gateway/store/webchat.py)."""
    for statement in WEB_TABLES:
        await db.execute(statement)


async def _v17_lease_indexes(db: Connection) -> None:
    """The open entries by lease owner and by lease expiry (gateway/store/leases.py): a heartbeat and
    a sweep read their own few rows, not every open entry of every daemon."""
    for statement in LEASE_WORK_INDEXES:
        await db.execute(statement)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "baseline: journal, outbox, files, threads, pairing (with expiry), access", _v1_baseline),
    Migration(2, "schedules", _v2_schedules),
    Migration(3, "conversation models and token usage", _v3_models_usage),
    Migration(4, "approvals", _v4_approvals),
    Migration(5, "journal leases (several daemons on one database)", _v5_leases),
    Migration(6, "token budget ledger and estimated usage", _v6_budget_ledger),
    Migration(7, "schedule provenance and confirmation", _v7_schedule_provenance),
    Migration(8, "busy mode per conversation", _v8_busy_modes),
    Migration(9, "background tasks", _v9_background_tasks),
    Migration(10, "schedules' last run (posted or silent)", _v10_schedule_last_run),
    Migration(11, "usage in money: cached and unpriced tokens, cost, money in the ledger", _v11_usage_cost),
    Migration(12, "standing approvals and the approvals' decision log", _v12_approval_grants),
    Migration(13, "spoken replies per conversation", _v13_voice_modes),
    Migration(14, "questions with options as buttons", _v14_choices),
    Migration(FLOOR_SINCE, "the writer floor (rolling upgrades)", _v15_schema_floor),
    Migration(16, "the web chat's messages and files", _v16_web_chat),
    Migration(
        17, "journal indexes by lease owner and expiry (coordination flat in daemons)", _v17_lease_indexes
    ),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def known_version() -> int:
    """The schema this daemon understands: the last of :data:`MIGRATIONS` as it is now (read at
    the call, so a test's launcher that appends a step makes a daemon of the next version)."""
    return MIGRATIONS[-1].version


PG_MIGRATION_LOCK = 0x43484954414C
"""The advisory lock key ("CHITAL") daemons starting together take around each schema step."""


async def migrate(db: Connection, steps: Sequence[Migration] | None = None) -> int:
    """Bring the file up to the last of ``steps`` (default: :data:`MIGRATIONS`); returns the
    version it had before.

    Each step and its ``user_version`` commit together (``BEGIN IMMEDIATE``: no other writer can
    slip in between reading the version and writing the next one). A file already past them is
    accepted when its newer steps all let older daemons write (:func:`_check_newer`)."""
    steps = MIGRATIONS if steps is None else steps
    for i, step in enumerate(steps, start=1):
        if step.version != i:
            raise ValueError(f"migration steps must be numbered 1, 2, ...; step {i} says {step.version}")
    target = steps[-1].version if steps else 0
    if db.dialect == POSTGRES:
        return await _migrate_postgres(db, steps, target)
    start = await user_version(db)
    if start > target:
        return await _check_newer(db, target)
    await db.commit()  # a step's BEGIN must not nest in an implicit transaction
    ran: list[Migration] = []
    for step in steps[start:]:
        try:
            async with db.transaction():  # BEGIN IMMEDIATE on SQLite
                await step.run(db)
                if not step.older_writers:
                    await raise_floor(db, step.version, step.what, time.time())
                await db.execute(f"PRAGMA user_version = {int(step.version)}")
        except BaseException:
            _log_migrated(start, ran)
            raise
        ran.append(step)
    _log_migrated(start, ran)
    return start


async def _check_newer(db: Connection, known: int) -> int:
    """A database a newer Chital migrated (a rolling upgrade under way, or a downgrade): refused
    with the floor's line when one of its newer steps must not be written beside, else accepted
    with a warning (those steps only add). Returns the database's version."""
    try:
        state = await read_state(db)
    except Exception as exc:  # no floor where there must be one: not a file we can judge
        raise SchemaTooNew(
            f"database schema version {await user_version(db)} is newer than this Chital understands"
            f" ({known}) and does not say which daemons may write it ({type(exc).__name__}); run the"
            " newer version, or restore a backup"
        ) from exc
    refused = refusal(state, known)
    if refused is not None:
        raise SchemaTooNew(refused)
    log.warning("%s", newer_note(state, known))
    return state.version


def _log_migrated(start: int, ran: Sequence[Migration]) -> None:
    """One line for what a start did to the schema (none when it was current): a new database is
    "created", an older one names the steps it went through."""
    if not ran:
        return
    if start == 0:
        log.info("database schema created (version %d)", ran[-1].version)
    else:
        steps = "; ".join(f"{m.version}: {m.what}" for m in ran)
        log.info("database schema migrated from version %d to %d (%s)", start, ran[-1].version, steps)


async def _migrate_postgres(db: Connection, steps: Sequence[Migration], target: int) -> int:
    """The same steps on PostgreSQL (their statements rewritten by gateway/store/db.py). Several daemons
    may start at once: each step runs under a transaction-scoped advisory lock and re-reads the
    version inside it, so exactly one of them runs it; PostgreSQL's DDL is transactional too."""
    async with db.transaction():
        # Under the lock too: two CREATE TABLE IF NOT EXISTS at once can both try to create it.
        await db.execute("SELECT pg_advisory_xact_lock(?)", (PG_MIGRATION_LOCK,))
        await db.execute(PG_VERSION_TABLE)
    start = await user_version(db)
    if start > target:
        return await _check_newer(db, target)
    ran: list[Migration] = []
    for step in steps[start:]:
        async with db.transaction():
            await db.execute("SELECT pg_advisory_xact_lock(?)", (PG_MIGRATION_LOCK,))
            if await user_version(db) >= step.version:
                continue  # another daemon ran it while we waited for the lock
            await step.run(db)
            if not step.older_writers:
                await raise_floor(db, step.version, step.what, time.time())
            await db.execute("DELETE FROM chital_schema")
            await db.execute("INSERT INTO chital_schema(version) VALUES (?)", (step.version,))
        ran.append(step)
    _log_migrated(start, ran)
    return start
