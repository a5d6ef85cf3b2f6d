"""Several daemons on one PostgreSQL database: leases on the journal, a sweep, and a leader.

What each daemon does (docs/scale-out.md):

- **Intake** is the same on every daemon: the journal insert is the claim on a message, so an event
  delivered to two daemons (a Slack retry landing on another socket) is journaled once.
- **Work** on an entry needs its lease (gateway/store/leases.py): a claim when the entry is about to
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
  its leader-only channels up, because it can no longer know it is still the only one. The leader
  also owns the timers: approval timeouts, schedule firings, retention (gateway/daemon/timers.py).
- **Fencing.** A lease is only as good as its renewals: a daemon whose renewals have not gone
  through for three quarters of the lease (the database unreachable, the process frozen), or whose
  renewal shows an entry it works on now belongs to another daemon, stops that work at once,
  silently, without touching the journal (as a shutdown cuts a turn), and gives the lease back when
  it can: whoever holds the lease then answers, in the same message, once. The last check is made
  again just before an answer goes out (:meth:`Leases.keep`).
- **A schema it does not know.** Each renewal first reads the database's schema version and writer
  floor (gateway/store/schema_compat.py): two one-row reads every ``ttl / 3``, nothing per message.
  A newer version whose steps only add is logged once and changes nothing. A floor above what
  this daemon understands (a newer daemon ran a step older ones must not write beside) stops it
  writing: it takes nothing in (the gateway's intake refuses, as while stopping), cuts what it
  works on, closes its channels (``on_refuse``: their platforms deliver to the other daemons),
  steps down and gives its leases back; ``/readyz`` and ``chital status`` say why until it is
  stopped. The lease columns are the one thing such a step may never change the meaning of.
- **A dead lock connection** (a half-open TCP connection, the server restarted): the leader's
  ``SELECT 1`` has a deadline, so a leader that cannot reach the server steps down within
  ``leader_every`` + that deadline, well before the server drops the session (and the lock) on its
  TCP keepalives, set short on that connection, so that two daemons never poll at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from channels.base import Channel
from gateway.config.push import PUSH_PLATFORM
from gateway.ops.tasks import TaskTracker
from gateway.store.db import PgConnection
from gateway.store.entries import JournalEntry, JournalState
from gateway.store.journal import Store
from gateway.store.schema import known_version
from gateway.store.schema_compat import newer_note, refusal

log = logging.getLogger(__name__)

LeaderHook = Callable[[], Awaitable[None]]
FENCE_AFTER = 3 / 4
"""Renewals failing for this share of the lease: stop working on its entries (another daemon may
take them once the lease lapses, at 1)."""
LOCK_KEEPALIVE = "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3"
"""The server drops the lock connection's session (and the lock) ~11 s after its leader's host
went silent, not the operating system's default two hours."""


