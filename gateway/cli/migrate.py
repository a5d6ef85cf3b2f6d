"""``chital migrate``: move a SQLite deployment's state into PostgreSQL.

What moves: every table of ``gateway.sqlite`` (the list is read from the file's schema, brought to
this version's first, so a table added later moves too), the agent's LangGraph checkpoints
(``checkpoints.sqlite``) and its long-term memory (``memory.sqlite``). The target gets this
version's schema the way a daemon would make it (:meth:`Store.open_postgres`, LangGraph's own
``setup()``), so the daemon started on it afterwards finds nothing to create.

The SQLite files are never written: each is copied first with SQLite's backup API from a read-only
connection (a consistent snapshot, including what a killed daemon left in its WAL), and the copy is
what gets migrated forward and read. Why the savers' API for the agent's state rather than a table
copy: the two savers lay their tables out differently (PostgreSQL keeps channel values as separate
blobs per version), and the messages live in a ``DeltaChannel`` whose history is rebuilt from every
ancestor checkpoint and its writes, so each checkpoint goes over whole, with its parent link and its
writes (LangGraph's ``copy_thread`` contract asks the same of a copy).

Resumable: each gateway table is copied in one transaction together with a row in
``chital_migration`` that says it is done; the agent's state is written with the savers' upserts
and marked done once complete. A re-run after a crash skips what is marked and redoes the rest; a
re-run after success changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compat import langgraph as langgraph_compat
from gateway.cli.common import add_command, load_config_arg
from gateway.config.urls import is_postgres_url
from gateway.daemon.lifecycle import redact_url
from gateway.daemon.status import (
    socket_answers,  # the probe start-up uses against a second daemon
    socket_path,
)

MARKS = (
    "CREATE TABLE IF NOT EXISTS chital_migration (part TEXT PRIMARY KEY, source TEXT NOT NULL,"
    " copied BIGINT NOT NULL, finished DOUBLE PRECISION NOT NULL)"
)
"""One row per part copied (``table:<name>``, ``checkpoints``, ``memory``): what a re-run skips."""
AGENT_TABLES = langgraph_compat.POSTGRES_TABLES
"""LangGraph's tables whose rows mean the target already holds an agent's state."""
BATCH = 1000

Say = Callable[[str], None]


class Refused(Exception):
    """Why the command will not run (one line; nothing was written)."""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _snapshot(src: Path, dst: Path) -> bool:
    """Copy the database ``src`` to ``dst`` without writing to ``src``; False when it does not exist."""
    if not src.is_file():
        return False
    # A WAL file beside it (a daemon killed without its last checkpoint) holds committed rows, so
    # read through it (a read-only connection still needs its -shm). Without one, everything is in
    # the file, and ``immutable`` reads it without creating -wal/-shm next to it.
    wal = Path(f"{src}-wal")
    mode = "mode=ro" if wal.exists() and wal.stat().st_size else "immutable=1"
    with (
        contextlib.closing(sqlite3.connect(f"{src.resolve().as_uri()}?{mode}", uri=True)) as source,
        contextlib.closing(sqlite3.connect(dst)) as copy,
    ):
        source.backup(copy)
    return True


# -- the gateway's tables ------------------------------------------------------------------------------
def _tables(db: sqlite3.Connection) -> list[str]:
    rows = db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
    )
    return [str(name) for (name,) in rows]


async def _pg_columns(pg: Any, table: str) -> dict[str, bool]:
    """Column → whether it is an identity column (``INTEGER PRIMARY KEY AUTOINCREMENT``)."""
    cur = await pg.execute(
        "SELECT column_name, is_identity FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s",
        (table,),
    )
    return {str(name): ident == "YES" for name, ident in await cur.fetchall()}


async def _copy_table(src: sqlite3.Connection, pg: Any, table: str, source: str) -> int:
    """All rows of ``table`` in their SQLite order (the journal is read back in ``rowid`` order),
    in one transaction with the mark that says it is done."""
    target = await _pg_columns(pg, table)
    if not target:
        raise Refused(f"table {table} is not in the target's schema (is this Chital older than the file?)")
    columns = [str(row[1]) for row in src.execute(f"PRAGMA table_info({_quote(table)})")]
    missing = [c for c in columns if c not in target]
    if missing:
        raise Refused(f"table {table}: the target has no column {', '.join(missing)}")
    names = ", ".join(map(_quote, columns))
    marks = ", ".join(["%s"] * len(columns))
    insert = f"INSERT INTO {_quote(table)} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING"
    rows = src.execute(f"SELECT {names} FROM {_quote(table)} ORDER BY rowid")
    copied = 0
    async with pg.transaction():
        while batch := rows.fetchmany(BATCH):
            async with pg.cursor() as cur:
                await cur.executemany(insert, batch)
            copied += len(batch)
        for column in (c for c, identity in target.items() if identity and c in columns):
            # The identity goes on after the highest id ever given (SQLite's AUTOINCREMENT never
            # reuses a deleted one), not from 1 into the copied rows.
            (top,) = src.execute(f"SELECT MAX({_quote(column)}) FROM {_quote(table)}").fetchone()
            with contextlib.suppress(sqlite3.OperationalError):  # no sqlite_sequence: nothing used
                row = src.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
                top = max(int(top or 0), int(row[0]) if row else 0)
            if top:
                await pg.execute(
                    "SELECT setval(pg_get_serial_sequence(%s, %s), %s)", (_quote(table), column, int(top))
                )
        await _mark(pg, f"table:{table}", source, copied)
    return copied


# -- the agent's state ---------------------------------------------------------------------------------
async def _copy_checkpoints(path: Path, url: str) -> tuple[int, int, int]:
    """Every checkpoint of every thread and namespace, with its parent and its pending writes.
    Returns (checkpoints, writes, threads)."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from agent.postgres import postgres_checkpointer

    conn = sqlite3.connect(path, check_same_thread=False)
    target, close = await postgres_checkpointer(url, max_size=2)
    try:
        source = SqliteSaver(conn)
        source.setup()  # the copy, brought to this version's tables
        checkpoints = writes = 0
        threads: set[str] = set()
        for item in source.list(None):
            conf = item.config["configurable"]
            thread, ns, cid = conf["thread_id"], conf.get("checkpoint_ns", ""), conf["checkpoint_id"]
            put_conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
            if item.parent_config is not None:
                put_conf["checkpoint_id"] = item.parent_config["configurable"]["checkpoint_id"]
            checkpoint = item.checkpoint
            # Blobs only for the values this checkpoint holds: a channel it does not hold (a
            # DeltaChannel between snapshots) is rebuilt from the writes, as on SQLite.
            versions = {
                k: v for k, v in checkpoint["channel_versions"].items() if k in checkpoint["channel_values"]
            }
            await target.aput({"configurable": put_conf}, checkpoint, item.metadata, versions)
            by_task: dict[str, list[tuple[str, Any]]] = {}
            for task_id, channel, value in item.pending_writes or ():
                by_task.setdefault(task_id, []).append((channel, value))
            # Each write's task_path (the public ``list`` does not return it): compat/langgraph.py.
            paths = langgraph_compat.task_paths(conn, thread, ns, cid) if by_task else {}
            own = {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": cid}}
            for task_id, task_writes in by_task.items():
                await target.aput_writes(own, task_writes, task_id, paths.get(task_id, ""))
                writes += len(task_writes)
            checkpoints += 1
            threads.add(thread)
        return checkpoints, writes, len(threads)
    finally:
        await close()
        conn.close()


async def _copy_memory(path: Path, url: str) -> tuple[int, int]:
    """Every item of every namespace (facts and the turns still waiting for extraction), values as
    they are: the facts' own timestamps live in them. Returns (items, namespaces)."""
    import aiosqlite
    from langgraph.store.base import PutOp
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    from agent.postgres import postgres_store

    conn = await aiosqlite.connect(str(path), isolation_level=None)
    target, close = await postgres_store(url, max_size=2)
    try:
        source = AsyncSqliteStore(conn)
        await source.setup()
        namespaces: list[tuple[str, ...]] = []
        while page := await source.alist_namespaces(limit=BATCH, offset=len(namespaces)):
            namespaces += page
        items = 0
        for ns in namespaces:
            offset = 0
            while found := await source.asearch(ns, limit=BATCH, offset=offset):
                offset += len(found)
                ops = [PutOp(ns, i.key, i.value, index=False) for i in found if tuple(i.namespace) == ns]
                if ops:
                    await target.abatch(ops)
                items += len(ops)
        return items, len(namespaces)
    finally:
        await close()
        await conn.close()


# -- the command ---------------------------------------------------------------------------------------
async def _mark(pg: Any, part: str, source: str, copied: int) -> None:
    await pg.execute(
        "INSERT INTO chital_migration (part, source, copied, finished) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (part) DO UPDATE SET source = EXCLUDED.source, copied = EXCLUDED.copied,"
        " finished = EXCLUDED.finished",
        (part, source, copied, time.time()),
    )


async def _has_rows(pg: Any, table: str) -> bool:
    cur = await pg.execute("SELECT to_regclass(%s) IS NOT NULL", (_quote(table),))
    row = await cur.fetchone()
    if not row or not row[0]:
        return False
    cur = await pg.execute(f"SELECT EXISTS (SELECT 1 FROM {_quote(table)})")
    row = await cur.fetchone()
    return bool(row and row[0])


async def migrate(data_dir: Path, memory_db: Path, url: str, *, force: bool, say: Say) -> None:
    """Copy what ``data_dir`` (an absolute path) holds into the database at ``url`` (see the module
    docstring)."""
    import psycopg

    from gateway.store.journal import Store

    if socket_answers(socket_path(data_dir)):
        raise Refused(f"a daemon is running on {data_dir} (its status socket answers): stop it first")
    if not (data_dir / "gateway.sqlite").is_file():
        raise Refused(f"no gateway.sqlite in {data_dir}: nothing to migrate (see storage.path)")
    source = str(data_dir)
    say(f"migrating {source} (SQLite) → {redact_url(url)}")
    target = await Store.open_postgres(url)  # this version's schema, as a daemon would make it
    await target.close()
    with tempfile.TemporaryDirectory(prefix=".migrate-", dir=data_dir) as tmp:
        copy = Path(tmp) / "gateway.sqlite"
        _snapshot(data_dir / "gateway.sqlite", copy)
        await (await Store.open(copy, reserve_bytes=0)).close()  # the copy brought to this version
        src = sqlite3.connect(copy)
        pg = await psycopg.AsyncConnection.connect(url, autocommit=True)
        try:
            await pg.execute(MARKS)
            cur = await pg.execute("SELECT part, source, copied FROM chital_migration")
            marks = {str(p): (str(s), int(n)) for p, s, n in await cur.fetchall()}
            tables = _tables(src)
            resuming = bool(marks) and all(s == source for s, _ in marks.values())
            if not resuming:
                full = [t for t in (*tables, *AGENT_TABLES) if await _has_rows(pg, t)]
                if full and not force:
                    raise Refused(
                        f"the target already has data (in {', '.join(full)}); pass --force to copy into it"
                        " anyway (rows whose keys it already has are kept as they are)"
                    )
            elif len(marks) < len(tables) + 2:
                say("resuming an earlier run: what it finished is kept")
            width = max(map(len, (*tables, "checkpoints")))
            for table in tables:
                done = marks.get(f"table:{table}")
                if done and done[0] == source:
                    say(f"  {table:<{width}}  {done[1]:>8} rows (copied before)")
                    continue
                say(f"  {table:<{width}}  {await _copy_table(src, pg, table, source):>8} rows")

            for part, name, run in (
                ("checkpoints", "checkpoints.sqlite", _checkpoint_part),
                ("memory", memory_db.name, _memory_part),
            ):
                done = marks.get(part)
                if done and done[0] == source:
                    say(f"  {part:<{width}}  {done[1]:>8} (copied before)")
                    continue
                original = memory_db if part == "memory" else data_dir / name
                snap = Path(tmp) / f"{part}.sqlite"
                if not _snapshot(original, snap):
                    say(f"  {part:<{width}}  {'none':>8} ({original} does not exist)")
                    await _mark(pg, part, source, 0)
                    continue
                count, line = await run(snap, url)
                await _mark(pg, part, source, count)
                say(f"  {part:<{width}}  {line}")
        finally:
            src.close()
            await pg.close()
    say(
        "done; the SQLite files are unchanged. Start the daemon with storage.url (or $CHITAL_DATABASE_URL)"
        " set to this database."
    )


async def _checkpoint_part(path: Path, url: str) -> tuple[int, str]:
    checkpoints, writes, threads = await _copy_checkpoints(path, url)
    return checkpoints, f"{checkpoints:>8} checkpoints, {writes} writes, {threads} threads"


async def _memory_part(path: Path, url: str) -> tuple[int, str]:
    items, namespaces = await _copy_memory(path, url)
    return items, f"{items:>8} items in {namespaces} namespaces"


def cmd_migrate(args: argparse.Namespace) -> int:
    cfg = load_config_arg(args)
    url = args.to or cfg.storage.database_url
    if not url:
        print("chital: migrate: no target: pass --to URL or set storage.url", file=sys.stderr)
        return 2
    if not is_postgres_url(url):
        print("chital: migrate: --to must be a postgresql://… URL", file=sys.stderr)
        return 2
    data_dir = cfg.storage.path.resolve()
    memory_db = cfg.agent.memory.db_path or data_dir / "memory.sqlite"
    try:
        asyncio.run(migrate(data_dir, Path(memory_db), url, force=args.force, say=print))
    except Refused as exc:
        print(f"chital: migrate: {exc}", file=sys.stderr)
        return 1
    except (OSError, sqlite3.Error) as exc:
        print(f"chital: migrate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # psycopg's errors: one line, the URL's password masked
        if type(exc).__module__.split(".")[0] != "psycopg":
            raise
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"chital: migrate: {redact_url(url)}: {reason}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: Any) -> None:
    parser = add_command(
        sub,
        "migrate",
        "copy a SQLite deployment's state into PostgreSQL",
        cmd_migrate,
        description="Copy the gateway's tables, the agent's checkpoints and its memory from the SQLite"
        " files under storage.path into PostgreSQL (docs/scale-out.md). Stop the daemon first. The"
        " SQLite files are left as they are; a re-run after an interruption finishes the copy.",
    )
    parser.add_argument(
        "--to", metavar="URL", help="postgresql://… (default: storage.url, else $CHITAL_DATABASE_URL)"
    )
    parser.add_argument(
        "--force", action="store_true", help="copy even when the target database already holds data"
    )
