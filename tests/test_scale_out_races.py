"""Races between daemons on one PostgreSQL database, in-process: two real gateways (their own store
connection, cluster, fake agent and adapter) on one real PostgreSQL server and one fake chat
platform, so a test can freeze one daemon's path to the database and see what users get.

The path is cut with :class:`Pause`, a TCP relay between a daemon and the server: paused, bytes
stop flowing both ways (a half-open connection, a partition), and nothing tells either side.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from agent.events import AgentEvent, ApprovalRequested
from channels.base import Attachment, ChannelState, TransientSendError
from gateway.daemon.cluster import Cluster, Leases
from gateway.daemon.gateway import Gateway
from gateway.ops.metrics import Metrics
from gateway.store.journal import Store
from tests.fakes.fake_channel import FakeChannel, FakePlatform
from tests.fakes.fake_harness import Call, FakeHarness
from tests.fakes.gateway_rig import dm, make_config, running, until

TTL = 1.5


class Pause:
    """A TCP relay to the database server; :meth:`pause` stops every byte, :meth:`cut` closes the
    server's side of each connection (as the server does when its keepalives give up)."""

    def __init__(self, url: str) -> None:
        self._target = urlsplit(url)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        netloc = self._target.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        self.url = urlunsplit(
            self._target._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host)
        )

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(self._target.hostname, self._target.port)
        self._writers += [writer, up_w]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    await self._flowing.wait()
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        for w in self._writers:
            w.close()
        self._writers.clear()
        self.resume()

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


@dataclass
class Node:
    gateway: Gateway
    cluster: Cluster
    channel: FakeChannel
    harness: FakeHarness

    @property
    def store(self) -> Store:
        return self.gateway.store


@contextlib.asynccontextmanager
async def node(
    url: str, name: str, platform: FakePlatform, db_url: str | None = None, **sections: Any
) -> AsyncIterator[Node]:
    """One daemon: store and cluster on ``db_url`` (default ``url``), a Telegram adapter (with
    buttons) on ``platform`` (connected), its own fake agent; ``sections`` of config on top."""
    config = make_config(
        access={"allow_users": ["*"], "pairing": False}, delivery={"first_edit_delay": 0.0}, **sections
    )
    store = await Store.open_postgres(db_url or url)
    harness = FakeHarness()
    leases = Leases(store, ttl=TTL, node=name)
    gateway = Gateway(config, store, harness, Metrics(), cluster=leases)
    cluster = Cluster(leases, gateway, db_url or url, sweep_every=0.2, leader_every=0.3)
    channel = FakeChannel(platform=platform, buttons=True)
    try:
        async with running(channel, gateway):
            cluster.start()
            yield Node(gateway, cluster, channel, harness)
            await gateway.close(0.5)
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await cluster.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await store.close()


@pytest.fixture
async def relay(pg_url: str) -> AsyncIterator[Pause]:
    pause = Pause(pg_url)
    await pause.start()
    yield pause
    await pause.stop()


async def _owner(url: str, key: str) -> Any:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT lease_owner, state FROM journal WHERE key = %s", (key,))
        return await cur.fetchone()


async def _finished(url: str, key: str) -> Any:
    """:func:`_owner` once the entry is no longer pending or running: an entry is marked done a
    moment after its answer is sent, so the answer in the chat does not mean the journal says so."""

    async def finished() -> Any:
        row = await _owner(url, key)
        return row if row is not None and row[1] not in ("pending", "running") else None

    return await until(finished, what=f"{key} finished in the journal")


async def test_a_daemon_cut_off_from_the_database_stops_its_turn_and_the_answer_goes_out_once(
    pg_url: str, relay: Pause
) -> None:
    """A's renewals stop going through while its agent thinks; B takes the turn over once the
    lease lapses and answers. When A's database comes back and its agent finishes, A must not post
    a second answer (before: it did, as a new message, since it had sent nothing yet)."""
    platform = FakePlatform()
    async with node(pg_url, "a", platform, relay.url) as a, node(pg_url, "b", platform) as b:
        a.harness.gate.clear()  # A's agent is busy
        msg = dm(42, "hello")
        await a.channel.deliver(msg)
        await until(lambda: a.harness.calls, what="A started the turn")
        relay.pause()  # A can no longer reach the database (nor tell anyone)
        await until(lambda: b.harness.calls, timeout=TTL * 4, what="B took the turn over")
        await until(lambda: platform.messages, timeout=5, what="B's answer")
        relay.resume()
        a.harness.gate.set()  # A's agent answers now
        await asyncio.sleep(TTL * 2)
        texts = [m.text for m in platform.messages.values()]
        assert texts == ["echo: hello"], texts
        assert (await _finished(pg_url, msg.key))[1] == "done"


