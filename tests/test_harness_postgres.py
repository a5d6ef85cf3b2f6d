"""The harness on shared PostgreSQL checkpoints, two harnesses standing for two daemons on one
database: a turn on a thread whose last turn finished here skips the state read only when no other
daemon wrote the thread since (agent/harness.py ``_unchanged_elsewhere``, agent/postgres_saver.py
``unchanged_since_own``), and that check costs no database read of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from agent import postgres_saver
from agent.events import Final
from agent.harness import Harness
from tests.fakes.openai_server import FakeOpenAI
from tests.harness_support import FAST, spec, turn, user_texts

pytestmark = pytest.mark.usefixtures("pg_server")


@pytest.fixture
def daemons(fake: FakeOpenAI, tmp_path: Path, pg_url: str, harnesses: list[Harness]) -> Callable[..., Any]:
    """``await daemons()``: a started Harness on the shared database (a daemon of its own)."""

    async def build() -> Harness:
        n = len(harnesses)
        harness = Harness(FAST, spec(fake), tmp_path / f"unused-{n}.sqlite", checkpoint_url=pg_url)
        await harness.start()
        harnesses.append(harness)
        return harness

    return build


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread of every checkpoint read that reached the database (the library's own read)."""
    seen: list[str] = []
    read = AsyncPostgresSaver.aget_tuple

    async def counted(self: AsyncPostgresSaver, config: Any) -> Any:
        seen.append(str(config["configurable"]["thread_id"]))
        return await read(self, config)

    monkeypatch.setattr(AsyncPostgresSaver, "aget_tuple", counted)
    return seen


async def test_a_turn_after_one_of_its_own_reads_the_checkpoint_once(
    fake: FakeOpenAI, daemons: Callable[..., Any], reads: list[str]
) -> None:
    a = await daemons()
    assert (await turn(a, "one", "m1"))[-1] == Final("echo: one")
    assert (await turn(a, "two", "m2"))[-1] == Final("echo: two")
    reads.clear()
    assert (await turn(a, "three", "m3"))[-1] == Final("echo: three")
    # The check's read, handed on to the graph's start: one, where there were two.
    assert reads == ["t1"]
    assert user_texts(fake.requests[-1]) == ["one", "two", "three"]


async def test_a_turn_another_daemon_ran_meanwhile_is_in_the_history(
    fake: FakeOpenAI, daemons: Callable[..., Any], reads: list[str]
) -> None:
    a, b = await daemons(), await daemons()
    await turn(a, "one", "m1")
    await turn(b, "two", "m2")  # the conversation's next turn went to the other daemon
    reads.clear()
    assert (await turn(a, "three", "m3"))[-1] == Final("echo: three")
    assert user_texts(fake.requests[-1]) == ["one", "two", "three"]
    assert len(reads) > 1  # the check saw another daemon's checkpoint: the full state read


async def test_a_message_another_daemon_answered_is_replayed_not_answered_again(
    fake: FakeOpenAI, daemons: Callable[..., Any]
) -> None:
    """Daemon A finished m1; its lease on m2 lapsed and B answered m2; then A runs m2 (the journal
    handed it back after a stall). A's own memory says only "m1 settled here", which alone would
    make m2 look new: the checkpoint says B answered it, so A replays B's answer."""
    a, b = await daemons(), await daemons()
    await turn(a, "one", "m1")
    assert (await turn(b, "two", "m2"))[-1] == Final("echo: two")
    asked = len(fake.requests)
    replayed = await turn(a, "two", "m2")
    assert replayed == [Final("echo: two")] and not replayed[0].fresh
    assert len(fake.requests) == asked  # no second model call, no second answer in the thread
    assert await a.message_count("t1") == 4


async def test_a_turn_of_its_own_after_a_delete_starts_a_new_history(
    fake: FakeOpenAI, daemons: Callable[..., Any]
) -> None:
    """What this process put last is forgotten with the thread (a /new that deletes it)."""
    a = await daemons()
    await turn(a, "one", "m1")
    saver: Any = a.require_graph().checkpointer
    await saver.adelete_thread("t1")
    assert not await saver.unchanged_since_own("t1")
    assert (await turn(a, "two", "m2"))[-1] == Final("echo: two")
    assert user_texts(fake.requests[-1]) == ["two"]


async def test_the_checks_read_is_handed_on_once_while_young(
    daemons: Callable[..., Any], reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check's read answers the next read of the thread's latest checkpoint once; an older one
    (past half the shortest lease: a stalled daemon) is read again from the database."""
    a = await daemons()
    await turn(a, "one", "m1")
    saver: Any = a.require_graph().checkpointer
    latest = {"configurable": {"thread_id": "t1"}}
    reads.clear()
    assert await saver.unchanged_since_own("t1")
    handed = await saver.aget_tuple(latest)
    assert reads == ["t1"] and handed.checkpoint["id"] == saver._own["t1"]
    await saver.aget_tuple(latest)
    assert reads == ["t1", "t1"]  # once only
    monkeypatch.setattr(postgres_saver, "PEEK_SECONDS", 0.0)
    assert await saver.unchanged_since_own("t1")
    await asyncio.sleep(0.01)
    await saver.aget_tuple(latest)
    assert reads == ["t1"] * 4  # too old to hand on