class Leases:
    """This daemon's leases on journal entries: what the Gateway asks before it works on an entry
    and before its answer goes out. Made first, from the store alone, and handed to both the
    Gateway (which claims) and the :class:`Cluster` (which renews, fences and sweeps): so neither
    needs the other to exist first (docs/design.md, "Composition")."""

    def __init__(self, store: Store, *, ttl: float = 15.0, node: str | None = None) -> None:
        self.store = store
        self.ttl = ttl
        self.node = node or uuid.uuid4().hex[:12]
        self.fenced: set[str] = set()
        """Keys whose work this daemon stopped, to give back at the next renewal that goes through."""

    def intake_lease(self, busy: bool) -> tuple[str, float] | None:
        """The lease a message journaled here starts with: this daemon's while it has room for
        another turn (``busy`` False: the reply goes out from where the message came in, at once),
        none when it is busy, so that an idle daemon's sweep takes the message instead."""
        return None if busy else (self.node, self.ttl)

    async def claim(self, entry: JournalEntry, working: set[str], start: bool = False) -> bool:
        """Take the lease of ``entry``; ``working``: the keys this daemon works on now. ``start``:
        a turn about to run, marked running by the same statement (``entry.started``), which also
        says what the turn's start need not read (``entry.at_claim``)."""
        await self.give_back(self.store, working)  # a fenced earlier turn must not read as ours and live
        if not start:
            return await self.store.lease_claim(entry.key, self.node, self.ttl)
        tries = 1
        if entry.started:  # its insert claimed it (Store.journal_add_turn): running, this daemon's
            if entry.at_claim is not None and entry.at_claim.within(self.ttl / 2):
                return True  # so young that its lease cannot have lapsed
            # It waited here (a queue, a stall) and its lease may have lapsed: another daemon may
            # run it, or an earlier turn of its chat, now. Claimed again, in order, with fresh
            # hints; its insert counted its attempt.
            tries = 0
        entry.at_claim = await self.store.lease_claim_turn(
            entry.key, self.node, self.ttl, entry.inbound.conversation, entry.conversation, tries
        )
        entry.started = entry.at_claim is not None
        return entry.started

    async def claim_next(self, conversation: str) -> JournalEntry | None:
        """The next turn of ``conversation`` that waits for no one, taken by this daemon (it has just
        finished the one before): :meth:`Store.lease_claim_next`."""
        return await self.store.lease_claim_next(conversation, self.node, self.ttl)

    async def give_back(self, store: Store, working: set[str]) -> None:
        """Release the leases of fenced entries this daemon has not taken up again."""
        for key in list(self.fenced):
            if key not in working:
                await store.lease_release(key, self.node)
            self.fenced.discard(key)

    async def holds(self, entry: JournalEntry) -> bool:
        """This daemon holds the lease of ``entry`` now (no other may run it meanwhile)."""
        return await self.store.lease_owner(entry.key) == self.node

    async def release(self, entry: JournalEntry) -> None:
        await self.store.lease_release(entry.key, self.node)

    async def keep(self, entry: JournalEntry) -> bool:
        """Just before an answer goes out: this daemon still holds the lease of ``entry`` (taken
        again if it lapsed and nobody else took it). False: another daemon has it, or the database
        cannot say; the entry is then fenced, and its caller gives the work up and sends nothing."""
        try:
            if await self.store.lease_keep(entry.key, self.node, self.ttl):
                return True
        except Exception as exc:
            log.warning("cluster: could not check the lease of %s: %s", entry.key, exc)
        log.warning("cluster: %s is not this daemon's any more; its work here is given up", entry.key)
        self.fenced.add(entry.key)
        return False


class Parked(Protocol):
    def is_parked(self, key: str) -> bool: ...


class LocalWork(Protocol):
    """What the cluster's loops read of this daemon's own work, and what they do to it (the
    Gateway has it): which channels are here and connected, which entries it handles, works on
    under a lease or has parked; stop some (``cut``), pick one up."""

    @property
    def channels(self) -> Mapping[str, Channel]: ...
    @property
    def parking(self) -> Parked: ...

    def claimed(self) -> set[str]: ...

    def cut(self, keys: set[str]) -> int: ...

    def connected(self, platform: str) -> bool: ...

    def handles(self, key: str) -> bool: ...

    def pick_up(self, entry: JournalEntry) -> bool: ...

    def stop_intake(self) -> None: ...