async def test_a_daemon_alone_answers_once_after_its_database_was_away_past_the_lease(
    pg_url: str, relay: Pause
) -> None:
    """The same cut with no other daemon: A stops its turn while cut off, and once the database is
    back its own sweep takes the lapsed entry up again (nobody else would), and answers once."""
    platform = FakePlatform()
    async with node(pg_url, "a", platform, relay.url) as a:
        a.harness.gate.clear()
        msg = dm(44, "still there?")
        await a.channel.deliver(msg)
        await until(lambda: a.harness.calls, what="A started the turn")
        relay.pause()
        await asyncio.sleep(TTL * 1.5)
        assert not a.gateway.claimed(), "A went on with a turn whose lease had lapsed"
        relay.resume()
        a.harness.gate.set()
        await until(lambda: platform.messages, timeout=TTL * 6, what="the answer")
        await asyncio.sleep(TTL)
        texts = [m.text for m in platform.messages.values()]
        assert texts == ["echo: still there?"], texts
        assert (await _finished(pg_url, msg.key))[1] == "done"


async def test_a_daemon_whose_lease_was_taken_while_it_was_busy_sends_nothing_more(pg_url: str) -> None:
    """A's event loop was held up past the lease (a long GC, a frozen VM: simulated by letting its
    lease lapse in the database); B took the turn over and answered. A's agent then finishes:
    before A sends, it checks the lease, finds it is B's, and stays silent."""
    platform = FakePlatform()
    async with node(pg_url, "a", platform) as a, node(pg_url, "b", platform):
        a.harness.gate.clear()
        msg = dm(43, "hi there")
        await a.channel.deliver(msg)
        await until(lambda: a.harness.calls, what="A started the turn")
        loops = {task.get_name(): task for task in a.cluster.tasks.running}
        loops["cluster:heartbeat"].cancel()  # A's heartbeat is stuck (the loop is busy elsewhere)
        loops["cluster:fence"].cancel()  # and so is everything else that would notice
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
            await conn.execute("UPDATE journal SET lease_until = 0 WHERE key = %s", (msg.key,))
        await until(lambda: platform.messages, timeout=5, what="B's answer")
        assert (await _finished(pg_url, msg.key)) == ("b", "done")
        a.harness.gate.set()
        await asyncio.sleep(1.0)
        texts = [m.text for m in platform.messages.values()]
        assert texts == ["echo: hi there"], texts


async def test_a_leader_on_a_dead_lock_connection_steps_down_before_another_takes_over(
    pg_url: str, relay: Pause
) -> None:
    """The leader's lock connection goes silent (half-open). Before, its ``SELECT 1`` waited for
    ever: it stayed the leader (and kept polling Telegram) while, once the server dropped the
    session, another daemon took the lock too. Now it steps down within seconds."""
    platform = FakePlatform()
    async with node(pg_url, "a", platform, relay.url) as a:
        await until(lambda: a.cluster.is_leader, timeout=5, what="A leads")
        async with node(pg_url, "b", platform) as b:
            both: list[float] = []

            async def watch() -> None:
                while True:
                    if a.cluster.is_leader and b.cluster.is_leader:
                        both.append(time.monotonic())
                    await asyncio.sleep(0.02)

            watcher = asyncio.create_task(watch())
            relay.pause()
            await until(lambda: not a.cluster.is_leader, timeout=5, what="A steps down")
            relay.cut()  # the server drops the silent session, and the lock with it
            await until(lambda: b.cluster.is_leader, timeout=5, what="B leads")
            watcher.cancel()
            assert not both, "two leaders at once"


