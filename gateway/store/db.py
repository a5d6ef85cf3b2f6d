"""One connection API for both databases the gateway can keep its state in.

The store (gateway/store*.py) is written once, against a small connection API (aiosqlite's shape):
``execute`` (awaited, or as ``async with`` for a cursor), ``commit``, ``rollback``, ``close``.
For SQLite it is :class:`SqliteConnection`, which runs each statement inline on the event loop
(see its docstring for why). For PostgreSQL, :class:`PgConnection` offers the same calls over
psycopg and rewrites each statement from the SQLite spelling the store uses into PostgreSQL's, once
per distinct statement (cached):

- ``?`` placeholders become ``%s``;
- ``INSERT OR IGNORE`` becomes ``INSERT … ON CONFLICT DO NOTHING``, and ``INSERT OR REPLACE`` an
  upsert on the table's primary key (read from the same DDL the schema is made of);
- ``user`` (a reserved word in PostgreSQL, a column name here) is quoted;
- a two-argument ``MAX``/``MIN`` becomes ``GREATEST``/``LEAST``;
- in DDL, ``REAL`` becomes ``DOUBLE PRECISION`` (PostgreSQL's ``real`` is 4 bytes: a Unix time
  would lose its seconds), ``INTEGER`` ``BIGINT``, an ``INTEGER PRIMARY KEY AUTOINCREMENT`` an
  identity column, and every table gets the ``rowid`` column SQLite has implicitly (the store
  orders by it).

Why rewrite rather than an ORM or a query builder: the store is some sixty short statements that
already say exactly what they mean, and both engines agree on everything else they use (upserts
with ``ON CONFLICT … DO UPDATE``, partial indexes, ``RETURNING``). A rewrite that the tests run
against both engines keeps one copy of each statement.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import sqlite3
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

SQLITE = "sqlite"
POSTGRES = "postgres"


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    async def fetchone(self) -> Any: ...

    async def fetchall(self) -> Iterable[Any]: ...


def dialect_of(db: object) -> str:
    """Which engine a connection speaks (SQLite when it does not say: an aiosqlite connection)."""
    return str(getattr(db, "dialect", SQLITE))


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


_URL_SECRET_PARAMS = ("password", "sslpassword")
_QUERY_SECRET = re.compile(r"(?i)((?:^|[?&])(?:ssl)?password=)[^&#]*")


def url_passwords(url: str | None) -> list[str]:
    """The passwords a PostgreSQL URL carries, as written and decoded: its ``user:password`` part
    and libpq's ``?password=`` (and ``sslpassword``) parameters. For the log redactor."""
    if not url:
        return []
    parts = urlsplit(url)
    creds = parts.netloc.rpartition("@")[0]
    found = [creds.partition(":")[2]] if ":" in creds else []
    found += [m.group(0).split("=", 1)[1] for m in _QUERY_SECRET.finditer(parts.query)]
    found += [v for k, v in parse_qsl(parts.query) if k.lower() in _URL_SECRET_PARAMS]
    return [s for s in {*found, *map(unquote, found)} if s]


def mask_url_query(url: str) -> str:
    """``url`` with its ``?password=`` (and ``sslpassword``) parameters masked."""
    head, sep, query = url.partition("?")
    return head + sep + _QUERY_SECRET.sub(r"\1***", query) if sep else url


def database_label(url: str) -> str:
    """Where a PostgreSQL URL points, fit to show: hosts, ports and database only (no user, no
    password, no query: libpq takes ``?password=`` there too)."""
    parts = urlsplit(url)
    return parts.netloc.rpartition("@")[2] + parts.path


