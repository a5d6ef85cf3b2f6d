"""The gateway's durable state in SQLite: journal, outbox, threads, pairing.

One SQLite connection in WAL mode with ``synchronous=NORMAL``, in autocommit and run inline on the
event loop (gateway/store/db.py ``SqliteConnection``; PostgreSQL through the same protocol,
gateway/store/connection.py): a write is committed when its ``await`` returns, and a
committed row survives ``kill -9`` of the daemon (only an OS crash can lose the last transactions),
which is the failure this journal guards against, at a fraction of the cost of an fsync per message.

Everything the gateway keeps goes through the methods below, on either engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from channels.base import Inbound
from gateway.config.urls import database_label
from gateway.store.access import AccessTables
from gateway.store.approvals import ApprovalTables
from gateway.store.background import BackgroundTables
from gateway.store.busy import BusyTables
from gateway.store.choices import ChoiceTables
from gateway.store.connection import Connection, Dialect
from gateway.store.console import ConsoleQueries
from gateway.store.db import PgConnection, SqliteConnection
from gateway.store.disk import DEFAULT_RESERVE, DiskReserve, StorageFull, is_full
from gateway.store.entries import (
    OPEN_STATES,
    AtClaim,
    JournalEntry,
    JournalKind,
    JournalState,
    conversation_of,
    inbound_from_json,
    inbound_to_json,
)
from gateway.store.grants import GrantTables
from gateway.store.leases import LeaseTables
from gateway.store.schedules import ScheduleTables
from gateway.store.schema import migrate
from gateway.store.schema_compat import SchemaState, read_state
from gateway.store.upkeep import FileUpkeep
from gateway.store.usage import ModelUsageTables
from gateway.store.voice import VoiceTables
from gateway.store.webchat import WebChatTables

if TYPE_CHECKING:
    from gateway.config.sections import StorageConfig

log = logging.getLogger(__name__)

THREAD_CACHE_MAX = 10_000
"""Conversations whose thread id is cached in memory before the cache is emptied."""


_OPEN_SQL = ", ".join(f"'{state.value}'" for state in OPEN_STATES)


class Store(
    AccessTables,
    ScheduleTables,
    ApprovalTables,
    ModelUsageTables,
    LeaseTables,
    BusyTables,
    BackgroundTables,
    VoiceTables,
    GrantTables,
    ChoiceTables,
    FileUpkeep,
    ConsoleQueries,
    WebChatTables,
):
    """The gateway's state on SQLite or PostgreSQL (any :class:`Connection`). Create with
    :meth:`open` or :meth:`open_postgres`."""

    def __init__(self, db: Connection, path: Path, reserve: DiskReserve | None = None) -> None:
        self._db = db
        self.path = path
        self.reserve = reserve or DiskReserve(path.parent, 0)
        self.disk_full = False
        """True while the reserve is spent (health shows it)."""
        self._threads: dict[str, str] = {}
        """conversation → thread id, read through: one daemon owns its SQLite file."""
        self._dm_chats: dict[str, str] = {}
        self.schema = SchemaState(0)
        """The schema version and writer floor as last read (at open, then on each lease renewal)."""

    @property
    def dialect(self) -> Dialect:
        """The engine the store's connection speaks (set when the connection was made)."""
        return self._db.dialect

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
            store = cls(db, path, reserve)
            store.schema = await read_state(db)
        except BaseException:
            await db.close()
            raise
        return store

    @classmethod
    async def open_postgres(cls, url: str) -> Store:
        """The same store on PostgreSQL (docs/scale-out.md): statements are rewritten by
        :mod:`gateway.store.db`; there is no disk reserve (the database server owns its disk)."""
        db = await PgConnection.connect(url)
        try:
            await migrate(db)
            await db.load_keys()
            store = cls(db, Path(database_label(url)))
            store.schema = await read_state(db)
        except BaseException:
            await db.close()
            raise
        return store

    async def close(self) -> None:
        await self._db.close()

    async def schema_state(self) -> SchemaState:
        """The schema version and writer floor as committed now (gateway/store/schema_compat.py)."""
        self.schema = await read_state(self._db)
        return self.schema

    async def _write(
        self,
        sql: str,
        params: tuple[Any, ...] = (),
        *,
        many: list[tuple[Any, ...]] | None = None,
        locks: Sequence[str] = (),
    ) -> int:
        """Execute one statement and commit it; returns the row count. With ``many``: the
        statement once per row of parameters, all in one transaction; returns the rows. With
        ``locks``: while no other daemon writes under one of those names (a limit's count and
        insert as one step, :meth:`~gateway.store.connection.Connection.execute_locked`).

        On "database or disk is full" the reserve is given back once and the write retried, so
        the journal keeps working while the disk is full; only when that is not enough does the
        caller get :class:`StorageFull`."""
        for attempt in (1, 2):
            try:
                if many is not None:
                    await self._db.executemany(sql, many)
                    return len(many)
                if locks:
                    cur = await self._db.execute_locked(locks, sql, params)
                else:
                    cur = await self._db.execute(sql, params)
                await self._db.commit()
                return cur.rowcount
            except sqlite3.OperationalError as exc:
                with contextlib.suppress(Exception):
                    await self._db.rollback()
                if not is_full(exc):
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
            (inbound.key, conversation_of(inbound), JournalKind(kind).value, payload,
             JournalState.PENDING.value, now, now, owner, until),
        )  # fmt: skip
        return count == 1

    async def journal_add_leased(
        self,
        inbound: Inbound,
        kind: JournalKind | str,
        note: str = "",
        lease: tuple[str, float] | None = None,
    ) -> tuple[bool, bool]:
        """:meth:`journal_add`, and whether the entry got ``lease``: a turn gets it only when that
        daemon could claim it now (no open turn of its conversation is anybody's but that daemon's
        live one, as :meth:`lease_claim` decides). The check is part of the insert, so a message
        that must wait behind another daemon's turn costs no claim that fails and no lease given
        back: the daemon finishing that turn hands it on (:meth:`lease_claim_next`), or a sweep
        takes it."""
        fresh, leased, _ = await self.journal_add_turn(inbound, kind, note, lease)
        return fresh, leased

    async def journal_add_turn(
        self,
        inbound: Inbound,
        kind: JournalKind | str,
        note: str = "",
        lease: tuple[str, float] | None = None,
        start: bool = False,
    ) -> tuple[bool, bool, AtClaim | None]:
        """:meth:`journal_add_leased`; ``start``: a turn that will start here at once if it gets
        the lease is also claimed by the insert when no other turn of its conversation is open
        (:meth:`lease_intake`): the third value is then what its claim would have returned
        (``entry.at_claim``), and the entry is running already (``entry.started``)."""
        kind = JournalKind(kind)
        if lease is None or kind is not JournalKind.TURN:
            fresh = await self.journal_add(inbound, kind, note, lease)
            return fresh, fresh and lease is not None, None
        now = time.time()
        row = (inbound.key, conversation_of(inbound), kind.value, inbound_to_json(inbound, note), now)
        return await self.lease_intake(row, lease, inbound.conversation if start else None)

    async def journal_seen(self, key: str) -> bool:
        async with self._db.execute("SELECT 1 FROM journal WHERE key = ?", (key,)) as cur:
            return await cur.fetchone() is not None

    async def journal_set(self, key: str, state: JournalState | str) -> None:
        state = JournalState(state)  # a misspelt state fails here, not as an entry never resumed
        extra = ", attempts = attempts + 1" if state is JournalState.RUNNING else ""
        await self._write(
            f"UPDATE journal SET state = ?, updated = ?{extra} WHERE key = ?", (state.value, time.time(), key)
        )

    async def journal_done(self, key: str, look_next: bool = False) -> bool:
        """Mark ``key`` done. With ``look_next`` (several daemons), in the same statement: True when
        a later turn of its conversation waits with no live lease (journaled by another daemon
        while this one ran: :meth:`journal_add_leased`), for this daemon to hand it on to itself
        (:meth:`lease_claim_next`). Without it the same as ``journal_set(key, DONE)``."""
        if not look_next:
            await self.journal_set(key, JournalState.DONE)
            return False
        async with self._db.execute(
            "UPDATE journal SET state = ?, updated = ? WHERE key = ? RETURNING EXISTS (SELECT 1 FROM"
            " journal AS e WHERE e.conversation = journal.conversation AND e.kind = 'turn'"
            " AND e.key <> journal.key"
            f" AND e.state IN ({_OPEN_SQL}) AND COALESCE(e.lease_until, 0) < ?)",
            (JournalState.DONE.value, time.time(), key, time.time()),
        ) as cur:
            row = await cur.fetchone()
        await self._db.commit()
        return bool(row and row[0])

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
        """The agent thread of ``conversation``, made on first use (and kept in the cache)."""
        found = await self.thread_get(conversation)
        if found is None:
            return await self.new_thread(conversation)
        self._threads[conversation] = found
        return found

    async def thread_get(self, conversation: str) -> str | None:
        """The agent thread of ``conversation`` if it has one (the cache is read, not filled: intake
        asks this of every unaddressed group message)."""
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

    # -- retention (docs/durability.md) ------------------------------------------------------------
    async def pairing_prune(self, older_than: float) -> int:
        """Delete pairing requests older than ``older_than`` seconds, answered or not: a flood of
        strangers must not grow the table without bound. A code's own validity (checked when it
        is approved) is shorter; whoever writes again simply gets a new code."""
        with self._db.on_thread():
            cur = await self._db.execute("DELETE FROM pairing WHERE created < ?", (time.time() - older_than,))
        await self._db.commit()
        return cur.rowcount

    def trim_caches(self, max_threads: int = THREAD_CACHE_MAX) -> int:
        """Empty the conversation → thread cache once it holds more than ``max_threads`` entries
        (it is read-through, so the cost is one query per conversation afterwards); without this
        it would hold every conversation the daemon ever saw. Returns how many were dropped."""
        count = len(self._threads)
        if count <= max_threads:
            return 0
        self._threads.clear()
        return count


async def open_store(storage: StorageConfig) -> Store:
    """The gateway's store as configured: PostgreSQL when a URL is set, else SQLite under
    ``storage.path``."""
    url = storage.database_url
    if url:
        return await Store.open_postgres(url)
    return await Store.open(storage.path / "gateway.sqlite", storage.reserve_mb << 20)
