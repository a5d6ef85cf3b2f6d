"""The real :class:`gateway.daemon.gateway.Gateway` in the test's own process, for tests that assert what users see.

A real store on the test's tmp_path (SQLite, or PostgreSQL with ``CHITAL_TEST_POSTGRES=1``: see
:func:`store_at`) and the production intake, queue, delivery and metrics;
instead of the agent a :class:`~tests.fakes.fake_harness.FakeHarness` (answers ``echo: <text>``
unless scripted), and on the platform side either a real adapter against its fake server
(:func:`gateway_rig` + :func:`running`) or the in-memory :class:`~tests.fakes.fake_channel.FakeChannel`
(:func:`make_gateway`). No model and no subprocess: the end-to-end tests keep those.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import os
import re
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from channels.base import Channel, ChannelState, Inbound
from gateway.config.schema import Config, parse_config
from gateway.daemon.gateway import Gateway
from gateway.ops.metrics import Metrics
from gateway.schedules.clock import ScheduleClock
from gateway.store.journal import Store
from tests.fakes.fake_channel import FakeChannel
from tests.fakes.fake_harness import FakeHarness
from tests.fakes.polling import poll

__all__ = [
    "TEST_POSTGRES",
    "FakeChannel",
    "FakeHarness",
    "Rig",
    "close_gateway",
    "crash",
    "daemon_rows",
    "dm",
    "fake_rig",
    "gateway_rig",
    "make_config",
    "make_gateway",
    "quiet",
    "replied",
    "replies",
    "running",
    "settled",
    "skip_on_postgres",
    "store_at",
    "test_database_url",
    "until",
]

TEST_POSTGRES = os.environ.get("CHITAL_TEST_POSTGRES", "") not in ("", "0")
"""The suite's second pass: every store the tests open, and every daemon they start, on
PostgreSQL (one throw-away cluster for the session, tests/pg_server.py; a fresh database per
data directory and test) instead of SQLite files."""


class _TestDatabases:
    """The session's PostgreSQL cluster and the databases made on it for the running test.

    A fixture cannot reach the helpers that need a database (a store opened in a test's body, a
    daemon's config), so the cluster is started on first use and stopped at exit. The same path
    in the same test gets the same database (a test that reopens its store sees its rows); the
    databases of earlier tests are dropped when the next test asks for one (tests run one at a
    time, so nothing of theirs is still connected but leaks, which ``FORCE`` cuts)."""

    def __init__(self) -> None:
        self._server: Any = None
        self._stack = contextlib.ExitStack()
        self._why = ""
        self._made: dict[str, str] = {}  # key (test id + path) → database name
        self._test = ""

    def _cluster(self) -> Any:
        if self._server is None and not self._why:
            from tests.pg_server import find_postgres, postgres_server

            bindir, self._why = find_postgres()
            if bindir is not None:
                try:
                    self._server = self._stack.enter_context(postgres_server())
                    atexit.register(self._stack.close)
                except Exception as exc:  # the reason the tests skip with
                    self._why = f"PostgreSQL did not start: {exc}"
        if self._server is None:
            import pytest

            pytest.skip(f"CHITAL_TEST_POSTGRES: {self._why}")
        return self._server

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self._cluster().url(), autocommit=True) as conn:
            conn.execute(sql)

    def url(self, path: Path) -> str:
        server = self._cluster()
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        if test != self._test:
            for name in self._made.values():
                self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self._made.clear()
            self._test = test
        key = str(Path(path).resolve())
        if key not in self._made:
            stem = re.sub(r"[^a-z0-9_]", "_", test.rsplit("::", 1)[-1].lower())[:40]
            name = f"{stem}_{uuid.uuid4().hex[:8]}"
            self._admin(f'CREATE DATABASE "{name}"')
            self._made[key] = name
        return str(server.url(self._made[key]))


_databases = _TestDatabases()


def test_database_url(path: Path) -> str:
    """The PostgreSQL database that stands for the SQLite file ``path`` in this test (made on
    first use). Skips the test, with the reason, where PostgreSQL cannot run."""
    return _databases.url(path)


test_database_url.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test for pytest


async def store_at(path: Path, reserve_bytes: int = 0) -> Store:
    """The store a test opens: SQLite at ``path``, or in the PostgreSQL pass the database that
    stands for ``path`` (:func:`test_database_url`; reopening the same path reopens the same rows)."""
    if TEST_POSTGRES:
        return await Store.open_postgres(test_database_url(path))
    return await Store.open(path, reserve_bytes=reserve_bytes)


def daemon_rows(storage: dict[str, Any], sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """What a test reads from a daemon's database (its config's ``storage`` section): the SQLite
    file under ``storage.path``, or ``storage.url``; ``sql`` in the store's SQLite spelling
    (rewritten for PostgreSQL by gateway/store/db.py, as the store's own statements are)."""
    url = storage.get("url")
    if url:
        import psycopg

        from gateway.store.db import to_postgres

        with psycopg.connect(url) as conn:
            return [tuple(row) for row in conn.execute(to_postgres(sql), params).fetchall()]
    with contextlib.closing(sqlite3.connect(Path(storage["path"]) / "gateway.sqlite")) as db:
        return [tuple(row) for row in db.execute(sql, params).fetchall()]


async def turns_settled(storage: dict[str, Any], timeout: float = 15.0) -> None:
    """Wait until no turn entry in the daemon's journal is pending or running: a turn is marked
    after its last delivery (a paced checklist edit may come after the answer), and a command that
    says whether a turn runs (``/plan``, ``/status``) answers differently until then."""
    sql = "SELECT COUNT(*) FROM journal WHERE kind = 'turn' AND state IN ('pending', 'running')"
    deadline = time.monotonic() + timeout
    while daemon_rows(storage, sql)[0][0]:
        if time.monotonic() > deadline:
            raise AssertionError(f"a turn was still open after {timeout}s")
        await asyncio.sleep(0.05)


def skip_on_postgres(why: str) -> Any:
    """``@skip_on_postgres("...")``: a test about SQLite itself (its file, WAL, disk reserve)."""
    import pytest

    return pytest.mark.skipif(TEST_POSTGRES, reason=f"SQLite-specific: {why}")


class Rig:
    """One gateway with its store, metrics and fake agent (and its :class:`FakeChannel`, if any)."""

    def __init__(
        self, gateway: Gateway, harness: FakeHarness, metrics: Metrics, channel: FakeChannel | None = None
    ) -> None:
        self.gateway, self.harness, self.metrics = gateway, harness, metrics
        self._channel = channel

    @property
    def channel(self) -> FakeChannel:
        assert self._channel is not None, "this rig runs a real adapter"
        return self._channel

    @property
    def store(self) -> Store:
        return self.gateway.store

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    def metrics_text(self) -> str:
        return generate_latest(self.metrics.registry).decode()


def make_config(**sections: Any) -> Config:
    """Defaults plus ``sections`` (e.g. ``access={...}``, ``limits={...}``); Telegram on. In the
    PostgreSQL pass a ``storage.path`` gets the ``storage.url`` of the database :func:`store_at`
    opens for its gateway.sqlite, so what the test runs on that config (a CLI command) sees it."""
    data: dict[str, Any] = {"channels": {"telegram": {"enabled": True, "token": "1:x"}}}
    data.update(sections)
    storage = data.get("storage")
    if TEST_POSTGRES and isinstance(storage, dict) and "path" in storage and "url" not in storage:
        data["storage"] = {**storage, "url": test_database_url(Path(storage["path"]) / "gateway.sqlite")}
    return parse_config(data, "test")


async def make_gateway(
    tmp_path: Path,
    config: Config,
    harness: FakeHarness | None = None,
    channel: FakeChannel | None = None,
) -> tuple[Gateway, FakeChannel, FakeHarness]:
    """A gateway on ``tmp_path/gateway.sqlite`` with ``channel`` attached (not yet connected:
    set it CONNECTED, or run it, to resume what the journal holds)."""
    store = await store_at(tmp_path / "gateway.sqlite")
    harness = harness or FakeHarness()
    gw = Gateway(config, store, harness, Metrics())
    channel = channel or FakeChannel()
    gw.attach(channel)
    return gw, channel, harness


async def close_gateway(gw: Gateway) -> None:
    await gw.close(0.5)
    await gw.store.close()


@contextlib.asynccontextmanager
async def gateway_rig(tmp_path: Path, allow_users: list[str]) -> AsyncIterator[Rig]:
    """A gateway for a real adapter under test (attach it with :func:`running`)."""
    config = parse_config(
        {
            "access": {"allow_users": allow_users, "pairing": True, "group_policy": "mention"},
            "storage": {"path": str(tmp_path / "data"), "reserve_mb": 0},
            "delivery": {"first_edit_delay": 0.0},
        }
    )
    store = await store_at(tmp_path / "data" / "gateway.sqlite")
    metrics, harness = Metrics(), FakeHarness()
    gateway = Gateway(config, store, harness, metrics)
    try:
        yield Rig(gateway, harness, metrics)
    finally:
        await gateway.close(0.5)
        await store.close()


ADMIN, USER = 100, 200
"""Who :func:`fake_rig`'s default config lets in (anyone else is a stranger)."""


@contextlib.asynccontextmanager
async def fake_rig(
    tmp_path: Path,
    config: Config | None = None,
    *,
    channel: FakeChannel | None = None,
    harness: FakeHarness | None = None,
    store: Store | None = None,
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[Rig]:
    """A gateway with a :class:`FakeChannel` connected through its sink, so that
    ``rig.channel.deliver(...)`` takes an adapter's path. Pass the ``store`` (and
    ``channel.restarted()``) of an earlier rig to play the next process after a crash, and a
    ``clock`` the test moves for its schedules (``rig.gateway.schedule_clock`` reads it)."""
    config = config or make_config(
        access={"admins": [str(ADMIN)], "allow_users": [str(USER)]}, delivery={"first_edit_delay": 0.05}
    )
    own_store = store is None
    store = store or await store_at(tmp_path / "gateway.sqlite")
    metrics, harness, channel = Metrics(), harness or FakeHarness(), channel or FakeChannel()
    gateway = Gateway(config, store, harness, metrics, schedule_clock=ScheduleClock(clock))
    try:
        async with running(channel, gateway):
            yield Rig(gateway, harness, metrics, channel)
    finally:
        await gateway.close(0.5)
        if own_store:
            await store.close()


async def crash(rig: Rig) -> None:
    """Stop ``rig``'s gateway the way a killed process does: running turns cut where they are
    (their journal entries stay open), nothing more sent. The store stays open for the next rig."""
    await rig.gateway.close(0)
    for task in asyncio.all_tasks():
        if task.get_name().startswith("stream:"):  # a reply's streaming loop (gateway/delivery/reply.py)
            task.cancel()


@contextlib.asynccontextmanager
async def running(
    channel: Channel, rig: Rig | Gateway, *, connect_within: float = 10.0
) -> AsyncIterator[asyncio.Task[None]]:
    """Attach ``channel`` to the gateway, run it until CONNECTED, cancel it on exit."""
    gateway = rig.gateway if isinstance(rig, Rig) else rig
    sink = gateway.attach(channel)
    task = asyncio.create_task(channel.run(sink))
    try:
        async with asyncio.timeout(connect_within):
            while channel.state is not ChannelState.CONNECTED:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        with contextlib.suppress(Exception):
            await channel.close()


_mids = itertools.count(1000)


def dm(user: int | str, text: str, *, mid: str | None = None, name: str = "") -> Inbound:
    """A Telegram direct message from ``user`` (its private chat id is the user id)."""
    return Inbound(
        platform="telegram",
        chat_id=str(user),
        message_id=mid or str(next(_mids)),
        sender_id=str(user),
        text=text,
        is_direct=True,
        addressed=True,
        sender_name=name,
    )


def replied(channel: FakeChannel, inbound: Inbound, *texts: str) -> Callable[[], bool]:
    """A predicate for :func:`until`: the replies to ``inbound`` show exactly ``texts``."""
    return lambda: channel.replies_to(inbound.message_id) == list(texts)


def replies(channel: FakeChannel, inbound: Inbound) -> Callable[[], list[str]]:
    """A predicate for :func:`until`: the replies to ``inbound``, once there are any."""
    return lambda: channel.replies_to(inbound.message_id)


async def until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Poll ``predicate`` until it is truthy; return its value.

    The one polling helper of the suite: a predicate may be a coroutine function (a store or
    memory query), whose result is awaited. Tests wait on state, never on time (no sleeps as
    assertions), so a loaded CI machine only makes them slower, not flaky.
    """
    return await poll(predicate, timeout, what)


async def settled(store: Store, timeout: float = 5.0) -> dict[str, int]:
    """Wait until no journal entry is open; returns the entries per state."""
    deadline = time.monotonic() + timeout
    while await store.journal_open():
        if time.monotonic() > deadline:
            raise AssertionError(f"journal entries still open: {await store.journal_open()}")
        await asyncio.sleep(0.01)
    return await store.journal_counts()


async def quiet(seconds: float = 0.3) -> None:
    """Let spawned tasks run (used before asserting that nothing more happened)."""
    await asyncio.sleep(seconds)