class Cluster:
    """This daemon's part in the cluster: the loops over its :class:`Leases`. Made after the
    gateway (its ``work``), ``start()`` once the channels are attached, ``close()`` before the
    store closes."""

    def __init__(
        self,
        leases: Leases,
        work: LocalWork,
        url: str,
        *,
        sweep_every: float = 1.0,
        leader_every: float = 2.0,
        tasks: TaskTracker | None = None,
    ) -> None:
        self.leases = leases
        self.work = work
        self.url = url
        self.sweep_every = sweep_every
        self.leader_every = leader_every
        self.is_leader = False
        self.on_lead: list[LeaderHook] = []
        """Called when this daemon becomes the leader (start the leader-only channels)."""
        self.on_unlead: list[LeaderHook] = []
        """Called when it stops being the leader (stop them)."""
        self.on_refuse: list[LeaderHook] = []
        """Called once when the schema moved beyond what this daemon may write (close the channels)."""
        self.refusal: str | None = None
        """Why this daemon writes nothing more (gateway/store/schema_compat.py); None while it may."""
        self._schema_seen = leases.store.schema.version
        """The schema version last logged about: a newer one is said once."""
        self.tasks = tasks if tasks is not None else TaskTracker()
        """The cluster's four loops: a loop that fails is logged at once (gateway/ops/tasks.py)."""
        self._lock_conn: Any = None
        self._renewed = time.monotonic()
        """When the last renewal that went through was sent (monotonic)."""
        self._beat: Store | None = None
        """The heartbeat's own connection (see :meth:`renew_once`)."""
        self._trying: float | None = None
        """When the renewal under way was started (monotonic); None: none is."""
        self._failing = False
        """The last renewal failed (or timed out)."""

    @property
    def store(self) -> Store:
        return self.leases.store

    @property
    def node(self) -> str:
        return self.leases.node

    @property
    def ttl(self) -> float:
        return self.leases.ttl

    def fence(self, keys: Iterable[str]) -> int:
        """Stop working on ``keys`` now (their leases lapsed or were taken over); returns how many
        were running here. Their leases are given back at the next renewal that goes through."""
        keys = set(keys)
        self.leases.fenced |= keys
        cut = self.work.cut(keys)
        if cut:
            log.warning("cluster: stopped %d entr(ies) whose lease this daemon lost", cut)
        return cut

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        log.info("cluster: this daemon is node %s (lease %gs)", self.node, self.ttl)
        self.tasks.spawn(self._heartbeat(), "cluster:heartbeat")
        self.tasks.spawn(self._watch(), "cluster:fence")
        self.tasks.spawn(self._sweep(), "cluster:sweep")
        self.tasks.spawn(self._lead(), "cluster:leader")

    async def close(self) -> None:
        """Stop the loops, give up leadership and every lease (the others take over at once)."""
        await self.tasks.close()
        await self._step_down()
        beat, self._beat = self._beat, None
        if beat is not None:
            await asyncio.wait({_forget(asyncio.ensure_future(beat.close()))}, timeout=1.0)
        with contextlib.suppress(Exception):
            released = await self.store.lease_release_all(self.node)
            if released:
                log.info("cluster: gave back %d unfinished entr(ies) to the other daemons", released)

    # -- loops ------------------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            self._trying = time.monotonic()
            try:
                await _bounded(self.renew_once(), self.ttl / 3)
                self._trying, self._failing = None, False
                if self.refusal is not None:
                    await self._stop_writing()
                    return
            except Exception as exc:
                self._trying, self._failing = None, True
                log.warning("cluster: could not renew leases: %s", exc)
                beat, self._beat = self._beat, None  # a new connection next time
                if beat is not None:
                    _forget(asyncio.ensure_future(beat.close()))

    async def renew_once(self) -> None:
        """Give back what was fenced, renew the rest, and fence what turns out to be another's.

        On a connection of its own: on the store's, shared by every turn, a renewal waits behind
        their statements, and under load that alone would let the leases lapse."""
        if self._beat is None:
            self._beat = Store(await PgConnection.connect(self.url), Path("heartbeat"))
        beat = self._beat
        if not await self._schema_allows(beat):
            return
        sent = time.monotonic()
        working = self.work.claimed()
        await self.leases.give_back(beat, working)
        renewed = await beat.lease_renew(self.node, self.ttl)
        self._renewed = sent
        # Held but not worked on: given back, for the sweeps. A parked reply, or a queued turn, for
        # a channel that is down here: a daemon that can reach the platform delivers it (and the
        # next turns of that chat, which wait for it) instead of this one waiting out the retry
        # window. Anything else this daemon neither handles nor has parked (a write that failed
        # after the lease was taken, as when the connection dropped): else renewed for ever, and
        # never run.
        gw = self.work
        for key in renewed - working:
            if key in gw.claimed():
                continue
            down = not gw.connected(key.split(":", 1)[0])
            if down or not (gw.handles(key) or gw.parking.is_parked(key)):
                await beat.lease_release(key, self.node)
        lost = [k for k in working & gw.claimed() if k not in renewed]
        # Not renewed: finished meanwhile (its lease still reads as ours), or taken over.
        lost = [k for k in lost if await beat.lease_owner(k) != self.node]
        if lost:
            self.fence(lost)

    async def _schema_allows(self, beat: Store) -> bool:
        """This daemon may still write: the database's writer floor is not above the schema it
        understands. Read before each renewal, so a newer daemon's incompatible step stops the
        older ones within a heartbeat; the heartbeat then stops writing (:meth:`_stop_writing`)."""
        state = self.store.schema = await beat.schema_state()
        known = known_version()
        self.refusal = refusal(state, known)
        if self.refusal is None and state.version > max(known, self._schema_seen):
            self._schema_seen = state.version
            log.warning("cluster: %s", newer_note(state, known))
        return self.refusal is None

    async def _stop_writing(self) -> None:
        """The schema moved beyond this daemon: take nothing in, cut what runs here (another daemon
        resumes it from the journal), close the channels, step down, give every lease back. The
        daemon stays up, not ready, saying why, until the operator stops it."""
        log.error("cluster: %s", self.refusal)
        self.work.stop_intake()  # no await before the cut: nothing new starts in between
        working = self.work.claimed()
        self.leases.fenced |= working
        cut = self.work.cut(working)
        if cut:
            log.warning("cluster: cut %d entr(ies) running here; another daemon resumes them", cut)
        for hook in self.on_refuse:  # the channels, closed for good: stepping down starts none again
            try:
                await hook()
            except Exception as exc:
                log.warning("cluster: while stopping intake: %s", exc)
        await self._step_down()
        try:
            released = await self.store.lease_release_all(self.node)
        except Exception as exc:  # they lapse within the lease instead
            log.warning("cluster: could not give the leases back: %s", exc)
            return
        log.warning("cluster: gave back %d entr(ies); this daemon takes no more work", released)

    async def _watch(self) -> None:
        """Fence everything running here once renewals stopped going through (this needs no
        database, so it works while the renewal itself hangs). Only when the database failed or
        kept a renewal waiting: a process merely slow to get round to renewing (every daemon's
        CPU taken for a moment) has its renewal answered when it asks, and goes on."""
        while True:
            await asyncio.sleep(self.ttl / 6)
            now = time.monotonic()
            trouble = self._failing or (self._trying is not None and now - self._trying >= self.ttl / 4)
            if trouble and now - self._renewed >= self.ttl * FENCE_AFTER:
                working = self.work.claimed()
                if working:
                    log.warning("cluster: leases not renewed for %.1fs", time.monotonic() - self._renewed)
                    self.fence(working)

    async def _sweep(self) -> None:
        while self.refusal is None:
            await asyncio.sleep(self.sweep_every)
            if self.refusal is not None:
                return
            try:
                await self.sweep_once()
            except Exception as exc:
                log.warning("cluster: sweep failed: %s", exc)

    async def sweep_once(self) -> int:
        """Dispatch the open entries no live daemon holds, for channels connected here."""
        gw = self.work
        platforms = [name for name in gw.channels if gw.connected(name)]
        if gw.connected(PUSH_PLATFORM):  # push targets need no connection: always swept
            platforms.append(PUSH_PLATFORM)
        started = 0
        for key in await self.store.lease_orphans(self.node, platforms):
            if gw.handles(key):
                continue  # queued here already (journaled while this daemon was busy)
            entry = await self.store.journal_entry(key)
            if entry is not None and entry.state in (JournalState.PENDING, JournalState.RUNNING):
                started += gw.pick_up(entry)
        if started:
            log.info("cluster: picked up %d entr(ies) no daemon was working on", started)
        return started

    async def _lead(self) -> None:
        """Try for the leader lock every ``leader_every`` s; once held, check the connection that
        holds it as often, and step down when it fails."""
        key = zlib.crc32(b"chital-leader")
        while self.refusal is None:
            try:
                if not self.is_leader:
                    if await self._try_lock(key):
                        if self.refusal is not None:  # refused while asking: not for this daemon
                            await self._step_down()
                            return
                        self.is_leader = True
                        log.info("cluster: node %s is the leader", self.node)
                        for hook in self.on_lead:
                            await hook()
                else:
                    await self._ask("SELECT 1")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cluster: leader lock connection failed: %s", exc)
                await self._step_down()
            await asyncio.sleep(self.leader_every)

    async def _try_lock(self, key: int) -> bool:
        if self._lock_conn is None or self._lock_conn.closed:
            import psycopg

            async with asyncio.timeout(self.leader_every * 2):
                self._lock_conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            await self._ask(LOCK_KEEPALIVE)
        cur = await self._ask("SELECT pg_try_advisory_lock(%s)", (key,))
        row = await cur.fetchone()
        return bool(row and row[0])

    async def _ask(self, sql: str, params: tuple[Any, ...] | None = None) -> Any:
        """One statement on the lock connection, with a deadline: on a half-open connection it
        would wait for ever. Not cancelled on the deadline (psycopg would then wait to cancel it
        on the server, which is just as unreachable): left behind, and the connection dropped."""
        return await _bounded(self._lock_conn.execute(sql, params), self.leader_every * 2)

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
            # The server releases the lock with the session. Not awaited for long: on a dead
            # connection closing may hang too, and the step down must not.
            closing = _forget(asyncio.ensure_future(conn.close()))
            await asyncio.wait({closing}, timeout=1.0)


def _forget(task: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """Nobody waits for ``task`` (a statement on a dead connection): its error is not reported."""
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return task


async def _bounded(coro: Awaitable[Any], seconds: float) -> Any:
    """``coro``'s result, or TimeoutError after ``seconds``. On the deadline ``coro`` is left to
    itself, not cancelled: psycopg would wait to cancel the query on a server that is just as
    unreachable; the caller drops the connection instead."""
    work = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({work}, timeout=seconds)
    if not done:
        _forget(work)
        raise TimeoutError(f"no answer from the database in {seconds:g}s")
    return work.result()
