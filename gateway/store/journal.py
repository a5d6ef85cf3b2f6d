"""The gateway's durable state in SQLite: journal, outbox, threads, pairing.

One SQLite connection in WAL mode with ``synchronous=NORMAL``, in autocommit and run inline on the
event loop (gateway/store/db.py ``SqliteConnection``): a write is committed when its ``await`` returns, and a
committed row survives ``kill -9`` of the daemon (only an OS crash can lose the last transactions),
which is the failure this journal guards against, at a fraction of the cost of an fsync per message.

The class is the seam for a later Postgres store: the gateway only calls the methods below.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import json
import logging
import os
import sqlite3
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from channels.base import Attachment, Inbound
from gateway.store.access import AccessTables
from gateway.store.approvals import ApprovalTables
from gateway.store.db import POSTGRES, SQLITE, PgConnection, SqliteConnection, database_label
from gateway.store.leases import LeaseTables
from gateway.store.schedules import ScheduleTables
from gateway.store.schema import migrate
from gateway.turns.usage import ModelUsageTables

if TYPE_CHECKING:
    from gateway.config.schema import StorageConfig

log = logging.getLogger(__name__)

WAL_SIZE_LIMIT = 8 * 1024 * 1024
"""What the WAL file may keep after a checkpoint (SQLite's default keeps its largest size forever);
about two auto-checkpoints' worth (1,000 pages each)."""
THREAD_CACHE_MAX = 10_000
"""Conversations whose thread id is cached in memory before the cache is emptied."""
RESERVE_NAME = ".chital-reserve"
DEFAULT_RESERVE = 64 * 1024 * 1024
"""Disk space kept aside in the data dir for the journal itself (see :class:`DiskReserve`)."""


class StorageFull(Exception):
    """The disk under the data dir is full, even after giving up the reserve."""


class DiskReserve:
    """A file of pre-allocated blocks beside the database, given back when SQLite finds the disk
    full, so the journal can still record what is going on (a turn's failure, new messages) while
    an operator frees space. Re-taken once there is room again.

    Why a file and not a free-space check: anything on the same filesystem (a sandbox, logs,
    another program) can fill it between two checks; blocks we already own cannot be taken."""

    def __init__(self, folder: Path, size: int) -> None:
        self.path = folder / RESERVE_NAME
        self.size = size

    def take(self) -> bool:
        """Allocate the reserve if it is missing; False when the disk has no room for it."""
        if self.size <= 0:
            return True
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_size >= self.size:
                return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
            return True
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            return False

    def release(self) -> bool:
        """Give the reserved blocks back; True when there was something to give."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        return True


def _is_full(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "full" in str(exc).lower()


class JournalKind(enum.StrEnum):
    """What a journal entry asks of the gateway (stored as its value: the strings never change)."""

    TURN = "turn"
    """A message for the agent."""
    COMMAND = "command"
    """A chat command (gateway/commands/builtin.py)."""
    NOTICE = "notice"
    """A fixed reply: pairing, refusals, notes about what could not be used."""


class JournalState(enum.StrEnum):
    """Where an entry is: ``pending`` → ``running`` → ``done`` or ``failed``; a delivery retry
    puts it back to ``pending``. Stored as its value (older rows read unchanged)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    WAITING = "waiting"
    """The turn paused for a person's approval (gateway/turns/approvals.py resumes it): not resumed at
    start-up like an open entry; the approvals table holds what it waits for."""


OPEN_STATES = (JournalState.PENDING, JournalState.RUNNING)
"""States a restart resumes and retention never prunes."""
_OPEN_SQL = ", ".join(f"'{state.value}'" for state in OPEN_STATES)


@dataclass(slots=True)
class JournalEntry:
    key: str
    conversation: str
    kind: JournalKind
    inbound: Inbound
    state: JournalState
    attempts: int = 0
    note: str = ""
    """For ``notice`` entries: the text to send."""
    from_journal: bool = False
    """Read back from the journal at start-up (a previous run may have sent part of its reply)."""

    @classmethod
    def new(cls, inbound: Inbound, kind: JournalKind, note: str = "") -> JournalEntry:
        """The entry :meth:`Store.journal_add` just recorded for ``inbound`` (pending)."""
        return cls(inbound.key, inbound.conversation, kind, inbound, JournalState.PENDING, note=note)


def inbound_to_json(inbound: Inbound, note: str = "") -> str:
    data = asdict(inbound)
    data["attachments"] = [asdict(a) for a in inbound.attachments]
    if note:
        data["_note"] = note
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def inbound_from_json(raw: str) -> tuple[Inbound, str]:
    data: dict[str, Any] = json.loads(raw)
    note = data.pop("_note", "")
    data["attachments"] = tuple(Attachment(**a) for a in data.get("attachments", ()))
    return Inbound(**data), note


class Store(AccessTables, ScheduleTables, ApprovalTables, ModelUsageTables, LeaseTables):
    """SQLite-backed gateway state. Create with :meth:`open`."""

    def __init__(self, db: SqliteConnection, path: Path, reserve: DiskReserve | None = None) -> None:
        self._db = db
        self.path = path
        self.reserve = reserve or DiskReserve(path.parent, 0)
        self.disk_full = False
        """True while the reserve is spent (health shows it)."""
        self._threads: dict[str, str] = {}
        """conversation → thread id, read through: one daemon owns its SQLite file."""
        self._dm_chats: dict[str, str] = {}
        self.dialect = SQLITE

    @classmethod
    async def open(cls, path: Path, reserve_bytes: int = DEFAULT_RESERVE) -> Store:
        from gateway.config.data_dir import create_private, make_private_dir

        make_private_dir(path.parent)
        create_private(path)  # 0600 before SQLite opens it: its -wal and -shm take the same mode
        reserve = DiskReserve(path.parent, reserve_bytes)
        if not reserve.take():
            log.critical("the disk under %s is full: no room for the database's reserve", path.parent)
        db = await SqliteConnection.connect(path)
        try:
            with db.on_thread():  # a step may rewrite a large table; the loop serves /healthz meanwhile
                await migrate(db)
        except BaseException:
            await db.close()
            raise
        return cls(db, path, reserve)

    @classmethod
    async def open_postgres(cls, url: str) -> Store:
        """The same store on PostgreSQL (docs/scale-out.md): statements are rewritten by
        :mod:`gateway.store.db`; there is no disk reserve (the database server owns its disk)."""
        db = await PgConnection.connect(url)
        try:
            await migrate(db)  # type: ignore[arg-type]  # PgConnection speaks the same calls
            await db.load_keys()
        except BaseException:
            await db.close()
            raise
        store = cls(db, Path(database_label(url)))  # type: ignore[arg-type]
        store.dialect = POSTGRES
        return store

    async def close(self) -> None:
        await self._db.close()

    async def _write(
        self, sql: str, params: tuple[Any, ...] = (), *, many: list[tuple[Any, ...]] | None = None
    ) -> int:
        """Execute one statement and commit it; returns the row count. With ``many``: the
        statement once per row of parameters, all in one transaction; returns the rows.

        On "database or disk is full" the reserve is given back once and the write retried, so
        the journal keeps working while the disk is full; only when that is not enough does the
        caller get :class:`StorageFull`."""
        for attempt in (1, 2):
            try:
                if many is not None:
                    await self._db.executemany(sql, many)
                    return len(many)
                cur = await self._db.execute(sql, params)
                await self._db.commit()
                return cur.rowcount
            except sqlite3.OperationalError as exc:
                with contextlib.suppress(Exception):
                    await self._db.rollback()
                if not _is_full(exc):
                    raise
                if attempt == 1 and self.reserve.release():
                    self.disk_full = True
                    log.critical(
                        "the disk under %s is full: released the database's reserve to keep the "
                        "journal going; free some space (sandboxes, logs) soon",
                        self.path.parent,
                    )
                    continue
                raise StorageFull("the disk under the data directory is full") from exc
        raise AssertionError("unreachable")

    async def retake_reserve(self) -> bool:
        """Called on a timer: once there is room again, hold the reserve again."""
        if not self.disk_full:
            return True
        if await asyncio.to_thread(self.reserve.take):
            self.disk_full = False
            log.warning("disk space is back: the database's reserve is held again")
        return not self.disk_full

    # -- journal --------------------------------------------------------------------------------
    async def journal_add(
        self,
        inbound: Inbound,
        kind: JournalKind | str,
        note: str = "",
        lease: tuple[str, float] | None = None,
    ) -> bool:
        """Record a message durably. Returns False when the key is already journaled (redelivery).
        ``lease`` (node, seconds): the entry is that daemon's from the start (gateway/daemon/cluster.py)."""
        now = time.time()
        payload = inbound_to_json(inbound, note)
        owner, until = (lease[0], now + lease[1]) if lease else (None, None)
        count = await self._write(
            "INSERT OR IGNORE INTO journal(key, conversation, kind, payload, state, created, updated,"
            " lease_owner, lease_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (inbound.key, inbound.conversation, JournalKind(kind).value, payload, JournalState.PENDING.value,
             now, now, owner, until),
        )  # fmt: skip
        return count == 1

    async def journal_seen(self, key: str) -> bool:
        async with self._db.execute("SELECT 1 FROM journal WHERE key = ?", (key,)) as cur:
            return await cur.fetchone() is not None

    async def journal_set(self, key: str, state: JournalState | str) -> None:
        state = JournalState(state)  # a misspelt state fails here, not as an entry never resumed
        extra = ", attempts = attempts + 1" if state is JournalState.RUNNING else ""
        await self._write(
            f"UPDATE journal SET state = ?, updated = ?{extra} WHERE key = ?", (state.value, time.time(), key)
        )

    async def journal_stop(self, entry: JournalEntry, note: str) -> bool:
        """The user stopped the turn ``entry``: from now on the entry is a pending notice whose
        text is ``note``, so whatever happens next (the turn's own "Stopped", or a kill -9 and a
        restart that delivers the notice through the outbox) the outcome is that note, once, and
        the turn never runs again. False when the entry is no longer an open turn (answered)."""
        count = await self._write(
            "UPDATE journal SET kind = ?, payload = ?, state = ?, updated = ?"
            f" WHERE key = ? AND kind = ? AND state IN ({_OPEN_SQL})",
            (JournalKind.NOTICE.value, inbound_to_json(entry.inbound, note), JournalState.PENDING.value,
             time.time(), entry.key, JournalKind.TURN.value),
        )  # fmt: skip
        return count == 1

    async def journal_retry(self, key: str) -> None:
        """Back to pending after a delivery failure, which does not count as a run of the agent."""
        await self._write(
            "UPDATE journal SET state = ?, updated = ?, attempts = MAX(attempts - 1, 0) WHERE key = ?",
            (JournalState.PENDING.value, time.time(), key),
        )

    async def journal_open(self) -> list[JournalEntry]:
        """Entries not finished, oldest first: what a restart must resume."""
        async with self._db.execute(
            "SELECT key, conversation, kind, payload, state, attempts FROM journal"
            f" WHERE state IN ({_OPEN_SQL}) ORDER BY created, rowid"
        ) as cur:
            rows = await cur.fetchall()
        out = []
        for key, conv, kind, payload, state, attempts in rows:
            inbound, note = inbound_from_json(payload)
            entry = JournalEntry(
                key, conv, JournalKind(kind), inbound, JournalState(state), attempts, note, from_journal=True
            )
            out.append(entry)
        return out

    async def journal_counts(self) -> dict[str, int]:
        with self._db.on_thread():  # reads the whole journal
            async with self._db.execute("SELECT state, COUNT(*) FROM journal GROUP BY state") as cur:
                return {state: n for state, n in await cur.fetchall()}

    async def journal_prune(self, older_than: float, batch: int = 2000) -> int:
        """Drop finished entries (with their outbox, file and command-result rows) untouched for
        ``older_than`` seconds; open ones (pending, running) are never dropped, however old.
        Returns how many entries went.

        In batches of ``batch`` keys, each committed on its own: intake shares this connection, and
        one DELETE of a month of messages would hold it (and SQLite's write lock) for seconds. The
        outbox and file rows go first, so a crash between two statements leaves at worst a journal
        row without its outbox rows, which the next prune removes. On SQLite the statements run
        on a worker thread (a batch deletes thousands of rows: ~100 ms held on the loop)."""
        with self._db.on_thread():
            return await self._journal_prune(time.time() - older_than, batch)

    async def _journal_prune(self, cutoff: float, batch: int) -> int:
        done = f"updated < ? AND state NOT IN ({_OPEN_SQL})"
        total = 0
        while True:
            select = f"SELECT key FROM journal WHERE {done} LIMIT ?"
            async with self._db.execute(select, (cutoff, batch)) as cur:
                keys = [str(k) for (k,) in await cur.fetchall()]
            if keys:
                marks = ",".join("?" * len(keys))
                for table in ("outbox", "files_out"):
                    await self._db.execute(f"DELETE FROM {table} WHERE key IN ({marks})", keys)
                cur = await self._db.execute(
                    f"DELETE FROM journal WHERE key IN ({marks}) AND {done}", (*keys, cutoff)
                )
                await self._db.commit()
                total += cur.rowcount
            if len(keys) < batch:
                break
            await asyncio.sleep(0)  # let intake in between batches
        await self._prune_command_results(cutoff)
        return total

    async def _prune_command_results(self, cutoff: float) -> None:
        """Results of commands left behind (a crash between the reply and their drop), older than
        the cutoff and not of an open entry. The table belongs to :mod:`gateway.store.access`."""
        await self._db.execute(
            "DELETE FROM command_results WHERE created < ? AND key NOT IN"
            f" (SELECT key FROM journal WHERE state IN ({_OPEN_SQL}))",
            (cutoff,),
        )
        await self._db.commit()

    # -- outbox ---------------------------------------------------------------------------------
    async def outbox_get(self, key: str) -> dict[int, str]:
        async with self._db.execute("SELECT part, message_id FROM outbox WHERE key = ?", (key,)) as cur:
            return {part: mid for part, mid in await cur.fetchall()}

    async def outbox_put(self, key: str, part: int, message_id: str) -> None:
        await self._write(
            "INSERT OR REPLACE INTO outbox(key, part, message_id) VALUES (?, ?, ?)", (key, part, message_id)
        )

    async def outbox_drop(self, key: str, part: int) -> None:
        """Forget a part's row (a send marked in advance that the platform refused)."""
        await self._write("DELETE FROM outbox WHERE key = ? AND part = ?", (key, part))

    # -- files a turn presented ----------------------------------------------------------------
    async def files_add(self, key: str, path: str, caption: str) -> None:
        """Record a file the agent presented for ``key``'s reply (once per path), before it is
        sent: a turn replayed after a crash then still delivers it."""
        await self._write(
            "INSERT OR IGNORE INTO files_out(key, path, caption) VALUES (?, ?, ?)", (key, path, caption)
        )

    async def files_get(self, key: str) -> list[tuple[str, str]]:
        """(path, caption) of the files presented for ``key``, in the order they were presented."""
        async with self._db.execute(
            "SELECT path, caption FROM files_out WHERE key = ? ORDER BY rowid", (key,)
        ) as cur:
            return [(str(p), str(c)) for p, c in await cur.fetchall()]

    # -- conversations → agent threads ------------------------------------------------------------
    async def thread_for(self, conversation: str) -> str:
        cached = self._threads.get(conversation)
        if cached is not None:
            return cached
        async with self._db.execute(
            "SELECT thread_id FROM threads WHERE conversation = ?", (conversation,)
        ) as cur:
            row = await cur.fetchone()
        if row:
            self._threads[conversation] = str(row[0])
            return str(row[0])
        return await self.new_thread(conversation)

    async def thread_get(self, conversation: str) -> str | None:
        cached = self._threads.get(conversation)
        if cached is not None:
            return cached
        async with self._db.execute(
            "SELECT thread_id FROM threads WHERE conversation = ?", (conversation,)
        ) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def new_thread(self, conversation: str, key: str | None = None) -> str:
        """Give ``conversation`` a fresh agent thread.

        With ``key`` (the journal key of the ``/new`` asking for it) it happens once per key: the
        new id is recorded under the key first, in one statement, and a re-run (resume after a
        crash, a delivery retry) finds and reuses it. The thread row is then set only if it is
        older than that record, so a re-run never takes the chat back from a later ``/new``."""
        if key is None:
            thread_id, created = uuid.uuid4().hex, time.time()
        else:
            thread_id, created = await self.command_result_put(key, uuid.uuid4().hex)
        await self._write(
            "INSERT INTO threads(conversation, thread_id, created) VALUES (?, ?, ?)"
            " ON CONFLICT(conversation) DO UPDATE SET thread_id = excluded.thread_id,"
            " created = excluded.created WHERE threads.created < excluded.created",
            (conversation, thread_id, created),
        )
        self._threads.pop(conversation, None)  # read back: the row may belong to a later /new
        return thread_id

    # -- retention and size (docs/durability.md) -------------------------------------------------
    async def pairing_prune(self, older_than: float) -> int:
        """Delete pairing requests older than ``older_than`` seconds, answered or not: a flood of
        strangers must not grow the table without bound. A code's own validity (checked when it
        is approved) is shorter; whoever writes again simply gets a new code."""
        with self._db.on_thread():
            cur = await self._db.execute("DELETE FROM pairing WHERE created < ?", (time.time() - older_than,))
        await self._db.commit()
        return cur.rowcount

    async def vacuum_mode(self) -> str:
        """SQLite's ``auto_vacuum`` setting: ``none``, ``full`` or ``incremental``."""
        if self.dialect == POSTGRES:
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
        if self.dialect == POSTGRES:
            return False
        await self._db.execute(f"PRAGMA journal_size_limit={int(wal_limit)}")
        if await self.vacuum_mode() == "incremental":
            return False
        await self._db.run(_vacuum_incremental)  # copies the whole file: on a thread
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
        if self.dialect == POSTGRES:
            return 0
        return await self._db.run(self._shrink_now)

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
        for name in ("page_size", "page_count", "freelist_count") if self.dialect == SQLITE else ():
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

    def trim_caches(self, max_threads: int = THREAD_CACHE_MAX) -> int:
        """Empty the conversation → thread cache once it holds more than ``max_threads`` entries
        (it is read-through, so the cost is one query per conversation afterwards); without this
        it would hold every conversation the daemon ever saw. Returns how many were dropped."""
        count = len(self._threads)
        if count <= max_threads:
            return 0
        self._threads.clear()
        return count


def _vacuum_incremental(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    try:
        conn.execute("VACUUM")
    except sqlite3.OperationalError:
        with contextlib.suppress(Exception):
            conn.execute("PRAGMA auto_vacuum=NONE")
        raise


async def open_store(storage: StorageConfig) -> Store:
    """The gateway's store as configured: PostgreSQL when a URL is set, else SQLite under
    ``storage.path``."""
    url = storage.database_url
    if url:
        return await Store.open_postgres(url)
    return await Store.open(storage.path / "gateway.sqlite", storage.reserve_mb << 20)
