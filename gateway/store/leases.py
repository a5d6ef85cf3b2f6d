"""Journal leases: which daemon works on an open entry, when several share one database.

Every open journal entry may carry ``lease_owner`` (a daemon's node id) and ``lease_until`` (Unix
time). A daemon works on an entry only after :meth:`LeaseTables.lease_claim` succeeded, renews all
its leases on a heartbeat, and gives them back when it stops cleanly; a daemon that dies stops
renewing, and once its leases lapse another daemon claims the entries and resumes them from the
journal (and the shared checkpoints), editing the same reply through the outbox.

Each claim is one ``UPDATE`` (atomic on both engines): two daemons racing for an entry cannot both
win. A turn is claimable only when no earlier open turn of its conversation belongs to anyone else
(or to no one yet), which keeps a conversation's turns in journal order across daemons.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gateway.store.entries import AtClaim, JournalEntry, JournalKind, JournalState, inbound_from_json

if TYPE_CHECKING:
    from gateway.store.connection import Connection

LEASE_COLUMNS = {"lease_owner": "TEXT", "lease_until": "REAL"}
LEASE_INDEX = (
    "CREATE INDEX IF NOT EXISTS journal_conv_open ON journal(conversation)"
    " WHERE state IN ('pending', 'running')"
)
_OPEN = "state IN ('pending', 'running')"
_LAPSED = "COALESCE(lease_until, 0) < ?"
"""No live lease: never taken or given back (NULL), or lapsed. Spelt as the expiry index below is,
so that both engines find the sweep's few rows through it instead of reading every open entry."""
LEASE_WORK_INDEXES = (
    f"CREATE INDEX IF NOT EXISTS journal_open_owner ON journal(lease_owner) WHERE {_OPEN}",
    f"CREATE INDEX IF NOT EXISTS journal_open_expiry ON journal(COALESCE(lease_until, 0)) WHERE {_OPEN}",
)
"""What keeps a daemon's coordination flat in the number of daemons (docs/scale-out.md, "What
coordination costs"): its heartbeat (and a clean stop) finds its own open entries by owner, and
every sweep the open entries with no live lease by expiry, instead of each reading all the open
entries of every daemon: without them the cluster's sweeps cost daemons x open entries."""
_TURN_IN_ORDER = (
    " AND (kind <> 'turn' OR NOT EXISTS (SELECT 1 FROM journal AS e"
    " WHERE e.conversation = journal.conversation AND e.kind = 'turn' AND e.key <> journal.key"
    f" AND e.{_OPEN} AND (e.lease_owner IS NULL OR e.lease_owner <> ? OR e.lease_until < ?)"
    " AND (e.rowid < journal.rowid OR (e.state = 'running' AND e.lease_until >= ?))))"
)
"""A turn waits for its conversation's earlier open turns that are not this node's live ones (a
lapsed one of this node's was cut by a fence, and runs again first), and for a later one another
daemon is running now: a turn resumed after an approval (its entry was not open
while it waited, so a later turn could start elsewhere) must not run beside it on the same agent
thread; on one daemon it queues behind it."""

_AT_CLAIM = (
    " RETURNING EXISTS (SELECT 1 FROM conversation_models AS m WHERE m.conversation = ?),"
    " EXISTS (SELECT 1 FROM choices AS c WHERE c.conversation = journal.conversation AND c.closed = 0),"
    " EXISTS (SELECT 1 FROM approvals AS a WHERE a.key = journal.key"
    " OR (a.state = 'pending' AND a.conversation = journal.conversation))"
)
"""What a turn's claim returns (:class:`AtClaim`): whether its conversation has a model chosen,
an open question with options, and approvals of this turn or pending ones. The tables belong to
gateway/store/usage.py, choices.py and approvals.py. A "no" lets the turn's start skip that read.
Questions and approvals of the conversation cannot appear in between (its turns make them, and
they wait for this one); a ``/model`` can, at any time, so that "no" holds only for a moment
(:meth:`AtClaim.no_model_choice`)."""


def _intake_lock(conversation: str) -> str:
    """The advisory lock a turn's start takes on its conversation (:meth:`LeaseTables.lease_intake`)."""
    return f"intake:{conversation}"