# -- statement rewriting ------------------------------------------------------------------------
_LITERAL = re.compile(r"('(?:[^']|'')*')")
_INSERT = re.compile(r"^\s*INSERT\s+OR\s+(IGNORE|REPLACE)\s+INTO\s+(\w+)\s*\(([^)]*)\)", re.I | re.S)
_USER = re.compile(r'(?<![\w."])user(?![\w"])', re.I)
_PAIR_FN = re.compile(r"\b(MAX|MIN)\(([^(),]+),([^(),]+)\)", re.I)
_CREATE = re.compile(r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s*\((.*)\)\s*$", re.I | re.S)
_ALTER = re.compile(r"^\s*ALTER\s+TABLE\s+\w+\s+ADD\s+COLUMN\s", re.I)
_RETURNING = re.compile(r"\s+RETURNING\s", re.I)

PRIMARY_KEYS: dict[str, tuple[str, ...]] = {}
"""Table → primary key columns, for ``INSERT OR REPLACE``: read from the catalog when a connection
opens (:meth:`PgConnection.load_keys`, after the schema steps) and learnt from every CREATE TABLE
a schema step runs."""


def _outside_literals(sql: str, fn: Any) -> str:
    parts = _LITERAL.split(sql)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def _learn_primary_key(table: str, body: str) -> None:
    m = re.search(r"PRIMARY\s+KEY\s*\(([^)]*)\)", body, re.I)
    if m:
        PRIMARY_KEYS[table] = tuple(c.strip().strip('"') for c in m.group(1).split(","))
        return
    for line in body.split(","):
        col = re.match(r"\s*(\w+)\s+\w+.*PRIMARY\s+KEY", line, re.I)
        if col:
            PRIMARY_KEYS[table] = (col.group(1),)
            return


def _types(body: str) -> str:
    identity = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
    body = re.sub(r"\bINTEGER\s+PRIMARY\s+KEY(\s+AUTOINCREMENT)?", identity, body, flags=re.I)
    body = re.sub(r"\bREAL\b", "DOUBLE PRECISION", body, flags=re.I)
    body = re.sub(r"\bINTEGER\b", "BIGINT", body, flags=re.I)
    return re.sub(r"\bBLOB\b", "BYTEA", body, flags=re.I)


def _ddl(sql: str) -> str:
    if _ALTER.match(sql):
        return _types(sql)
    m = _CREATE.match(sql)
    if m is None:
        return sql
    table, body = m.group(1), m.group(2)
    _learn_primary_key(table, body)
    body = _types(body).rstrip() + ",\n    rowid BIGINT GENERATED ALWAYS AS IDENTITY"
    return f"{sql[: m.start(2)]}{body})"


def _upsert(sql: str) -> str:
    m = _INSERT.match(sql)
    if m is None:
        return sql
    kind, table, cols = m.group(1).upper(), m.group(2), [c.strip() for c in m.group(3).split(",")]
    sql = sql[: m.start()] + f"INSERT INTO {table}({m.group(3)})" + sql[m.end() :]
    if kind == "IGNORE":
        action = " ON CONFLICT DO NOTHING"
    else:
        keys = PRIMARY_KEYS.get(table)
        if not keys:
            raise ValueError(f"INSERT OR REPLACE into {table}: its primary key is unknown")
        rest = [c for c in cols if c not in keys]
        sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in rest)
        action = f" ON CONFLICT ({', '.join(keys)}) DO " + (f"UPDATE SET {sets}" if rest else "NOTHING")
    ret = _RETURNING.search(sql)
    if ret:
        return sql[: ret.start()] + action + sql[ret.start() :]
    return sql + action


def _rewrite_plain(part: str) -> str:
    part = part.replace("%", "%%").replace("?", "%s")
    part = _USER.sub('"user"', part)
    return _PAIR_FN.sub(
        lambda m: f"{'GREATEST' if m.group(1).upper() == 'MAX' else 'LEAST'}({m.group(2)},{m.group(3)})", part
    )


@functools.lru_cache(maxsize=1024)
def to_postgres(sql: str) -> str:
    """The PostgreSQL spelling of one statement written for SQLite (see the module docstring)."""
    sql = _ddl(sql)
    sql = _upsert(sql)
    return _outside_literals(sql, _rewrite_plain)


