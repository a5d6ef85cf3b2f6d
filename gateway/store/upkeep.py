"""SQLite's file upkeep for the store: its auto-vacuum mode, giving freed pages back to the file
system, checkpointing the WAL down, and the file's size (docs/durability.md).

A mixin of :class:`gateway.store.journal.Store`, apart from the journal's statements because none of
it is a statement of the store's tables: it works on the SQLite file itself, through
:meth:`gateway.store.db.SqliteConnection.run` (on a worker thread). On PostgreSQL the server's
autovacuum owns all of this and each call does nothing; the calls that need ``run`` narrow the
store's :class:`~gateway.store.connection.Connection` to the SQLite engine with ``isinstance``,
which is also what lets mypy check them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from pathlib import Path

from gateway.store.connection import POSTGRES, SQLITE, Connection
from gateway.store.db import SqliteConnection

log = logging.getLogger(__name__)

WAL_SIZE_LIMIT = 8 * 1024 * 1024
"""What the WAL file may keep after a checkpoint (SQLite's default keeps its largest size forever);
about two auto-checkpoints' worth (1,000 pages each)."""


class FileUpkeep:
    """Vacuum, shrink and size of the store's SQLite file (mixed into ``Store``)."""

    _db: Connection
    path: Path

    async def vacuum_mode(self) -> str:
        """SQLite's ``auto_vacuum`` setting: ``none``, ``full`` or ``incremental``."""
        if self._db.dialect == POSTGRES:
            return "postgres"  # the server's autovacuum looks after it
        async with self._db.execute("PRAGMA auto_vacuum") as cur:
            row = await cur.fetchone()
        return {0: "none", 1: "full", 2: "incremental"}.get(int(row[0]) if row else 0, "none")

    async def use_incremental_vacuum(self, wal_limit: int = WAL_SIZE_LIMIT) -> bool:
        """Switch the database to ``auto_vacuum=INCREMENTAL`` so :meth:`shrink` can give freed pages
        back to the file system; returns True when it had to convert the file.

        ``auto_vacuum`` only takes effect on an empty database or through a ``VACUUM``, and
        :meth:`open` creates the tables first, so this rewrites the file once (for a new database
        a few pages; for an old one, call it after a prune so it copies only what is kept). A
        ``VACUUM`` needs free space about the size of the database: when it fails the mode stays as
        it was and the next start tries again. Also caps what the WAL file keeps after a
        checkpoint (``journal_size_limit``), or one burst would leave a large WAL for good."""
        db = self._db
        if not isinstance(db, SqliteConnection):
            return False  # PostgreSQL: the server's autovacuum
        await db.execute(f"PRAGMA journal_size_limit={int(wal_limit)}")
        if await self.vacuum_mode() == "incremental":
            return False
        await db.run(_vacuum_incremental)  # copies the whole file: on a thread
        return await self.vacuum_mode() == "incremental"

    async def shrink(self) -> int:
        """Return the free pages to the file system (``incremental_vacuum``, only with
        :meth:`use_incremental_vacuum` on) and checkpoint the WAL down to nothing when no one reads
        it. Returns the pages released (0 when it had to wait for a better moment).

        Why one function on the shared connection, on a worker thread (``SqliteConnection.run``):
        freeing many pages and truncating the WAL can take longer than the loop may be held, and a
        second connection writing instead would make the shared one's read snapshots stale. While
        it runs every other statement waits, so nothing interleaves; the pass is skipped inside an
        explicit transaction (a schema step), and the TRUNCATE checkpoint does not wait for readers
        (which could only be this connection's own)."""
        db = self._db
        if not isinstance(db, SqliteConnection):
            return 0  # PostgreSQL: the server's autovacuum
        return await db.run(self._shrink_now)

    def _shrink_now(self, conn: sqlite3.Connection) -> int:
        if conn.in_transaction:
            return 0
        free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        incremental = int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) == 2
        released = 0
        if free and incremental:
            try:
                # sqlite3_exec (executescript) steps the pragma to the end; a cursor steps it
                # once and frees a single page.
                conn.executescript("PRAGMA incremental_vacuum;")
                released = free
            except sqlite3.OperationalError as exc:  # another process holds the lock
                log.debug("incremental vacuum postponed: %s", exc)
        timeout = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        conn.execute("PRAGMA busy_timeout=0")
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.OperationalError as exc:  # another process is reading or writing
            log.debug("WAL checkpoint postponed: %s", exc)
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(timeout)}")
        return released

    async def size_info(self) -> dict[str, int]:
        """Bytes on disk (database, WAL), pages (total, free) and rows per table."""
        info: dict[str, int] = {}
        for name in ("page_size", "page_count", "freelist_count") if self._db.dialect == SQLITE else ():
            async with self._db.execute(f"PRAGMA {name}") as cur:
                row = await cur.fetchone()
            info[name] = int(row[0]) if row else 0
        for table in ("journal", "outbox", "files_out", "threads", "pairing"):
            with self._db.on_thread():  # a count reads the whole table
                async with self._db.execute(f"SELECT COUNT(*) FROM {table}") as cur:
                    row = await cur.fetchone()
            info[f"rows_{table}"] = int(row[0]) if row else 0
        for suffix, key in (("", "file_bytes"), ("-wal", "wal_bytes")):
            try:
                info[key] = os.stat(f"{self.path}{suffix}").st_size
            except FileNotFoundError:
                info[key] = 0
        return info


def _vacuum_incremental(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    try:
        conn.execute("VACUUM")
    except sqlite3.OperationalError:
        with contextlib.suppress(Exception):
            conn.execute("PRAGMA auto_vacuum=NONE")
        raise