class LeaseTables:
    """The lease statements of :class:`gateway.store.journal.Store` (a mixin over its connection)."""

    _db: Connection

    async def _write(self, sql: str, params: tuple[object, ...] = ()) -> int:
        raise NotImplementedError

    async def lease_claim(self, key: str, node: str, ttl: float, start: bool = False) -> bool:
        """Take (or renew) the lease of the open entry ``key`` for ``node``; False when another
        live daemon holds it, it is no longer open, or (a turn) an earlier turn of its
        conversation is not this node's, or another daemon runs one of its turns now. ``start``:
        also mark it running, as ``journal_set(key, RUNNING)`` does (one round trip for both)."""
        now = time.time()
        run = ", state = 'running', updated = ?, attempts = attempts + 1" if start else ""
        count = await self._write(
            f"UPDATE journal SET lease_owner = ?, lease_until = ?{run} WHERE key = ? AND {_OPEN}"
            " AND (lease_owner IS NULL OR lease_owner = ? OR lease_until < ?)" + _TURN_IN_ORDER,
            (node, now + ttl, *((now,) if start else ()), key, node, now, node, now, now),
        )
        return count == 1

    async def lease_claim_turn(
        self, key: str, node: str, ttl: float, chat: str, conversation: str | None = None, tries: int = 1
    ) -> AtClaim | None:
        """:meth:`lease_claim` with ``start``, returning in the same statement what the turn's
        start would read next (:class:`AtClaim`; ``chat``: the conversation whose ``/model``
        choice the turn takes, the chat's own for a background task); None when not claimed.
        ``conversation`` (the entry's): behind the lock :meth:`lease_intake` takes, so that a turn
        resumed here and one journaled there at the same moment cannot both start. ``tries``: the
        attempts it counts (0: a turn its insert claimed, and counted, asks again)."""
        now, sent = time.time(), time.monotonic()
        sql = (
            "UPDATE journal SET lease_owner = ?, lease_until = ?, state = 'running', updated = ?,"
            f" attempts = attempts + ? WHERE key = ? AND {_OPEN}"
            " AND (lease_owner IS NULL OR lease_owner = ? OR lease_until < ?)" + _TURN_IN_ORDER + _AT_CLAIM
        )
        params = (node, now + ttl, now, tries, key, node, now, node, now, now, chat)
        if conversation is not None:
            cur = await self._db.execute_locked([_intake_lock(conversation)], sql, params)
        else:
            cur = await self._db.execute(sql, params)
        row = await cur.fetchone()
        await self._db.commit()
        return None if row is None else AtClaim(bool(row[0]), bool(row[1]), bool(row[2]), sent, now)

    async def lease_intake(
        self, row: tuple[str, str, str, str, float], lease: tuple[str, float], chat: str | None
    ) -> tuple[bool, bool, AtClaim | None]:
        """Journal a turn (``row``: key, conversation, kind, payload, time) with ``lease`` (node,
        seconds) when that daemon could claim it now: no open turn of its conversation is anybody's
        but its live one. ``chat`` (not None: the turn starts here at once when leased, and takes
        that chat's ``/model`` choice): when no other turn of its conversation is open at all, the
        insert is also the turn's claim (:meth:`lease_claim_turn`): running, one attempt, and what
        the claim returns (:class:`AtClaim`). One round trip where there were two. Returns
        (journaled now, leased, AtClaim or None).

        That insert runs behind an advisory lock on the conversation (PostgreSQL; SQLite has one
        writer at a time): two daemons journaling two messages of one chat at the same moment
        would otherwise each see no other open turn (neither sees the other's uncommitted row)
        and both start one, on the same agent thread. Behind the lock the second sees the first
        and waits for it, as a separate claim did (:data:`_TURN_IN_ORDER`)."""
        node, conv, now, sent = lease[0], row[1], row[4], time.monotonic()
        free = (
            "NOT EXISTS (SELECT 1 FROM journal AS e WHERE e.conversation = ? AND e.kind = 'turn'"
            f" AND e.{_OPEN} AND (e.lease_owner IS NULL OR e.lease_owner <> ? OR e.lease_until < ?))"
        )
        alone = "NOT EXISTS (SELECT 1 FROM journal AS e WHERE e.conversation = ? AND e.kind = 'turn'"
        alone += f" AND e.{_OPEN})"
        starts = chat is not None
        state, tries = (
            (f"CASE WHEN {alone} THEN 'running' ELSE 'pending' END", f"CASE WHEN {alone} THEN 1 ELSE 0 END")
            if starts
            else ("'pending'", "0")
        )
        sql = (
            "INSERT OR IGNORE INTO journal(key, conversation, kind, payload, created, updated, state,"
            f" attempts, lease_owner, lease_until) SELECT ?, ?, ?, ?, ?, ?, {state}, {tries},"
            f" CASE WHEN {free} THEN ? END, CASE WHEN {free} THEN ? END"
            + (_AT_CLAIM + ", lease_owner, state" if starts else " RETURNING lease_owner, state")
        )
        params = (*row, row[4], *((conv, conv) if starts else ()), conv, node, now, node, conv, node,
                  now, now + lease[1], *((chat,) if starts else ()))  # fmt: skip
        if starts:  # two daemons journaling the chat's messages at once must not both start one
            cur = await self._db.execute_locked([_intake_lock(conv)], sql, params)
        else:
            cur = await self._db.execute(sql, params)
        got = await cur.fetchone()
        await self._db.commit()
        if got is None:
            return False, False, None
        leased, running = bool(got[-2]), got[-1] == JournalState.RUNNING.value
        return True, leased, AtClaim(bool(got[0]), bool(got[1]), bool(got[2]), sent, now) if running else None

    async def lease_claim_next(self, conversation: str, node: str, ttl: float) -> JournalEntry | None:
        """Take the lease of ``conversation``'s oldest open turn that no live daemon holds, when
        ``node`` could claim it now (:meth:`lease_claim`'s conditions); returns the entry (read
        back from the journal, as a restart reads it), or None. Called by the daemon that has just
        finished a turn of that conversation: the next one, journaled meanwhile by another daemon
        that could not run it yet, starts here at once instead of waiting for a sweep (for which
        every daemon would race)."""
        now = time.time()
        async with self._db.execute(
            "UPDATE journal SET lease_owner = ?, lease_until = ? WHERE key = (SELECT key FROM journal"
            f" WHERE conversation = ? AND kind = 'turn' AND {_OPEN} AND {_LAPSED} ORDER BY rowid LIMIT 1)"
            f" AND {_OPEN} AND {_LAPSED}"
            + _TURN_IN_ORDER
            + " RETURNING key, conversation, kind, payload, state, attempts",
            (node, now + ttl, conversation, now, now, node, now, now),
        ) as cur:
            row = await cur.fetchone()
        await self._db.commit()
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

    async def lease_keep(self, key: str, node: str, ttl: float) -> bool:
        """Renew ``node``'s lease on ``key``, which it is working on (taken again if it lapsed and
        no other daemon took it meanwhile); False when another daemon holds it now, or it is no
        longer open. Unlike a claim, no order check: the work started in order."""
        now = time.time()
        count = await self._write(
            f"UPDATE journal SET lease_owner = ?, lease_until = ? WHERE key = ? AND {_OPEN}"
            " AND (lease_owner = ? OR lease_owner IS NULL OR lease_until < ?)",
            (node, now + ttl, key, node, now),
        )
        return count == 1

    async def lease_renew(self, node: str, ttl: float) -> set[str]:
        """Push back the expiry of every open entry ``node`` holds; returns their keys (an entry
        this daemon works on that is not among them was taken over: gateway/daemon/cluster.py fences it)."""
        async with self._db.execute(
            f"UPDATE journal SET lease_until = ? WHERE lease_owner = ? AND {_OPEN} RETURNING key",
            (time.time() + ttl, node),
        ) as cur:
            keys = {str(k) for (k,) in await cur.fetchall()}
        await self._db.commit()
        return keys

    async def lease_owner(self, key: str) -> str | None:
        """Who holds the live lease of ``key`` (None: nobody, or it lapsed)."""
        async with self._db.execute(
            "SELECT lease_owner FROM journal WHERE key = ? AND lease_until >= ?", (key, time.time())
        ) as cur:
            row = await cur.fetchone()
        return str(row[0]) if row and row[0] else None

    async def lease_release(self, key: str, node: str) -> None:
        """Give back ``node``'s lease on ``key`` (it could not run it yet: another daemon may)."""
        await self._write(
            "UPDATE journal SET lease_owner = NULL, lease_until = NULL WHERE key = ? AND lease_owner = ?",
            (key, node),
        )

    async def lease_release_all(self, node: str) -> int:
        """Give back every lease of ``node`` (a clean stop: the others resume its entries at once)."""
        return await self._write(
            f"UPDATE journal SET lease_owner = NULL, lease_until = NULL WHERE lease_owner = ? AND {_OPEN}",
            (node,),
        )

    async def lease_orphans(self, node: str, platforms: Sequence[str], limit: int = 200) -> list[str]:
        """Keys of open entries of ``platforms`` no live daemon holds (never claimed, or their
        owner's lease lapsed) that ``node`` could claim now, oldest first: what a sweep picks up.

        ``node``'s own lapsed entries too: a daemon whose renewals failed stopped working on them
        (gateway/daemon/cluster.py), and when it is the only one left nobody else would ever take them (a
        dispatch skips what this daemon still runs). Only what ``node`` could claim, and only of
        its connected platforms: else the ``limit`` oldest could all be turns waiting behind
        another daemon's running turn, or another platform's, and newer work that an idle daemon
        could take would never be seen."""
        if not platforms:
            return []
        now = time.time()
        mine = " OR ".join("conversation LIKE ?" for _ in platforms)
        async with self._db.execute(
            f"SELECT key FROM journal WHERE {_OPEN} AND {_LAPSED}"
            f" AND ({mine})" + _TURN_IN_ORDER + " ORDER BY rowid LIMIT ?",
            (now, *(f"{p}:%" for p in platforms), node, now, now, limit),
        ) as cur:
            return [str(k) for (k,) in await cur.fetchall()]

    async def lease_holders(self) -> dict[str, int]:
        """Open entries per lease owner (``""``: none), for status pages and tests."""
        async with self._db.execute(
            f"SELECT COALESCE(lease_owner, ''), COUNT(*) FROM journal WHERE {_OPEN} GROUP BY 1"
        ) as cur:
            return {str(owner): int(n) for owner, n in await cur.fetchall()}