# -- the PostgreSQL connection ---------------------------------------------------------------------
class _PgCursor:
    def __init__(self, cur: Any) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    async def fetchone(self) -> Any:
        return await self._cur.fetchone() if self._cur.description else None

    async def fetchall(self) -> list[Any]:
        return list(await self._cur.fetchall()) if self._cur.description else []


class _PgResult:
    """What :meth:`PgConnection.execute` returns: awaitable, or an ``async with`` for the cursor
    (aiosqlite's shape, so the store's statements read the same on both engines)."""

    def __init__(self, conn: PgConnection, sql: str, params: Sequence[Any]) -> None:
        self._conn, self._sql, self._params = conn, sql, params
        self._cursor: _PgCursor | None = None

    async def _run(self) -> _PgCursor:
        raw = await self._conn.live()
        cur = await raw.execute(to_postgres(self._sql), tuple(self._params) or None)
        self._cursor = _PgCursor(cur)
        return self._cursor

    def __await__(self) -> Generator[Any, None, _PgCursor]:
        return self._run().__await__()

    async def __aenter__(self) -> _PgCursor:
        return await self._run()

    async def __aexit__(self, *exc: object) -> None:
        return None


class PgConnection:
    """A psycopg connection with aiosqlite's calls (see the module docstring).

    Like the SQLite connection it replaces, one is shared by the daemon's tasks; psycopg serialises
    the statements. Unlike SQLite's implicit transactions, it runs in autocommit: each statement
    commits on its own, and ``commit``/``rollback`` have nothing to do. Why: PostgreSQL aborts a
    whole transaction on any failed statement, and on a shared connection that would fail every
    other task's statements (and roll back their work) until someone rolls back; and a read left
    "idle in transaction" would hold its locks. Every write the store makes is one statement whose
    effect stands alone (that is also what keeps it crash-safe on SQLite); where steps must go
    together (a schema step), :meth:`transaction` makes them one."""

    dialect = POSTGRES

    def __init__(self, raw: Any, url: str) -> None:
        self.raw = raw
        self.url = url
        self._reopen = asyncio.Lock()

    async def live(self) -> Any:
        """The psycopg connection, opened anew when the last one broke (the server restarted, a
        failover, the network dropped it): the statement that met the break failed, the next
        one runs on a new connection. Without this the daemon failed every statement until it
        was restarted."""
        if self.raw.closed:
            async with self._reopen:
                if self.raw.closed:
                    import psycopg

                    self.raw = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        return self.raw

    @classmethod
    async def connect(cls, url: str) -> PgConnection:
        import psycopg  # imported only when PostgreSQL is configured

        raw = await psycopg.AsyncConnection.connect(url, autocommit=True)
        return cls(raw, url)

    async def load_keys(self) -> None:
        """Learn every table's primary key from the catalog (see :data:`PRIMARY_KEYS`)."""
        cur = await self.raw.execute(
            "SELECT c.relname, a.attname FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()"
            " JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum"
            " WHERE i.indisprimary ORDER BY c.relname, k.ord"
        )
        keys: dict[str, list[str]] = {}
        for table, column in await cur.fetchall():
            keys.setdefault(str(table), []).append(str(column))
        PRIMARY_KEYS.update({t: tuple(c) for t, c in keys.items()})
        to_postgres.cache_clear()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _PgResult:
        return _PgResult(self, sql, params)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        async with (await self.live()).cursor() as cur:
            await cur.executemany(to_postgres(sql), [tuple(r) for r in rows])

    async def commit(self) -> None:
        return None  # autocommit (see the class docstring)

    async def rollback(self) -> None:
        return None

    def transaction(self) -> Any:
        """``async with db.transaction():`` the statements inside commit together or not at all."""
        return self.raw.transaction()

    def on_thread(self) -> contextlib.nullcontext[None]:
        """Nothing to do: psycopg's statements wait on the network, not on the loop."""
        return contextlib.nullcontext()

    async def close(self) -> None:
        await self.raw.close()


