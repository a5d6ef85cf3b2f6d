"""The facts store's SQLite backend: LangGraph's sync ``SqliteStore``, called inline on the loop.

Why not ``AsyncSqliteStore``: it sends every batch through aiosqlite's worker thread as four
hand-offs (``BEGIN``, the statement, ``COMMIT``, the cursor close), and a turn writes one pending
row (and reads facts whenever the cache misses). Each statement is tens of microseconds of local
work in WAL mode with ``synchronous=NORMAL``, less than the thread hops around it, so the sync
store's own ``batch`` runs directly, as ``agent/checkpoints.py`` does for checkpoints. Same file,
same tables, same one-transaction-per-batch; a committed row survives ``kill -9`` as before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from langgraph.store.base import Op, Result
from langgraph.store.sqlite import SqliteStore


class InlineSqliteStore(SqliteStore):
    """``SqliteStore`` whose ``abatch`` runs ``batch`` on the caller's thread (see the docstring)."""

    @classmethod
    def open(cls, path: Path) -> InlineSqliteStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: the store issues its own BEGIN/COMMIT per batch.
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            store = cls(conn)
            store.setup()
        except BaseException:
            conn.close()
            raise
        return store

    def close(self) -> None:
        self.conn.close()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return self.batch(ops)
