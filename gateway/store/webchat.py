"""``web_messages`` and ``web_files``: the web chat's conversation, kept by the daemon because for
this channel the daemon is the platform (channels/web/room.py says why). Mixed into ``Store``,
which the web channel sees as its :class:`~channels.web.room.Room`.

Every write sets the message's ``seq`` to one more than the chat's highest, in the same statement,
under a lock named after the chat (PostgreSQL's transaction-scoped advisory lock; SQLite's one
writer): two daemons writing into one chat never share a ``seq`` and never commit a lower one
after a higher one, so a page that has seen up to N and asks for "after N" misses nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

from channels.messages import Button
from channels.web.room import ChatSummary, FileRef, StoredFile, WebMessage
from gateway.store.connection import Connection

WEB_TABLES = (
    """CREATE TABLE IF NOT EXISTS web_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    chat_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    msg_id TEXT NOT NULL UNIQUE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    author TEXT NOT NULL,
    text TEXT NOT NULL,
    buttons TEXT NOT NULL,
    files TEXT NOT NULL,
    send_key TEXT UNIQUE,
    created REAL NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS web_messages_chat ON web_messages(chat_id, seq)",
    "CREATE INDEX IF NOT EXISTS web_messages_owner ON web_messages(owner, created)",
    """CREATE TABLE IF NOT EXISTS web_files (
    chat_id TEXT NOT NULL,
    file_id TEXT NOT NULL,
    name TEXT NOT NULL,
    mime TEXT NOT NULL,
    size INTEGER NOT NULL,
    data BLOB NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (chat_id, file_id)
)""",
)
_COLUMNS = "seq, msg_id, chat_id, role, author, text, buttons, files, created"
_NEXT_SEQ = "(SELECT COALESCE(MAX(w.seq), 0) + 1 FROM web_messages w WHERE w.chat_id = ?)"


def _clean(text: str) -> str:
    """``text`` as both engines store it: PostgreSQL's text columns refuse NUL (SQLite takes it), so
    a NUL a person typed or the model wrote becomes U+FFFD instead of failing the write on one
    engine only (JSON columns escape it and need nothing)."""
    return text.replace("\x00", "\ufffd")


def _buttons(raw: str) -> tuple[Button, ...]:
    return tuple(Button(str(b[0]), str(b[1]), str(b[2])) for b in json.loads(raw))


def _files(raw: str) -> tuple[FileRef, ...]:
    return tuple(FileRef(str(f[0]), str(f[1]), int(f[2])) for f in json.loads(raw))


def _message(row: Any) -> WebMessage:
    return WebMessage(
        seq=int(row[0]), msg_id=str(row[1]), chat_id=str(row[2]), role=str(row[3]), author=str(row[4]),
        text=str(row[5]), buttons=_buttons(row[6]), files=_files(row[7]), created=float(row[8]),
    )  # fmt: skip


