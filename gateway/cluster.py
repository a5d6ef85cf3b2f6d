"""Several daemons on one PostgreSQL database: leases on the journal, a sweep, and a leader.

What each daemon does (docs/scale-out.md):

- **Intake** is the same on every daemon: the journal insert is the claim on a message, so an event
  delivered to two daemons (a Slack retry landing on another socket) is journaled once.
- **Work** on an entry needs its lease (gateway/store_leases.py): a claim when the entry is about to
  run, renewed every ``ttl / 3`` while this daemon holds it, given back on a clean stop.
- **The sweep**, every ``sweep_every`` seconds, picks up open entries no live daemon holds: those a
  daemon left behind when it died (its leases lapsed), and those another daemon journaled but
  could not run yet (an earlier turn of the same conversation was elsewhere). It dispatches them
  like a restart's resume; the claim then decides who runs each.
- **A leader** runs what a platform allows only once per bot: Telegram's long polling (a second
  ``getUpdates`` gets 409 Conflict) and Discord's gateway for a single shard. Leadership is a
  PostgreSQL session advisory lock held on a connection of its own: when the leader dies, the
  server drops its connection and the lock with it, and the next daemon to ask (every
  ``leader_every`` seconds) takes over. A leader that cannot reach the database any more gives
  its leader-only channels up, because it can no longer know it is still the only one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .store import JournalEntry

if TYPE_CHECKING:
    from .core import Gateway

log = logging.getLogger(__name__)

LeaderHook = Callable[[], Awaitable[None]]


class Cluster:
    """This daemon's part in the cluster. ``start()`` after the gateway exists, ``close()`` before
    the store closes."""

    def __init__(
        self,
        gateway: Gateway,
        url: str,
        *,
        ttl: float = 15.0,
        sweep_every: float = 1.0,
        leader_every: float = 2.0,
        node: str | None = None,
    ) -> None:
        self.gateway = gateway
        self.store = gateway.store
        self.url = url
        self.ttl = ttl
        self.sweep_every = sweep_every
        self.leader_every = leader_every
        self.node = node or uuid.uuid4().hex[:12]
        self.is_leader = False
        self.on_lead: list[LeaderHook] = []
        """Called when this daemon becomes the leader (start the leader-only channels)."""
        self.on_unlead: list[LeaderHook] = []
        """Called when it stops being the leader (stop them)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._lock_conn: Any = None

    # -- claims -----------------------------------------------------------------------------------
    def intake_lease(self) -> tuple[str, float] | None:
        """The lease a message journaled here starts with: this daemon's while it has room for
        another turn (the reply goes out from where the message came in, at once), none when it is
        busy, so that an idle daemon's sweep takes the message instead."""
        turns = self.gateway.turns
        if turns.running_count + turns.queued_count >= self.gateway.config.concurrency.max_turns:
            return None
        return self.node, self.ttl

    async def claim(self, entry: JournalEntry) -> bool:
        return await self.store.lease_claim(entry.key, self.node, self.ttl)

    async def holds(self, entry: JournalEntry) -> bool:
        """This daemon holds the lease of ``entry`` now (no other may run it meanwhile)."""
        return await self.store.lease_owner(entry.key) == self.node

    async def release(self, entry: JournalEntry) -> None:
        await self.store.lease_release(entry.key, self.node)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        log.info("cluster: this daemon is node %s (lease %gs)", self.node, self.ttl)
        self._tasks = [
            asyncio.create_task(self._heartbeat(), name="cluster:heartbeat"),
            asyncio.create_task(self._sweep(), name="cluster:sweep"),
            asyncio.create_task(self._lead(), name="cluster:leader"),
        ]

    async def close(self) -> None:
        """Stop the loops, give up leadership and every lease (the others take over at once)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._step_down()
        with contextlib.suppress(Exception):
            released = await self.store.lease_release_all(self.node)
            if released:
                log.info("cluster: gave back %d unfinished entr(ies) to the other daemons", released)

    # -- loops ------------------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.store.lease_renew(self.node, self.ttl)
            except Exception as exc:
                log.warning("cluster: could not renew leases: %s", exc)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_every)
            try:
                await self.sweep_once()
            except Exception as exc:
                log.warning("cluster: sweep failed: %s", exc)

    async def sweep_once(self) -> int:
        """Dispatch the open entries no live daemon holds, for channels connected here."""
        gw = self.gateway
        keys = await self.store.lease_orphans(self.node)
        if not keys:
            return 0
        wanted = set(keys)
        started = 0
        for entry in await self.store.journal_open():
            if entry.key in wanted and gw.connected(entry.inbound.platform):
                started += gw.pick_up(entry)
        if started:
            log.info("cluster: picked up %d entr(ies) no daemon was working on", started)
        return started

    async def _lead(self) -> None:
        """Try for the leader lock every ``leader_every`` s; once held, check the connection that
        holds it as often, and step down when it fails."""
        key = zlib.crc32(b"chital-leader")
        while True:
            try:
                if not self.is_leader:
                    if await self._try_lock(key):
                        self.is_leader = True
                        log.info("cluster: node %s is the leader", self.node)
                        for hook in self.on_lead:
                            await hook()
                else:
                    await self._lock_conn.execute("SELECT 1")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cluster: leader lock connection failed: %s", exc)
                await self._step_down()
            await asyncio.sleep(self.leader_every)

    async def _try_lock(self, key: int) -> bool:
        if self._lock_conn is None or self._lock_conn.closed:
            import psycopg

            self._lock_conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        cur = await self._lock_conn.execute("SELECT pg_try_advisory_lock(%s)", (key,))
        row = await cur.fetchone()
        return bool(row and row[0])

    async def _step_down(self) -> None:
        was = self.is_leader
        self.is_leader = False
        if was:
            log.warning("cluster: node %s is no longer the leader", self.node)
            for hook in self.on_unlead:
                with contextlib.suppress(Exception):
                    await hook()
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()  # the server releases the lock with the session
