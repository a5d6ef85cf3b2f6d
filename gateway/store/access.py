"""The access tables of the gateway's store: pairing requests, approved users, admins' DM chats,
and the results of chat commands keyed by their journal key (what makes a re-run repeat a reply,
never an effect).

A mixin of :class:`gateway.store.journal.Store`, in its own module to keep both files readable; it uses the
store's connection and its full-disk-aware ``_write``.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

from agent.untrusted import code_span
from gateway.store.connection import Connection

log = logging.getLogger(__name__)

ACCESS_TABLES = (
    """CREATE TABLE IF NOT EXISTS command_results (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    created REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS dm_chats (
    user TEXT PRIMARY KEY,
    chat_id TEXT NOT NULL,
    updated REAL NOT NULL
)""",
)
"""This module's tables; created by the schema's baseline step (:mod:`gateway.store.schema`)."""
PAIRING_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
PAIRING_CODE_LEN = 8
"""32 symbols × 8 = 2^40 codes, drawn with :mod:`secrets` (docs/access.md)."""
PAIRING_COLUMNS = {
    "expires": "REAL NOT NULL DEFAULT 0",
    "chat_id": "TEXT NOT NULL DEFAULT ''",
    "denied": "INTEGER NOT NULL DEFAULT 0",
}
"""Added to ``pairing`` after its first version: when the code lapses, the DM it was asked from
(to tell the stranger the outcome), and whether an admin refused it."""


@dataclass(frozen=True, slots=True)
class PairingRequest:
    """A stranger's request for access: their one code, until it lapses or an admin decides."""

    code: str
    user: str
    name: str
    chat_id: str
    """The DM the stranger asked from (empty for requests made before this was kept)."""
    created: float
    expires: float
    denied: bool = False

    @property
    def platform(self) -> str:
        return self.user.split(":", 1)[0]

    def expired(self, now: float | None = None) -> bool:
        return self.expires <= (time.time() if now is None else now)

    def label(self) -> str:
        """``Name (platform:id)`` for logs and the terminal, which escape what does not show."""
        return f"{self.name} ({self.user})" if self.name else self.user

    def chat_label(self) -> str:
        """``Name (platform:id)`` for the chat: the stranger chose the name, so it is shown as
        inline code, bounded and without invisible characters (agent/untrusted.py)."""
        return f"{code_span(self.name)} ({code_span(self.user)})" if self.name else code_span(self.user)


_PAIRING_FIELDS = "code, user, name, chat_id, created, expires, denied"


def _pairing_row(row: Any) -> PairingRequest:
    code, user, name, chat_id, created, expires, denied = row
    return PairingRequest(
        str(code), str(user), str(name), str(chat_id), float(created), float(expires), bool(denied)
    )


def normalize_code(text: str) -> str:
    """What an admin typed → the stored form: case, spaces and dashes do not matter."""
    return "".join(ch for ch in text.upper() if ch not in " -_\t")


class AccessTables:
    """Pairing, approvals, DM chats and command results (mixed into ``Store``)."""

    _db: Connection
    _dm_chats: dict[str, str]

    async def _write(self, sql: str, params: tuple[Any, ...] = (), *, locks: tuple[str, ...] = ()) -> int:
        raise NotImplementedError  # Store's

    async def is_approved(self, user: str) -> bool:
        async with self._db.execute("SELECT 1 FROM approved_users WHERE user = ?", (user,)) as cur:
            return await cur.fetchone() is not None

    async def pairing_request(
        self, user: str, name: str, chat_id: str, *, ttl: float, max_pending: int
    ) -> tuple[PairingRequest, bool]:
        """The stranger's live request, or a new code once the old one lapsed. Returns
        (request, newly_created).

        One row per user (``user UNIQUE``), so a stranger holds one code at a time. Lapsed rows are
        dropped before a new row goes in, and the oldest beyond ``max_pending`` after it: what
        strangers can make us store is bounded, and so is the number of codes a guess could hit.
        The bound holds across daemons: the trim runs under a lock on the pairing table
        (PostgreSQL's advisory lock; SQLite's one writer), after the insert, so whichever daemon
        trims last leaves at most ``max_pending`` (counting then inserting, each daemon could
        pass the count at once)."""
        now = time.time()
        async with self._db.execute(f"SELECT {_PAIRING_FIELDS} FROM pairing WHERE user = ?", (user,)) as cur:
            row = await cur.fetchone()
        if row and not _pairing_row(row).expired(now):
            return _pairing_row(row), False
        await self._write("DELETE FROM pairing WHERE expires <= ? OR user = ?", (now, user))
        while True:
            code = "".join(secrets.choice(PAIRING_ALPHABET) for _ in range(PAIRING_CODE_LEN))
            added = await self._write(
                "INSERT OR IGNORE INTO pairing(code, user, name, created, expires, chat_id, denied)"
                " VALUES (?, ?, ?, ?, ?, ?, 0)",
                (code, user, name[:100], now, now + ttl, chat_id),
            )
            if added:  # else the code collided with another pending one (1 in 2^40 per row): redraw
                break
        evicted = await self._write(
            "DELETE FROM pairing WHERE code NOT IN"
            " (SELECT code FROM pairing ORDER BY created DESC, rowid DESC LIMIT ?)",
            (max(max_pending, 1),),
            locks=("pairing:trim",),
        )
        if evicted:
            log.warning("pairing: %d pending request(s) dropped to stay within %d", evicted, max_pending)
        return PairingRequest(code, user, name[:100], chat_id, now, now + ttl), True

    async def pairing_code_for(
        self, user: str, name: str, chat_id: str = "", *, ttl: float = 3600.0, max_pending: int = 20
    ) -> tuple[str, bool]:
        """The user's pending pairing code, creating one if needed. Returns (code, newly_created)."""
        request, new = await self.pairing_request(user, name, chat_id, ttl=ttl, max_pending=max_pending)
        return request.code, new

    async def pairing_get(self, code: str) -> PairingRequest | None:
        """The request holding ``code`` (pending, lapsed or denied), or None."""
        async with self._db.execute(
            f"SELECT {_PAIRING_FIELDS} FROM pairing WHERE code = ?", (normalize_code(code),)
        ) as cur:
            row = await cur.fetchone()
        return _pairing_row(row) if row else None

    async def pairing_list(self) -> list[PairingRequest]:
        async with self._db.execute(f"SELECT {_PAIRING_FIELDS} FROM pairing ORDER BY created") as cur:
            return [_pairing_row(row) for row in await cur.fetchall()]

    async def pairing_approve(self, code: str) -> str | None:
        """Approve a code that has not lapsed (a denied one too: the admin changed their mind).
        Returns the user it belonged to, or None for an unknown or lapsed code.

        Idempotent: approving a code again returns its user, so a command re-run after a crash
        says the same thing. The insert comes first: a crash between the two statements leaves
        an approved user with a stale row, never a deleted request without its approval."""
        code = normalize_code(code)
        now = time.time()
        approved = await self._write(
            "INSERT OR REPLACE INTO approved_users(user, approved, code)"
            " SELECT user, ?, code FROM pairing WHERE code = ? AND expires > ?",
            (now, code, now),
        )
        if approved:
            await self._write("DELETE FROM pairing WHERE code = ?", (code,))
        return await self.approved_by_code(code)

    async def approved_by_code(self, code: str) -> str | None:
        async with self._db.execute(
            "SELECT user FROM approved_users WHERE code = ?", (normalize_code(code),)
        ) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def pairing_deny(self, code: str, ttl: float) -> PairingRequest | None:
        """Refuse a request. Its row stays, marked, for ``ttl`` more seconds: until then the
        stranger's messages get "declined" and no new code, so a refused stranger cannot make the
        admins a new announcement with every message. Idempotent."""
        code = normalize_code(code)
        await self._write(
            "UPDATE pairing SET denied = 1, expires = ? WHERE code = ? AND denied = 0",
            (time.time() + ttl, code),
        )
        return await self.pairing_get(code)

    async def revoke(self, user: str) -> bool:
        return await self._write("DELETE FROM approved_users WHERE user = ?", (user,)) > 0

    async def approved_list(self) -> list[tuple[str, float]]:
        async with self._db.execute("SELECT user, approved FROM approved_users ORDER BY approved") as cur:
            return [(str(u), float(t)) for u, t in await cur.fetchall()]

    async def dm_chat_remember(self, user: str, chat_id: str) -> None:
        """Keep the DM chat a user (an admin) wrote to the bot from: on Discord and Lark that chat
        id is not the user id, and it is the only way to reach them there later."""
        if self._dm_chats.get(user) == chat_id:
            return
        await self._write(
            "INSERT OR REPLACE INTO dm_chats(user, chat_id, updated) VALUES (?, ?, ?)",
            (user, chat_id, time.time()),
        )
        self._dm_chats[user] = chat_id

    async def dm_chat_get(self, user: str) -> str | None:
        cached = self._dm_chats.get(user)
        if cached is not None:
            return cached
        async with self._db.execute("SELECT chat_id FROM dm_chats WHERE user = ?", (user,)) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    # -- what a command did, keyed by its journal key ---------------------------------------------
    async def command_result(self, key: str) -> str | None:
        async with self._db.execute("SELECT value FROM command_results WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row else None

    async def command_result_put(self, key: str, value: str) -> tuple[str, float]:
        """Record ``value`` for ``key`` unless something is recorded already; returns what is
        recorded and when. First writer wins, in one statement: a re-run gets the first result."""
        await self._write(
            "INSERT OR IGNORE INTO command_results(key, value, created) VALUES (?, ?, ?)",
            (key, value, time.time()),
        )
        async with self._db.execute(
            "SELECT value, created FROM command_results WHERE key = ?", (key,)
        ) as cur:
            row = await cur.fetchone()
        assert row is not None
        return str(row[0]), float(row[1])

    async def command_result_drop(self, key: str) -> None:
        """Forget ``key``'s result once its journal entry is finished (it cannot run again then);
        while the entry is open a retry or a restart may still need it."""
        await self._write(
            "DELETE FROM command_results WHERE key = ? AND key NOT IN"
            " (SELECT key FROM journal WHERE state IN ('pending', 'running'))",
            (key,),
        )
