"""``conversation_busy``: the busy mode an admin chose for one conversation with ``/busy``
(what a message sent while a turn runs there does: docs/steering.md). Mixed into ``Store``.

A row only where a choice was made: a conversation without one follows its channel's
``busy_mode``. Read only when a message arrives while a turn runs, so an idle conversation's
message costs no read (gateway/turns/busy.py caches it briefly)."""

from __future__ import annotations

import time
from typing import Any

from gateway.store.connection import Connection

BUSY_TABLES = (
    """CREATE TABLE IF NOT EXISTS conversation_busy (
    conversation TEXT PRIMARY KEY,
    mode TEXT NOT NULL,
    user TEXT NOT NULL,
    updated REAL NOT NULL
)""",
)


class BusyTables:
    """The per-conversation busy mode (mixed into ``Store``)."""

    _db: Connection

    async def _write(
        self, sql: str, params: tuple[Any, ...] = (), *, many: list[tuple[Any, ...]] | None = None
    ) -> int:
        raise NotImplementedError  # Store's

    async def busy_mode(self, conversation: str) -> str | None:
        """The mode ``/busy`` chose for ``conversation``, if any."""
        sql = "SELECT mode FROM conversation_busy WHERE conversation = ?"
        async with self._db.execute(sql, (conversation,)) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def busy_mode_set(self, conversation: str, mode: str | None, user: str) -> None:
        """Record ``mode`` for ``conversation``; None forgets it (back to the channel's)."""
        if mode is None:
            await self._write("DELETE FROM conversation_busy WHERE conversation = ?", (conversation,))
            return
        await self._write(
            "INSERT INTO conversation_busy(conversation, mode, user, updated) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(conversation) DO UPDATE SET mode = excluded.mode, user = excluded.user,"
            " updated = excluded.updated",
            (conversation, mode, user, time.time()),
        )
