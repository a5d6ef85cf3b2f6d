"""The operator console's reads across conversations (gateway/console/): the other tables' methods
read one conversation or one user; the console lists them all, bounded."""

from __future__ import annotations

from typing import Any

from gateway.store.connection import Connection
from gateway.store.entries import inbound_from_json

LIKE_ESCAPE = str.maketrans({"\\": "\\\\", "%": "\\%", "_": "\\_"})


class ConsoleQueries:
    _db: Connection

    async def conversations(self, search: str = "", limit: int = 100) -> list[tuple[str, int, float]]:
        """(conversation, entries, last activity), the most recent first; ``search`` a substring of
        the conversation's key or of a message in it (literal: ``%`` and ``_`` match themselves)."""
        where = ""
        params: tuple[Any, ...] = ()
        if search:
            pattern = f"%{search.translate(LIKE_ESCAPE)}%"
            where = "WHERE conversation LIKE ? ESCAPE '\\' OR payload LIKE ? ESCAPE '\\'"
            params = (pattern, pattern)
        sql = (
            f"SELECT conversation, COUNT(*), MAX(created) FROM journal {where}"
            " GROUP BY conversation ORDER BY 3 DESC LIMIT ?"
        )
        with self._db.on_thread():
            async with self._db.execute(sql, (*params, limit)) as cur:
                return [(str(r[0]), int(r[1]), float(r[2])) for r in await cur.fetchall()]

    async def conversation_entries(self, conversation: str, limit: int = 200) -> list[dict[str, Any]]:
        """The conversation's journal entries, oldest first (the last ``limit``), each with its
        inbound message and the files sent back for it."""
        async with self._db.execute(
            "SELECT key, kind, payload, state, attempts, created, updated FROM journal"
            " WHERE conversation = ? ORDER BY created DESC LIMIT ?",
            (conversation, limit),
        ) as cur:
            rows = await cur.fetchall()
        found = []
        for key, kind, payload, state, attempts, created, updated in reversed(rows):
            inbound, note = inbound_from_json(payload)
            async with self._db.execute("SELECT path, caption FROM files_out WHERE key = ?", (key,)) as cur:
                files = [(str(p), str(c)) for p, c in await cur.fetchall()]
            found.append(
                {
                    "key": key,
                    "kind": kind,
                    "inbound": inbound,
                    "note": note,
                    "state": state,
                    "attempts": attempts,
                    "created": created,
                    "updated": updated,
                    "files": files,
                }
            )
        return found

    async def usage_by_day(self, since: str, limit: int = 2000) -> list[tuple[str, str, str, int, int]]:
        """(day, user, model, tokens, cost in micros) from ``since`` (``YYYY-MM-DD``) on, by day."""
        sql = (
            "SELECT day, user, model, SUM(prompt_tokens + completion_tokens), SUM(cost_micros)"
            " FROM token_usage WHERE day >= ? GROUP BY day, user, model ORDER BY day, user, model LIMIT ?"
        )
        with self._db.on_thread():
            async with self._db.execute(sql, (since, limit)) as cur:
                return [
                    (str(r[0]), str(r[1]), str(r[2]), int(r[3] or 0), int(r[4] or 0))
                    for r in await cur.fetchall()
                ]