async def test_the_lock_connection_asks_the_server_to_drop_it_soon_when_silent(pg_url: str) -> None:
    """The server side of the leader's session gives up on a silent peer in seconds, not after
    the operating system's two hours: else a leader whose host vanished keeps the lock that long."""
    platform = FakePlatform()
    async with node(pg_url, "a", platform) as a:
        await until(lambda: a.cluster.is_leader, timeout=5, what="A leads")
        cur = await a.cluster._lock_conn.execute("SHOW tcp_keepalives_idle")
        assert (await cur.fetchone())[0] == "5"


async def test_a_daemon_goes_on_after_its_database_connection_was_dropped(pg_url: str, relay: Pause) -> None:
    """The server restarts (or a failover, or the network drops the connection): the statement
    that meets the break fails, and the platform's redelivery of the message then works. Before,
    the store's one connection stayed closed and every message failed until a restart."""
    platform = FakePlatform()
    async with node(pg_url, "a", platform, relay.url) as a:
        first = dm(45, "before")
        await a.channel.deliver(first)
        await until(lambda: len(platform.messages) == 1, what="the first answer")
        for _ in range(100):
            if (await _owner(pg_url, first.key))[1] == "done":
                break
            await asyncio.sleep(0.05)
        relay.cut()  # every connection to the server dropped
        second = dm(45, "after")
        for _ in range(3):  # the platform redelivers what the adapter could not acknowledge
            with contextlib.suppress(Exception):
                await a.channel.deliver(second)
                break
            await asyncio.sleep(0.2)
        await until(lambda: len(platform.messages) == 2, timeout=10, what="the answer after the drop")
        assert [m.text for m in platform.messages.values()] == ["echo: before", "echo: after"]


async def asks(call: Call) -> AsyncIterator[AgentEvent]:
    yield ApprovalRequested(
        "intr-1", "execute", {"command": "rm -rf /tmp/cache"}, "The agent wants to run execute."
    )


async def test_a_turn_resumed_by_an_approval_waits_for_the_turn_another_daemon_runs(pg_url: str) -> None:
    """T1 paused on A for an approval; the user's next message T3 started on B. The approval
    comes in while T3 runs: T1 must wait for T3 (on one daemon it queues behind it), not run on
    A at the same time on the same agent thread (the claim only looked at earlier turns, and a
    waiting one is not open, so T3 could start; then T1 could start beside it)."""
    platform = FakePlatform()
    approvals = {"approvals": {"tools": ["execute"], "timeout": 600, "approvers": "requester"}}
    async with (
        node(pg_url, "a", platform, agent=approvals) as a,
        node(pg_url, "b", platform, agent=approvals) as b,
    ):
        a.harness.on("clean the cache", asks)
        t1 = dm(46, "clean the cache")
        await a.channel.deliver(t1)
        request = await until(lambda: next((m for m in platform.messages.values() if m.buttons), None))
        for _ in range(100):  # T1 has paused (until then it is running, and T3 would wait for it)
            if (await _owner(pg_url, t1.key))[1] == "waiting":
                break
            await asyncio.sleep(0.05)
        platform.uploads["f1"] = b"some notes"
        t3 = dataclasses.replace(
            dm(46, "and read this"), attachments=(Attachment("f1", "notes.txt", "text/plain", 10),)
        )
        b.channel.hold("download")  # T3 is running on B (its file still on the way)
        await b.channel.deliver(t3)
        await until(lambda: b.channel.held("download"), what="T3 running on B")
        answer = await a.channel.press(request.message_id, "✅", 46)
        assert not answer.refused, answer.text
        await asyncio.sleep(1.0)
        resumed_early = a.harness.resumed + b.harness.resumed
        b.channel.release("download")
        await until(lambda: a.harness.resumed or b.harness.resumed, timeout=10, what="T1 resumed")
        await until(
            lambda: (
                platform.by_key(f"{t1.key}#0") and platform.by_key(f"{t1.key}#0").text == "resumed: approved"
            ),
            timeout=10,
        )
        assert not resumed_early, "T1 ran beside T3 on the same thread"
        assert b.harness.seen == [("and read this", ["/mnt/user-data/uploads/notes.txt"])]
        assert len(a.harness.resumed + b.harness.resumed) == 1


