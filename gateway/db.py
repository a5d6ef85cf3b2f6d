"""One connection API for both databases the gateway can keep its state in.

The store (gateway/store*.py) is written once, against the small part of aiosqlite's connection API
it uses: ``execute`` (awaited, or as ``async with`` for a cursor), ``commit``, ``rollback``,
``close``. SQLite is that connection itself. For PostgreSQL, :class:`PgConnection` offers the same
calls over psycopg and rewrites each statement from the SQLite spelling the store uses into
PostgreSQL's, once per distinct statement (cached):

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
import functools
import re
from collections.abc import Generator, Iterable, Sequence
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

SQLITE = "sqlite"
POSTGRES = "postgres"


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    async def fetchone(self) -> Any: ...

    async def fetchall(self) -> Iterable[Any]: ...


def dialect_of(db: object) -> str:
    """Which engine a connection speaks (aiosqlite connections have no ``dialect``)."""
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

    async def close(self) -> None:
        await self.raw.close()
