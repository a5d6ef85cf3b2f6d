"""The approvals table of the gateway's store: tool calls waiting for a person's yes
(gateway/turns/approvals.py, docs/approvals.md).

A mixin of :class:`gateway.store.journal.Store` (like :mod:`gateway.store.access`), using the store's
connection and its full-disk-aware ``_write``. One row per paused tool call, keyed by the agent's
interrupt id; ``code`` is the short id buttons and text answers carry. A decision is one
conditional UPDATE (``WHERE state = 'pending'``): of two presses, two deliveries of one press, or a
press racing the timeout, exactly one wins. ``resumed`` says the agent has been given it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from channels.base import ReplyTarget
from gateway.store.connection import Connection
from gateway.store.entries import JournalEntry, JournalKind, JournalState, inbound_from_json

APPROVAL_TABLES = (
    """CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY,
    code TEXT NOT NULL UNIQUE,
    key TEXT NOT NULL,
    conversation TEXT NOT NULL,
    platform TEXT NOT NULL,
    target TEXT NOT NULL,
    requester TEXT NOT NULL,
    requester_name TEXT NOT NULL DEFAULT '',
    tool TEXT NOT NULL,
    text TEXT NOT NULL,
    state TEXT NOT NULL,
    decided_by TEXT NOT NULL DEFAULT '',
    message_id TEXT NOT NULL DEFAULT '',
    resumed INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    deadline REAL NOT NULL,
    decided REAL
)""",
    "CREATE INDEX IF NOT EXISTS approvals_key ON approvals(key)",
    "CREATE INDEX IF NOT EXISTS approvals_pending ON approvals(state) WHERE state = 'pending'",
)
"""Created by its schema step (:mod:`gateway.store.schema`)."""

PENDING, APPROVED, DENIED, TIMED_OUT, CANCELLED = "pending", "approved", "denied", "timeout", "cancelled"


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    id: str
    code: str
    key: str
    """Journal key of the turn that paused."""
    conversation: str
    target: ReplyTarget
    requester: str
    requester_name: str
    tool: str
    text: str
    """The request as shown in the chat (Markdown), kept to show it again with the decision."""
    state: str
    decided_by: str
    message_id: str
    resumed: bool
    deadline: float

    @property
    def platform(self) -> str:
        return self.target.platform


_FIELDS = (
    "id, code, key, conversation, target, requester, requester_name, tool, text, state, decided_by,"
    " message_id, resumed, deadline"
)


def _row(row: Any) -> ApprovalRow:
    values = list(row)
    values[4] = ReplyTarget(**json.loads(values[4]))
    values[12] = bool(values[12])
    return ApprovalRow(*values)


class ApprovalTables:
    _db: Connection

    async def _write(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        raise NotImplementedError  # the Store's

    async def approval_add(
        self,
        id: str,
        code: str,
        key: str,
        conversation: str,
        target: ReplyTarget,
        requester: str,
        requester_name: str,
        tool: str,
        text: str,
        deadline: float,
    ) -> ApprovalRow:
        """Record a paused call once; a replayed turn asking again gets the first row back."""
        target_json = json.dumps(
            {"platform": target.platform, "chat_id": target.chat_id, "thread_id": target.thread_id,
             "reply_to": target.reply_to, "extra": target.extra},
            ensure_ascii=False,
        )  # fmt: skip
        await self._write(
            "INSERT OR IGNORE INTO approvals(id, code, key, conversation, platform, target, requester,"
            " requester_name, tool, text, state, created, deadline) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (id, code, key, conversation, target.platform, target_json, requester, requester_name, tool,
             text, PENDING, time.time(), deadline),
        )  # fmt: skip
        row = await self.approval_get(id)
        assert row is not None
        return row

    async def approval_get(self, id: str) -> ApprovalRow | None:
        async with self._db.execute(f"SELECT {_FIELDS} FROM approvals WHERE id = ?", (id,)) as cur:
            row = await cur.fetchone()
        return _row(row) if row else None

    async def approval_by_code(self, code: str) -> ApprovalRow | None:
        async with self._db.execute(f"SELECT {_FIELDS} FROM approvals WHERE code = ?", (code,)) as cur:
            row = await cur.fetchone()
        return _row(row) if row else None

    async def approval_sent(self, id: str, message_id: str) -> None:
        """The id of the message carrying the buttons (to edit it with the decision)."""
        await self._write("UPDATE approvals SET message_id = ? WHERE id = ?", (message_id, id))

    async def approval_decide(self, id: str, state: str, by: str) -> bool:
        """Settle a pending request; False when it was settled before (the first decision wins)."""
        count = await self._write(
            "UPDATE approvals SET state = ?, decided_by = ?, decided = ? WHERE id = ? AND state = ?",
            (state, by, time.time(), id, PENDING),
        )
        return count == 1

    async def approvals_for(self, key: str) -> list[ApprovalRow]:
        """The requests of one turn, oldest first."""
        async with self._db.execute(
            f"SELECT {_FIELDS} FROM approvals WHERE key = ? ORDER BY created, rowid", (key,)
        ) as cur:
            return [_row(r) for r in await cur.fetchall()]

    async def approvals_at_turn(
        self, key: str, conversation: str, platform: str
    ) -> tuple[list[ApprovalRow], list[ApprovalRow]]:
        """At a turn's start, one statement: its own requests (:meth:`approvals_for`) and the others
        still pending in its conversation (a new turn cancels them). The conversation's, not the
        platform's: what waits in other chats costs a turn nothing (docs/scale-out.md)."""
        async with self._db.execute(
            f"SELECT {_FIELDS} FROM approvals WHERE key = ?"
            " OR (state = ? AND conversation = ? AND platform = ?) ORDER BY created, rowid",
            (key, PENDING, conversation, platform),
        ) as cur:
            rows = [_row(r) for r in await cur.fetchall()]
        return [r for r in rows if r.key == key], [r for r in rows if r.key != key]

    async def approvals_pending(self, platform: str | None = None) -> list[ApprovalRow]:
        sql = f"SELECT {_FIELDS} FROM approvals WHERE state = ?"
        params: tuple[Any, ...] = (PENDING,)
        if platform is not None:
            sql, params = sql + " AND platform = ?", (PENDING, platform)
        async with self._db.execute(sql + " ORDER BY deadline", params) as cur:
            return [_row(r) for r in await cur.fetchall()]

    async def approvals_resumed(self, ids: list[str]) -> None:
        """The agent has been given these decisions (a re-run need not give them again)."""
        for id in ids:
            await self._write("UPDATE approvals SET resumed = 1 WHERE id = ?", (id,))

    async def approvals_prune(self, older_than: float) -> int:
        """Drop settled requests older than ``older_than`` seconds (pending ones are kept)."""
        with self._db.on_thread():  # a scan of the table
            return await self._write(
                "DELETE FROM approvals WHERE state != ? AND created < ?", (PENDING, time.time() - older_than)
            )

    # -- the paused turn's journal entry -----------------------------------------------------------
    async def journal_pause(self, key: str) -> None:
        """Park a turn that waits for approvals: ``waiting`` is not resumed at start-up, and the
        run that paused does not count as a failed attempt."""
        await self._write(
            "UPDATE journal SET state = 'waiting', updated = ?, attempts = MAX(attempts - 1, 0)"
            " WHERE key = ?",
            (time.time(), key),
        )

    async def journal_unpause(self, key: str, state: str = "pending") -> bool:
        """Out of ``waiting``: back to ``pending`` to run again, or ``done`` when its requests were
        cancelled; False when the entry was not waiting (so this happens once)."""
        count = await self._write(
            "UPDATE journal SET state = ?, updated = ? WHERE key = ? AND state = 'waiting'",
            (state, time.time(), key),
        )
        return count == 1

    async def journal_entry(self, key: str) -> JournalEntry | None:
        """The journal entry ``key``, or None."""
        async with self._db.execute(
            "SELECT key, conversation, kind, payload, state, attempts FROM journal WHERE key = ?", (key,)
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        inbound, note = inbound_from_json(row[3])
        return JournalEntry(
            row[0],
            row[1],
            JournalKind(row[2]),
            inbound,
            JournalState(row[4]),
            row[5],
            note,
            from_journal=True,
        )

    async def journal_paused_settled(self, platform: str) -> list[str]:
        """Keys of waiting turns of ``platform`` none of whose requests is pending any more."""
        with self._db.on_thread():  # a scan of the whole journal (no index on 'waiting')
            async with self._db.execute(
                "SELECT j.key FROM journal j WHERE j.state = 'waiting' AND j.key LIKE ? AND NOT EXISTS"
                " (SELECT 1 FROM approvals a WHERE a.key = j.key AND a.state = ?)",
                (f"{platform}:%", PENDING),
            ) as cur:
                return [str(k) for (k,) in await cur.fetchall()]