async def test_the_sweep_sees_work_it_can_take_past_a_backlog_it_cannot(pg_url: str) -> None:
    """A busy daemon A runs a turn in each of 30 chats with 9 more queued behind each (journaled
    without a lease, as a busy daemon does): 270 orphans that no other daemon may claim (they wait
    for A's turn). A new chat's message, also journaled without a lease, is what idle B should
    take. Before, the sweep looked only at the 200 oldest orphans, all unclaimable: B never saw it;
    and only at this daemon's connected platforms (a Discord backlog on a standby: the same)."""
    store = await Store.open_postgres(pg_url)
    try:
        for chat in range(30):
            for n in range(10):
                await store.journal_add(dm(5000 + chat, f"m{n}"), "turn", lease=("a", 60) if n == 0 else None)
        for chat in range(250):
            await store.journal_add(dataclasses.replace(dm(7000 + chat, "x"), platform="discord"), "turn")
        fresh = dm(6000, "new chat")
        await store.journal_add(fresh, "turn")
        orphans = await store.lease_orphans("b", ["telegram"])
        assert fresh.key in orphans
        assert await store.lease_claim(fresh.key, "b", 60)
    finally:
        await store.close()


async def test_a_reply_parked_on_a_daemon_whose_channel_is_down_is_delivered_by_another(pg_url: str) -> None:
    """A answered but could not deliver (its own route to the platform is down: the reply is
    parked and retried for up to ``delivery.retry_window``, 6 h). A keeps renewing the lease of
    what it parked, so no other daemon could deliver it, nor run the next message of that chat
    (it waits for the earlier turn): both waited for A's channel. Now a daemon gives back the
    leases of entries it is not working on whose channel is not connected here."""
    platform = FakePlatform()
    async with node(pg_url, "a", platform) as a, node(pg_url, "b", platform) as b:
        a.channel.fail("send", TransientSendError("network unreachable"), times=None)
        first = dm(47, "one")
        await a.channel.deliver(first)
        await until(lambda: a.gateway.parking.is_parked(first.key), what="A parked the answer")
        a.channel.force_state(ChannelState.RECONNECTING, "network unreachable")
        second = dm(47, "two")
        await b.channel.deliver(second)
        await until(lambda: len(platform.messages) == 2, timeout=TTL * 4, what="both answers")
        texts = [m.text for m in platform.messages.values()]
        assert texts == ["echo: one", "echo: two"], texts


async def test_after_a_fence_the_chat_s_next_turn_still_waits_for_the_cut_one(
    pg_url: str, relay: Pause
) -> None:
    """A's turn T1 is cut by a fence (its database away past the lease) with T2 of the same chat
    queued behind it on A. T2 must not run before T1 has run again: T1's lapsed lease is still
    A's, and a claim counted an earlier turn with A's name on it as no obstacle to A."""
    platform = FakePlatform()
    async with node(pg_url, "a", platform, relay.url) as a:
        a.harness.gate.clear()
        t1, t2 = dm(48, "first"), dm(48, "second")
        await a.channel.deliver(t1)
        await a.channel.deliver(t2)
        await until(lambda: a.harness.calls, what="A started T1")
        relay.pause()
        await until(lambda: not a.gateway.claimed(), timeout=TTL * 2, what="the fence")
        relay.resume()
        a.harness.gate.set()
        answers = {"echo: first", "echo: second"}
        await until(lambda: {m.text for m in platform.messages.values()} == answers, timeout=TTL * 8)
        texts = [c.text for c in a.harness.calls]
        assert texts[-2:] == ["first", "second"], texts
        assert len(platform.messages) == 2  # T2's "queued" sign became its answer


async def test_a_lease_held_on_nothing_is_given_back(pg_url: str) -> None:
    """An open entry carries A's lease, but A is not working on it (a write failed after the lease
    was taken: the connection dropped between the two). A's heartbeat renewed it for ever, so no
    daemon ever answered it. Now A gives it back, and it is answered once."""
    platform = FakePlatform()
    async with node(pg_url, "a", platform) as a, node(pg_url, "b", platform):
        stray = dm(49, "forgotten")
        await a.store.journal_add(stray, "turn", lease=("a", TTL))
        await until(lambda: platform.messages, timeout=TTL * 4, what="the answer")
        await asyncio.sleep(0.5)
        assert [m.text for m in platform.messages.values()] == ["echo: forgotten"]
