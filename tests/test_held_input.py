"""A turn's input checkpoint held until its first step, and the model's writes until their step's
checkpoint, on PostgreSQL (agent/postgres_saver.py, "A turn's first step"): two round trips where
there were five, each batch committing together, what is held stored when the turn stops in
between (a cancel), a reader meanwhile taking nothing, and (switched on) step 0 held too."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from agent import postgres_saver
from agent.events import Final, TurnFailed
from agent.harness import Harness
from agent.held_checkpoints import HeldPut
from tests.fakes.openai_server import FakeOpenAI
from tests.harness_support import FAST, spec, turn, user_texts

pytestmark = pytest.mark.usefixtures("pg_server")


@pytest.fixture
def daemon(fake: FakeOpenAI, tmp_path: Path, pg_url: str, harnesses: list[Harness]) -> Callable[..., Any]:
    async def build() -> Harness:
        harness = Harness(
            FAST, spec(fake), tmp_path / f"unused-{len(harnesses)}.sqlite", checkpoint_url=pg_url
        )
        await harness.start()
        harnesses.append(harness)
        return harness

    return build


async def _sql(url: str, sql: str, *params: Any) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(sql, params or None)
        return await cur.fetchall() if cur.description else []


async def _stored(url: str, thread: str) -> tuple[int, int]:
    """(checkpoints, writes) of ``thread`` in the database."""
    [(checkpoints,)] = await _sql(url, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread)
    [(writes,)] = await _sql(url, "SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s", thread)
    return checkpoints, writes


def _count_connections(saver: Any) -> list[int]:
    """Count the connections the saver takes from its pool (one per round trip it makes)."""
    taken = [0]
    pool = saver.conn
    take = pool.connection

    def counted(*args: Any, **kwargs: Any) -> Any:
        taken[0] += 1
        return take(*args, **kwargs)

    pool.connection = counted
    return taken


def _stall_while_input_held(monkeypatch: pytest.MonkeyPatch) -> tuple[asyncio.Event, asyncio.Event]:
    """Writes that come while a turn's input is held wait for ``go``; ``held`` is set when one
    comes (the turn is then between its input and its step 0). ``monkeypatch.undo()`` ends it."""
    held, go = asyncio.Event(), asyncio.Event()
    writes = postgres_saver.KeptPostgresSaver.aput_writes

    async def stalled(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        if any(h.items and isinstance(h.items[0], HeldPut) for h in self._held.values()):
            held.set()
            await go.wait()
        await writes(self, config, *args, **kwargs)

    monkeypatch.setattr(postgres_saver.KeptPostgresSaver, "aput_writes", stalled)
    return held, go


async def test_a_new_turns_checkpoints_take_two_round_trips_not_five(
    fake: FakeOpenAI, daemon: Callable[..., Any]
) -> None:
    a = await daemon()
    saver: Any = a.require_graph().checkpointer
    assert saver.holds_turns
    taken = _count_connections(saver)
    for n in range(3):  # the thread's history kept, its last turn this process's
        await turn(a, f"turn {n}", f"m{n}")
    counts = []
    for n, hold in ((3, True), (4, False), (5, True), (6, False)):
        saver.holds_turns = hold
        taken[0] = 0
        assert (await turn(a, f"turn {n}", f"m{n}"))[-1] == Final(f"echo: turn {n}")
        counts.append(taken[0])
    # Held: the input, its writes and step 0 in one; the model's writes and step 1 in one.
    assert counts == [counts[0], counts[0] + 3] * 2, counts
    assert user_texts(fake.requests[-1]) == [f"turn {n}" for n in range(7)]


async def test_the_input_and_the_first_step_commit_together_or_not_at_all(
    fake: FakeOpenAI, daemon: Callable[..., Any], pg_url: str
) -> None:
    """Step 0's checkpoint is refused by the database (a trigger): the turn fails before the model
    is asked, and none of the three is stored, not the input either. Asked again, the message is
    answered once, and the thread holds it once."""
    a = await daemon()
    await turn(a, "warm", "m0", thread="other")  # the tables exist
    await _sql(
        pg_url,
        "CREATE FUNCTION refuse_step_0() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.thread_id = 't1' AND NEW.metadata->>'step' = '0' THEN"
        " RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$",
    )
    await _sql(
        pg_url,
        "CREATE TRIGGER refuse BEFORE INSERT ON checkpoints FOR EACH ROW EXECUTE FUNCTION refuse_step_0()",
    )
    asked = len(fake.requests)
    failed = await turn(a, "one", "m1")
    assert isinstance(failed[-1], TurnFailed) and "refused by the test" not in failed[-1].message
    assert len(fake.requests) == asked  # step 0 comes before the model call
    assert await _stored(pg_url, "t1") == (0, 0)
    await _sql(pg_url, "DROP TRIGGER refuse ON checkpoints")
    assert (await turn(a, "one", "m1"))[-1] == Final("echo: one")
    assert user_texts(fake.requests[-1]) == ["one"] and len(fake.requests) == asked + 1
    assert await a.message_count("t1") == 2


async def test_the_models_writes_and_their_steps_checkpoint_commit_together(
    fake: FakeOpenAI, daemon: Callable[..., Any], pg_url: str
) -> None:
    """Step 1's checkpoint (after the model's answer) is refused: the turn fails and the model's
    writes are not stored either, so the thread is as it was after step 0; asked again, the model
    answers again and the thread holds the exchange once."""
    a = await daemon()
    await turn(a, "warm", "m0", thread="other")
    await _sql(
        pg_url,
        "CREATE FUNCTION refuse_step_1() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        " IF NEW.thread_id = 't1' AND NEW.metadata->>'step' = '1' THEN"
        " RAISE EXCEPTION 'refused by the test'; END IF; RETURN NEW; END $$",
    )
    await _sql(
        pg_url,
        "CREATE TRIGGER refuse BEFORE INSERT ON checkpoints FOR EACH ROW EXECUTE FUNCTION refuse_step_1()",
    )
    failed = await turn(a, "one", "m1")
    assert isinstance(failed[-1], TurnFailed)
    assert await _stored(pg_url, "t1") == (2, 2)  # the input and step 0, the input's two writes
    await _sql(pg_url, "DROP TRIGGER refuse ON checkpoints")
    asked = len(fake.requests)
    assert (await turn(a, "one", "m1"))[-1] == Final("echo: one")
    assert len(fake.requests) == asked + 1
    assert await a.message_count("t1") == 2


async def test_a_turn_cancelled_between_its_input_and_first_step_stores_the_input_as_before(
    fake: FakeOpenAI, daemon: Callable[..., Any], pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn is cancelled while its input is held (its input's writes never come): leaving the
    turn stores the input checkpoint, as the library's own put would have before the cancel; the
    next turn of the thread answers, and no model call was made for the cancelled one."""
    a = await daemon()
    await turn(a, "one", "m1")
    saver: Any = a.require_graph().checkpointer
    held, _ = _stall_while_input_held(monkeypatch)
    before = await _stored(pg_url, "t1")
    asked = len(fake.requests)
    task = asyncio.create_task(turn(a, "two", "m2"))
    await asyncio.wait_for(held.wait(), 10)
    assert await _stored(pg_url, "t1") == before  # held: nothing sent yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _stored(pg_url, "t1") == (before[0] + 1, before[1])  # the input checkpoint alone
    assert not saver._held
    monkeypatch.undo()
    assert (await turn(a, "three", "m3"))[-1] == Final("echo: three")
    assert len(fake.requests) == asked + 1
    assert user_texts(fake.requests[-1]) == ["one", "three"]


