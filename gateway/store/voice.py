"""``conversation_voice``: whether answers in one conversation are also spoken, as ``/voice``
chose (docs/speech.md). Mixed into ``Store``.

A row only where a choice was made: without one, nothing is spoken. Read once per answered turn,
and only when a ``speech:`` section is configured."""

from __future__ import annotations

import time
from typing import Any

from gateway.store.connection import Connection

VOICE_TABLES = (
    """CREATE TABLE IF NOT EXISTS conversation_voice (
    conversation TEXT PRIMARY KEY,
    mode TEXT NOT NULL,
    user TEXT NOT NULL,
    updated REAL NOT NULL
)""",
)


class VoiceTables:
    """The per-conversation spoken-replies mode (mixed into ``Store``)."""

    _db: Connection

    async def _write(
        self, sql: str, params: tuple[Any, ...] = (), *, many: list[tuple[Any, ...]] | None = None
    ) -> int:
        raise NotImplementedError  # Store's

    async def voice_mode(self, conversation: str) -> str | None:
        """The mode ``/voice`` chose for ``conversation`` (``on`` or ``all``), if any."""
        sql = "SELECT mode FROM conversation_voice WHERE conversation = ?"
        async with self._db.execute(sql, (conversation,)) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def voice_mode_set(self, conversation: str, mode: str | None, user: str) -> None:
        """Record ``mode`` for ``conversation``; None (``/voice off``) forgets it."""
        if mode is None:
            await self._write("DELETE FROM conversation_voice WHERE conversation = ?", (conversation,))
            return
        await self._write(
            "INSERT INTO conversation_voice(conversation, mode, user, updated) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(conversation) DO UPDATE SET mode = excluded.mode, user = excluded.user,"
            " updated = excluded.updated",
            (conversation, mode, user, time.time()),
        )