# -- the SQLite connection ---------------------------------------------------------------------------
T = TypeVar("T")

BUSY_TIMEOUT_MS = 2
"""How long SQLite itself waits for another process's lock, blocking the loop: a lock held for a
statement's time (``chital send``, ``chital pairing approve``) is usually gone within it."""
BUSY_WAIT = 5.0
"""Seconds a statement keeps retrying while another process holds the lock (the ``busy_timeout``
of 5,000 ms the connection had on its own thread), sleeping on the loop in between."""
_BUSY_NAP_MAX = 0.05
_ON_THREAD: ContextVar[bool] = ContextVar("chital_sqlite_on_thread", default=False)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY and its extended codes (``database is locked``): another connection holds it."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY


class SqliteCursor:
    """A finished statement: its rows (all fetched at once), ``rowcount`` and ``description``."""

    __slots__ = ("_at", "_rows", "description", "lastrowid", "rowcount")

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self.description = cur.description
        # Step the statement to its end now: no statement stays active across an ``await`` (another
        # task's COMMIT or checkpoint would then fail with "table is locked"), and a RETURNING
        # write is complete before its cursor is handed out.
        self._rows: list[Any] = cur.fetchall() if cur.description is not None else []
        self.rowcount = cur.rowcount
        self.lastrowid = cur.lastrowid
        self._at = 0
        cur.close()

    async def fetchone(self) -> Any:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    async def fetchall(self) -> list[Any]:
        rows, self._at = self._rows[self._at :], len(self._rows)
        return rows

    async def fetchmany(self, size: int = 1) -> list[Any]:
        rows = self._rows[self._at : self._at + size]
        self._at += len(rows)
        return rows

    async def close(self) -> None:
        return None


class _SqliteResult:
    """What :meth:`SqliteConnection.execute` returns: awaitable, or an ``async with`` for the cursor."""

    __slots__ = ("_conn", "_params", "_sql")

    def __init__(self, conn: SqliteConnection, sql: str, params: Sequence[Any]) -> None:
        self._conn, self._sql, self._params = conn, sql, params

    def __await__(self) -> Generator[Any, None, SqliteCursor]:
        return self._conn.run_statement(self._sql, self._params).__await__()

    async def __aenter__(self) -> SqliteCursor:
        return await self._conn.run_statement(self._sql, self._params)

    async def __aexit__(self, *exc: object) -> None:
        return None