async def test_a_reader_of_the_thread_meanwhile_sees_it_as_before_and_takes_nothing(
    fake: FakeOpenAI, daemon: Callable[..., Any], pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/status`` reads the thread while a turn's input is held: it sees the thread as before the
    turn (the input's message was only in its pending writes anyway) and sends nothing; the turn
    then stores its input with step 0, and the history stays whole (a hostile review: a reader
    that sent it, and failed, once cut the thread's history at that turn)."""
    a = await daemon()
    await turn(a, "one", "m1")
    saver: Any = a.require_graph().checkpointer
    held, go = _stall_while_input_held(monkeypatch)
    before = await _stored(pg_url, "t1")
    task = asyncio.create_task(turn(a, "two", "m2"))
    await asyncio.wait_for(held.wait(), 10)
    assert await a.message_count("t1") == 2
    assert await _stored(pg_url, "t1") == before and "t1" in saver._held
    go.set()
    assert (await task)[-1] == Final("echo: two")
    assert (await turn(a, "three", "m3"))[-1] == Final("echo: three")
    assert user_texts(fake.requests[-1]) == ["one", "two", "three"]


async def test_a_send_that_fails_keeps_the_input_held_for_its_turn(
    daemon: Callable[..., Any], pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes against another checkpoint send the held input first, alone; when that send fails,
    the input stays held, and the turn's next put sends it: a step never lands without the input
    checkpoint it follows."""
    a = await daemon()
    await turn(a, "one", "m1", thread="warm")
    saver: Any = a.require_graph().checkpointer
    config = {"configurable": {"thread_id": "t9", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    async with saver.scoped(None)("t9"):  # a turn of t9 runs: it holds
        await saver.aput(config, checkpoint, {"source": "input", "step": -1}, {})
        found = await saver.aget_tuple(config)
        assert found is None and await _stored(pg_url, "t9") == (0, 0)  # a reader sends nothing
        send = postgres_saver.KeptPostgresSaver._send
        failing = [1]

        async def fails_once(self: Any, *args: Any) -> None:
            if failing:
                failing.pop()
                raise psycopg.OperationalError("the connection dropped (the test)")
            await send(self, *args)

        monkeypatch.setattr(postgres_saver.KeptPostgresSaver, "_send", fails_once)
        stray = {"configurable": {"thread_id": "t9", "checkpoint_ns": "", "checkpoint_id": "other"}}
        with pytest.raises(psycopg.OperationalError):
            await saver.aput_writes(stray, [("messages", [])], "task-1")
        assert "t9" in saver._held and await _stored(pg_url, "t9") == (0, 0)
        step0 = empty_checkpoint()
        after = {"configurable": {"thread_id": "t9", "checkpoint_ns": "", "checkpoint_id": checkpoint["id"]}}
        await saver.aput(after, step0, {"source": "loop", "step": 0}, {})
        assert not saver._held and await _stored(pg_url, "t9") == (2, 0)
    found = await saver.aget_tuple(config)
    assert found is not None and found.checkpoint["id"] == step0["id"]
    assert found.parent_config["configurable"]["checkpoint_id"] == checkpoint["id"]


async def test_outside_a_turn_nothing_is_held(daemon: Callable[..., Any], pg_url: str) -> None:
    """Only a turn's scope sends what is left held, so only a turn holds: another writer of the
    saver (``chital migrate`` copying a thread, newest checkpoint first) or a turn of another
    thread stores at once (a third hostile review: migration lost each thread's oldest input and
    model writes)."""
    a = await daemon()
    saver: Any = a.require_graph().checkpointer
    for scope in (None, "another thread"):
        thread = f"t-{scope}"
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        async with contextlib.AsyncExitStack() as stack:
            if scope is not None:
                await stack.enter_async_context(saver.scoped(None)(scope))
            await saver.aput(config, checkpoint, {"source": "input", "step": -1}, {})
            written = {"configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}}
            await saver.aput_writes(written, [("messages", [])], "task-1", "~__pregel_pull, model")
            assert not saver._held and await _stored(pg_url, thread) == (1, 1)


async def test_an_input_its_ended_turn_could_not_store_is_dropped_not_kept(
    fake: FakeOpenAI, daemon: Callable[..., Any], pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn cancelled while its input is held, and the send on leaving fails (the database away
    a moment): nothing of that turn follows, so the input is dropped (as if never put), not kept
    to fail the thread's next turn or to stay in memory (a second hostile review)."""
    a = await daemon()
    await turn(a, "one", "m1")
    saver: Any = a.require_graph().checkpointer
    held, _ = _stall_while_input_held(monkeypatch)

    async def refused(self: Any, *args: Any) -> None:
        raise psycopg.OperationalError("the database is away (the test)")

    before = await _stored(pg_url, "t1")
    task = asyncio.create_task(turn(a, "two", "m2"))
    await asyncio.wait_for(held.wait(), 10)
    monkeypatch.setattr(postgres_saver.KeptPostgresSaver, "_send", refused)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not saver._held and await _stored(pg_url, "t1") == before
    monkeypatch.undo()  # writes and sends as they are
    assert (await turn(a, "three", "m3"))[-1] == Final("echo: three")
    assert user_texts(fake.requests[-1]) == ["one", "three"]


async def test_writes_recorded_after_their_turn_ended_are_written_not_held(
    daemon: Callable[..., Any], pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's writes are still being serialised (in a thread) when their turn's scope ends (a
    second cancel cut LangGraph's wait for them short): nothing would send a hold made now, so
    they are written at once, as before anything was held (a review found them left held in
    memory, or lost when appended to a hold already sent)."""
    a = await daemon()
    await turn(a, "one", "m1", thread="warm")
    saver: Any = a.require_graph().checkpointer
    thread, checkpoint = "t-late", empty_checkpoint()
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    saved = await saver.aput(config, checkpoint, {"source": "loop", "step": 1}, {})  # outside a turn
    started, go = asyncio.Event(), asyncio.Event()
    base = type(saver).__mro__[1]  # the library's saver, whose aput_writes the held path records
    library_writes = base.aput_writes

    async def slow_writes(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        if config["configurable"]["thread_id"] == thread:  # its values still being serialised
            started.set()
            await go.wait()
        await library_writes(self, config, *args, **kwargs)

    monkeypatch.setattr(base, "aput_writes", slow_writes)
    async with saver.scoped(None)(thread):
        task = asyncio.create_task(
            saver.aput_writes(saved, [("messages", [])], "task-m", "~__pregel_pull, model")
        )
        await asyncio.wait_for(started.wait(), 10)
    go.set()
    await task
    assert thread not in saver._held
    assert await _stored(pg_url, thread) == (1, 1)