class WebChatTables:
    """The web chat's messages and files (mixed into ``Store``; channels/web/room.py's ``Room``)."""

    _db: Connection

    async def _write(
        self,
        sql: str,
        params: tuple[Any, ...] = (),
        *,
        many: list[tuple[Any, ...]] | None = None,
        locks: tuple[str, ...] = (),
    ) -> int:
        raise NotImplementedError  # Store's

    async def web_add(
        self,
        chat_id: str,
        owner: str,
        msg_id: str,
        role: str,
        author: str,
        text: str,
        *,
        buttons: tuple[Button, ...] = (),
        files: tuple[FileRef, ...] = (),
        send_key: str | None = None,
    ) -> str:
        sql = (
            "INSERT OR IGNORE INTO web_messages(chat_id, owner, msg_id, seq, role, author, text, buttons,"
            f" files, send_key, created) SELECT ?, ?, ?, {_NEXT_SEQ}, ?, ?, ?, ?, ?, ?, ?"
        )
        params = (
            chat_id, owner, msg_id, chat_id, role, _clean(author), _clean(text),
            json.dumps([[b.label, b.value, b.style] for b in buttons]),
            json.dumps([[f.file_id, f.name, f.size] for f in files]), send_key, time.time(),
        )  # fmt: skip
        await self._write(sql, params, locks=(f"web:{chat_id}",))
        if send_key is not None:
            found = await self.web_by_key(send_key)
            if found is not None:
                return found
        return msg_id

    async def web_edit(
        self, chat_id: str, msg_id: str, text: str, buttons: tuple[Button, ...] | None
    ) -> bool:
        sets, params = "text = ?", [_clean(text)]
        if buttons is not None:
            sets += ", buttons = ?"
            params.append(json.dumps([[b.label, b.value, b.style] for b in buttons]))
        sql = f"UPDATE web_messages SET {sets}, seq = {_NEXT_SEQ} WHERE chat_id = ? AND msg_id = ?"
        count = await self._write(sql, (*params, chat_id, chat_id, msg_id), locks=(f"web:{chat_id}",))
        return count > 0

    async def web_by_key(self, send_key: str) -> str | None:
        async with self._db.execute("SELECT msg_id FROM web_messages WHERE send_key = ?", (send_key,)) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def web_message(self, chat_id: str, msg_id: str) -> WebMessage | None:
        sql = f"SELECT {_COLUMNS} FROM web_messages WHERE chat_id = ? AND msg_id = ?"
        async with self._db.execute(sql, (chat_id, msg_id)) as cur:
            row = await cur.fetchone()
        return _message(row) if row else None

    async def web_since(self, chat_id: str, after: int, limit: int) -> list[WebMessage]:
        sql = f"SELECT {_COLUMNS} FROM web_messages WHERE chat_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        async with self._db.execute(sql, (chat_id, after, limit)) as cur:
            rows = await cur.fetchall()
        return [_message(r) for r in rows]

    async def web_recent(self, chat_id: str, limit: int) -> tuple[list[WebMessage], int]:
        # The top first: a write landing between the two reads is then in the rows (the stream
        # sends it again; the page replaces by id). Read second, its seq would be at or below the
        # top but in no row, and the page would never show it.
        async with self._db.execute("SELECT MAX(seq) FROM web_messages WHERE chat_id = ?", (chat_id,)) as cur:
            top = await cur.fetchone()
        sql = f"SELECT {_COLUMNS} FROM web_messages WHERE chat_id = ? ORDER BY id DESC LIMIT ?"
        async with self._db.execute(sql, (chat_id, limit)) as cur:
            rows = await cur.fetchall()
        return [_message(r) for r in reversed(rows)], int(top[0] or 0) if top else 0

    async def web_chats(self, owner: str, limit: int) -> list[ChatSummary]:
        sql = (
            "SELECT chat_id, MAX(created), COUNT(*), MIN(id) FROM web_messages WHERE owner = ?"
            " GROUP BY chat_id ORDER BY MAX(created) DESC LIMIT ?"
        )
        async with self._db.execute(sql, (owner, limit)) as cur:
            rows = await cur.fetchall()
        out = []
        for chat_id, updated, count, first in rows:
            async with self._db.execute("SELECT text FROM web_messages WHERE id = ?", (first,)) as cur:
                row = await cur.fetchone()
            out.append(ChatSummary(str(chat_id), str(row[0]) if row else "", float(updated), int(count)))
        return out

    async def web_prune(self, older_than: float) -> int:
        """Delete the messages and files written more than ``older_than`` seconds ago (an edit
        does not make a message younger); returns the messages deleted."""
        cutoff = time.time() - older_than
        await self._write("DELETE FROM web_files WHERE created < ?", (cutoff,))
        return await self._write("DELETE FROM web_messages WHERE created < ?", (cutoff,))

    async def web_file_put(self, chat_id: str, file_id: str, name: str, mime: str, data: bytes) -> None:
        await self._write(
            "INSERT OR IGNORE INTO web_files(chat_id, file_id, name, mime, size, data, created)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (chat_id, file_id, _clean(name), _clean(mime), len(data), data, time.time()),
        )

    async def web_file_get(self, chat_id: str, file_id: str) -> StoredFile | None:
        sql = "SELECT name, mime, data FROM web_files WHERE chat_id = ? AND file_id = ?"
        async with self._db.execute(sql, (chat_id, file_id)) as cur:
            row = await cur.fetchone()
        return StoredFile(str(row[0]), str(row[1]), bytes(row[2])) if row else None