class SqliteConnection:
    """The gateway's SQLite connection, its statements run inline on the event loop.

    Why not aiosqlite: it runs every statement, every cursor fetch and every commit on its worker
    thread, and each of those hops (a queue put, ``call_soon_threadsafe``, the self-pipe write, the
    loop waking up) costs more CPU than the statement itself: in WAL mode with
    ``synchronous=NORMAL`` a write commits without an fsync and takes tens of microseconds, a read
    by key a few. A short answer made some 25 hops; py-spy put aiosqlite's thread at ~20 % of the
    daemon's samples. Same choice as agent/checkpoints.py ``InlineSqliteSaver``.

    What that needs to stay safe:

    - **Autocommit** (``isolation_level=None``): each statement commits by itself before
      ``execute`` returns, so a write is on disk (``kill -9``-safe) as soon as it is awaited, and
      ``commit`` only ends an explicit ``BEGIN`` (the schema steps). Every write of the store is
      one statement that stands alone (PostgreSQL's connection runs the same way).
    - **Another process's lock never stalls the loop**: SQLite waits at most
      :data:`BUSY_TIMEOUT_MS` itself, then the statement is retried after an ``asyncio.sleep``
      (doubling up to 50 ms) for up to :data:`BUSY_WAIT` seconds in all, as long as it is not inside
      an explicit transaction (where only the transaction's owner can retry).
    - **Long work runs on a thread**: inside ``with db.on_thread():`` the task's statements run on a
      worker thread (a prune, a count over the whole journal, the schema steps), and :meth:`run`
      hands a function the raw connection there (a ``VACUUM``, a WAL checkpoint); meanwhile every
      other statement waits for it, as all statements waited their turn on aiosqlite's thread.
    - Statements are stepped to their end at once (:class:`SqliteCursor`), so none stays open
      across an ``await`` of another task.
    """

    dialect = SQLITE

    def __init__(self, conn: sqlite3.Connection, busy_wait: float = BUSY_WAIT) -> None:
        self.raw = conn
        self.busy_wait = busy_wait
        self._held: asyncio.Future[Any] | None = None

    @classmethod
    async def connect(cls, path: Path | str, busy_wait: float = BUSY_WAIT) -> SqliteConnection:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self = cls(conn, busy_wait)
        try:
            await self.execute("PRAGMA journal_mode=WAL")
            await self.execute("PRAGMA synchronous=NORMAL")
            await self.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        except BaseException:
            conn.close()
            raise
        return self

    @property
    def in_transaction(self) -> bool:
        return self.raw.in_transaction

    async def _idle(self) -> None:
        """Wait until no :meth:`run` holds the connection."""
        while (held := self._held) is not None and not held.done():
            await asyncio.wait((held,))

    async def run_statement(self, sql: str, params: Sequence[Any]) -> SqliteCursor:
        """One statement, inline (what :meth:`execute` awaits)."""
        if _ON_THREAD.get():
            return await self.run(functools.partial(_step, sql, params))
        held = self._held
        if held is not None and not held.done():
            await self._idle()
        try:
            return SqliteCursor(self.raw.execute(sql, params))
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or self.raw.in_transaction:
                raise
            deadline = time.monotonic() + self.busy_wait
        nap = 0.001
        while True:
            await asyncio.sleep(nap)
            await self._idle()
            try:
                return SqliteCursor(self.raw.execute(sql, params))
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or self.raw.in_transaction or time.monotonic() >= deadline:
                    raise
            nap = min(nap * 2, _BUSY_NAP_MAX)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _SqliteResult:
        return _SqliteResult(self, sql, params)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """``rows`` in one transaction (one commit for them all), inline: meant for a few rows."""
        rows = list(rows)
        await self.run_statement("BEGIN IMMEDIATE", ())  # waits out another process's lock like any statement
        try:
            self.raw.executemany(sql, rows)
            self.raw.commit()
        except BaseException:
            self.raw.rollback()
            raise

    async def commit(self) -> None:
        await self._idle()
        if self.raw.in_transaction:
            self.raw.commit()

    async def rollback(self) -> None:
        await self._idle()
        if self.raw.in_transaction:
            self.raw.rollback()

    @contextlib.contextmanager
    def on_thread(self) -> Iterator[None]:
        """``with db.on_thread():`` this task's statements run on a worker thread (see the class
        docstring): for those that may scan many rows."""
        token = _ON_THREAD.set(True)
        try:
            yield
        finally:
            _ON_THREAD.reset(token)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(raw connection)`` on a worker thread, for work that would hold the loop for more
        than a few milliseconds; the connection's other statements wait until it is done (also when
        the caller is cancelled: the thread cannot be). There SQLite may wait for another process's
        lock itself, for up to :attr:`busy_wait`."""
        await self._idle()
        held = asyncio.get_running_loop().run_in_executor(None, self._on_thread, fn)
        held.add_done_callback(_retrieved)  # a cancelled caller leaves nobody to read its outcome
        self._held = held
        return await asyncio.shield(held)

    def _on_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self.raw.execute(f"PRAGMA busy_timeout={int(self.busy_wait * 1000)}")
        try:
            return fn(self.raw)
        finally:
            self.raw.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")

    async def close(self) -> None:
        await self._idle()
        self.raw.close()


def _step(sql: str, params: Sequence[Any], conn: sqlite3.Connection) -> SqliteCursor:
    return SqliteCursor(conn.execute(sql, params))


def _retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()
