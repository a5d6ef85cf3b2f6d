"""The one connection protocol the store is written against, and the engines that implement it.

The store (its journal and every table mixin, the schema steps, the usage tables, the cluster's
heartbeat) holds a :class:`Connection`, never a concrete engine's class. Two classes implement it:
:class:`gateway.store.db.SqliteConnection` (inline on the event loop) and
:class:`gateway.store.db.PgConnection` (psycopg, statements rewritten from the SQLite spelling).
Both are checked against it by mypy (the two one-line functions at the end of db.py), so a call
the store makes that one engine lacks is a type error, not a failure at run time on the engine
the tests ran less.

Why a protocol and not a base class: the two share no code (a base class would be empty), and each
engine keeps what only it has (SQLite's ``run``, PostgreSQL's ``load_keys``) outside the protocol.

Why the dialect is part of it: a few statements have no common spelling (the schema version, a
table's columns, SQLite's file upkeep), and the store must know which engine it speaks before
its first statement. It is fixed by the engine's class when the connection is made; nothing
sets it afterwards or guesses it from what an object happens to have.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol


class Dialect(enum.StrEnum):
    """Which engine a connection speaks (stored and shown as its value)."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


SQLITE = Dialect.SQLITE
POSTGRES = Dialect.POSTGRES


class Cursor(Protocol):
    """A finished statement's rows and row count."""

    @property
    def rowcount(self) -> int: ...

    async def fetchone(self) -> Any: ...

    async def fetchall(self) -> list[Any]: ...


class Result(Protocol):
    """What :meth:`Connection.execute` returns: awaited, the cursor; or ``async with`` for it
    (aiosqlite's shape, which the store's statements were first written in)."""

    def __await__(self) -> Generator[Any, None, Cursor]: ...

    async def __aenter__(self) -> Cursor: ...

    async def __aexit__(self, *exc: object) -> None: ...


class Connection(Protocol):
    """The calls the store makes on its database (both engines run in autocommit: each statement
    commits by itself; :meth:`transaction` groups the steps that must go together)."""

    @property
    def dialect(self) -> Dialect: ...

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result: ...

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """The statement once per row of parameters, all in one transaction."""
        ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        """``async with db.transaction():`` the statements inside commit together or not at all."""
        ...

    async def execute_locked(self, keys: Sequence[str], sql: str, params: Sequence[Any] = ()) -> Cursor:
        """One write statement that reads what it decides on (a count before an insert) run while
        no other daemon runs one under any of ``keys``: a limit a statement checks then holds
        across every daemon on the database, not per process."""
        ...

    def on_thread(self) -> AbstractContextManager[None]:
        """``with db.on_thread():`` this task's statements may take long: keep them off the loop."""
        ...

    async def close(self) -> None: ...
