"""Standing approvals and the approvals' decision log (docs/approvals.md, "Standing permissions").

A mixin of :class:`gateway.store.journal.Store`, like :mod:`gateway.store.approvals`.

- ``approval_grants``: one row per standing permission. ``conversation`` and ``user`` say whose
  calls it covers: one person's in one conversation ("Allow here"), or, both empty, everyone's on
  ``platform`` ("Always", admins only). A revoked row is kept (``revoked``, ``revoked_by``) so the
  listing and the log can say who ended it; matching reads only live rows.
- ``approval_log``: every decision a person (or a standing permission, or the clock) took about a
  request or a permission, with the platform's verified user id of who took it, never a name typed
  in a message. Append-only; pruned with the approvals by retention.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.store.connection import Connection

GRANT_TABLES = (
    """CREATE TABLE IF NOT EXISTS approval_grants (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tool TEXT NOT NULL,
    platform TEXT NOT NULL,
    conversation TEXT NOT NULL DEFAULT '',
    user TEXT NOT NULL DEFAULT '',
    granted_by TEXT NOT NULL,
    granted_by_name TEXT NOT NULL DEFAULT '',
    code TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    revoked REAL,
    revoked_by TEXT NOT NULL DEFAULT ''
)""",
    "CREATE INDEX IF NOT EXISTS approval_grants_tool ON approval_grants(tool, platform)",
    """CREATE TABLE IF NOT EXISTS approval_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    platform TEXT NOT NULL,
    conversation TEXT NOT NULL DEFAULT '',
    code TEXT NOT NULL DEFAULT '',
    grant_id INTEGER,
    tool TEXT NOT NULL DEFAULT '',
    action TEXT NOT NULL,
    by_user TEXT NOT NULL DEFAULT '',
    by_name TEXT NOT NULL DEFAULT ''
)""",
    "CREATE INDEX IF NOT EXISTS approval_log_at ON approval_log(at)",
)
"""Created by schema step 12 (:mod:`gateway.store.schema`)."""


@dataclass(frozen=True, slots=True)
class Grant:
    id: int
    tool: str
    platform: str
    conversation: str
    """Empty: every conversation on ``platform`` (an admin's "Always")."""
    user: str
    """Whose calls it covers (``platform:id``); empty: everyone's."""
    granted_by: str
    granted_by_name: str
    created: float
    revoked: float | None
    revoked_by: str

    @property
    def everywhere(self) -> bool:
        return not self.conversation


@dataclass(frozen=True, slots=True)
class LogRow:
    at: float
    code: str
    grant_id: int | None
    tool: str
    action: str
    by_user: str
    by_name: str


_GRANT = "id, tool, platform, conversation, user, granted_by, granted_by_name, created, revoked, revoked_by"


def _grant(row: Any) -> Grant:
    gid, tool, platform, conv, user, by, name, created, revoked, revoked_by = row
    return Grant(int(gid), str(tool), str(platform), str(conv), str(user), str(by), str(name),
                 float(created), None if revoked is None else float(revoked), str(revoked_by))  # fmt: skip


class GrantTables:
    """Standing permissions and the decision log (mixed into ``Store``)."""

    _db: Connection

    async def _write(
        self, sql: str, params: tuple[Any, ...] = (), *, many: list[tuple[Any, ...]] | None = None
    ) -> int:
        raise NotImplementedError  # Store's

    async def grant_add(
        self, tool: str, platform: str, conversation: str, user: str, by: str, by_name: str, code: str
    ) -> Grant:
        """Record a standing permission; an identical live one is returned instead of a second."""
        live = await self.grant_match(tool, platform, conversation, user, exact=True)
        if live is not None:
            return live
        await self._write(
            "INSERT INTO approval_grants(tool, platform, conversation, user, granted_by, granted_by_name,"
            " code, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (tool, platform, conversation, user, by, by_name, code, time.time()),
        )
        found = await self.grant_match(tool, platform, conversation, user, exact=True)
        assert found is not None, "a permission just written is readable"
        return found

    async def grant_match(
        self, tool: str, platform: str, conversation: str, user: str, *, exact: bool = False
    ) -> Grant | None:
        """The live permission covering a call of ``tool`` by ``user`` in ``conversation``: this
        person's here, or everyone's on the platform (``exact``: only the row of that very scope)."""
        if exact:
            where, params = "conversation = ? AND user = ?", (conversation, user)
        else:
            where = "((conversation = ? AND user = ?) OR (conversation = '' AND user = ''))"
            params = (conversation, user)
        sql = (
            f"SELECT {_GRANT} FROM approval_grants WHERE tool = ? AND platform = ? AND revoked IS NULL"
            f" AND {where} ORDER BY id LIMIT 1"
        )
        async with self._db.execute(sql, (tool, platform, *params)) as cur:
            row = await cur.fetchone()
        return _grant(row) if row else None

    async def grant_get(self, grant_id: int) -> Grant | None:
        async with self._db.execute(f"SELECT {_GRANT} FROM approval_grants WHERE id = ?", (grant_id,)) as cur:
            row = await cur.fetchone()
        return _grant(row) if row else None

    async def grants_visible(self, platform: str, conversation: str, limit: int) -> list[Grant]:
        """Live permissions that apply in ``conversation``: its own and the platform-wide ones,
        newest first (the oldest were the ones cut: a fresh grant must be listed, to be revoked)."""
        sql = (
            f"SELECT {_GRANT} FROM approval_grants WHERE platform = ? AND revoked IS NULL"
            " AND (conversation = ? OR conversation = '') ORDER BY id DESC LIMIT ?"
        )
        async with self._db.execute(sql, (platform, conversation, limit)) as cur:
            return [_grant(r) for r in await cur.fetchall()]

    async def grants_live(self, limit: int = 200) -> list[Grant]:
        """Every live standing permission, newest first."""
        async with self._db.execute(
            f"SELECT {_GRANT} FROM approval_grants WHERE revoked IS NULL ORDER BY id DESC LIMIT ?",
            (limit,),
        ) as cur:
            return [_grant(r) for r in await cur.fetchall()]

    async def grant_revoke(self, grant_id: int, by: str) -> bool:
        """End a live permission (the first revocation wins); False if it was not live."""
        count = await self._write(
            "UPDATE approval_grants SET revoked = ?, revoked_by = ? WHERE id = ? AND revoked IS NULL",
            (time.time(), by, grant_id),
        )
        return count > 0

    async def approval_log_add(
        self,
        platform: str,
        conversation: str,
        action: str,
        by_user: str,
        by_name: str,
        *,
        code: str = "",
        tool: str = "",
        grant_id: int | None = None,
    ) -> None:
        await self._write(
            "INSERT INTO approval_log(at, platform, conversation, code, grant_id, tool, action, by_user,"
            " by_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (time.time(), platform, conversation, code, grant_id, tool, action, by_user, by_name[:200]),
        )

    async def approval_logged(self, platform: str, code: str, action: str, by_user: str) -> bool:
        """Whether ``by_user`` already has ``action`` logged on request ``code`` (a refusal is
        logged once however often it is pressed: the log must not grow with a held button)."""
        sql = (
            "SELECT 1 FROM approval_log WHERE platform = ? AND code = ? AND action = ? AND by_user = ?"
            " LIMIT 1"
        )
        async with self._db.execute(sql, (platform, code, action, by_user)) as cur:
            return await cur.fetchone() is not None

    async def approval_log(self, platform: str, conversation: str, limit: int) -> list[LogRow]:
        """The newest decisions about requests and permissions of ``conversation`` and about the
        platform-wide permissions, newest first."""
        sql = (
            "SELECT at, code, grant_id, tool, action, by_user, by_name FROM approval_log"
            " WHERE platform = ? AND (conversation = ? OR conversation = '') ORDER BY id DESC LIMIT ?"
        )
        async with self._db.execute(sql, (platform, conversation, limit)) as cur:
            rows = await cur.fetchall()
        return [
            LogRow(float(a), str(c), None if g is None else int(g), str(t), str(x), str(u), str(n))
            for a, c, g, t, x, u, n in rows
        ]

    async def approval_log_prune(self, older_than: float) -> int:
        """Drop decisions older than ``older_than`` seconds, and permissions revoked that long ago
        (live ones stay however old: they are still in force)."""
        cutoff = time.time() - older_than
        with self._db.on_thread():  # a scan of the table
            dropped = await self._write("DELETE FROM approval_log WHERE at < ?", (cutoff,))
            await self._write(
                "DELETE FROM approval_grants WHERE revoked IS NOT NULL AND revoked < ?", (cutoff,)
            )
        return dropped
