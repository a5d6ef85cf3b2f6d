"""agent/postgres_saver.py keeps recent threads' rebuilt history in memory on PostgreSQL, where
several daemons share a thread: a state read through the saver that keeps it must equal a read of
the same database by a saver that keeps nothing, whichever daemon ran the previous step (random
runs of the graph of tests/test_checkpoint_history.py, with steps run by a second daemon's saver,
restarts, failures, forks), and writes a dying daemon stored against the kept checkpoint must be
part of the next history."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.types import Command

from agent.history_cache import OLDER, KeptHistories
from agent.postgres import _pool
from agent.postgres_saver import KeptPostgresSaver
from tests.checkpoint_history_support import FAIL, Boom, State, Unsnapshotted
from tests.checkpoint_history_support import fan as _fan
from tests.checkpoint_history_support import full as _full
from tests.checkpoint_history_support import graph as _graph
from tests.checkpoint_history_support import shape as _shape

pytestmark = pytest.mark.usefixtures("pg_server")


class Daemons:
    """Savers on one database, each on a pool of its own (one per simulated daemon)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pools: list[Any] = []

    async def saver(self, history_cache: int = 4) -> KeptPostgresSaver:
        pool = await _pool(self.url, 2)
        self.pools.append(pool)
        saver = KeptPostgresSaver(pool, history_cache=history_cache)
        if len(self.pools) == 1:
            await saver.setup()
        return saver


@pytest.fixture
async def daemons(pg_url: str) -> AsyncIterator[Daemons]:
    made = Daemons(pg_url)
    yield made
    for pool in made.pools:
        await pool.close()


@pytest.mark.parametrize(("seed", "state"), [(1, State), (3, Unsnapshotted)])
async def test_reads_from_the_kept_history_equal_reads_from_the_database(
    daemons: Daemons, seed: int, state: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    hits: list[str] = []
    lookup = KeptHistories.lookup

    def counting(self: KeptHistories, thread: str, target: str, wanted: tuple[str, ...]) -> Any:
        found = lookup(self, thread, target, wanted)
        if found is not None and found is not OLDER:
            hits.append(thread)
        return found

    monkeypatch.setattr(KeptHistories, "lookup", counting)
    rng = random.Random(seed)
    random.seed(seed)
    a_saver, b_saver, plain_saver = await daemons.saver(), await daemons.saver(), await daemons.saver(0)
    a, b, plain = _graph(a_saver, state), _graph(b_saver, state), _graph(plain_saver, state)
    threads = [f"t{i}" for i in range(6)]  # more than the 4 kept, so some are evicted
    thread, served, moved = threads[0], 0, 0

    async def compare(graph: Any, config: dict[str, Any]) -> None:
        ours = await graph.aget_state(config)
        theirs = await plain.aget_state(config)
        assert _shape(ours.values.get("messages", [])) == _shape(theirs.values.get("messages", []))
        assert ours.values.get("fanout") == theirs.values.get("fanout")
        assert ours.next == theirs.next

    for step in range(140):
        thread = thread if rng.random() < 0.6 else rng.choice(threads)
        config: dict[str, Any] = {"configurable": {"thread_id": thread}}
        # Mostly daemon A; sometimes daemon B runs the step (the turn moved), then A again.
        runner = b if rng.random() < 0.25 else a
        moved += runner is b
        snap = await runner.aget_state(config)
        if snap.interrupts:
            await runner.ainvoke(Command(resume=rng.choice(["yes", "no"])), config)
        elif snap.next and rng.random() < 0.7:  # a step failed: retry it
            try:
                await runner.ainvoke(None, config)
            except Boom:
                pass
        else:
            actions = [
                "answer",
                "fan",
                "fanfail",
                "rewrite",
                "tool_then_ask",
                "fail",
                "mutate",
                "fork",
                "restart",
            ]
            action = rng.choice(actions)
            if action == "restart":  # daemon A restarts: nothing kept
                a_saver = await daemons.saver()
                a = _graph(a_saver, state)
                continue
            if action == "fork":
                history = [s async for s in runner.aget_state_history(config, limit=12)]
                if len(history) > 2:
                    old = rng.choice(history[1:])
                    await runner.aupdate_state(old.config, {"messages": [HumanMessage(f"fork {step}")]})
                continue
            message = HumanMessage(f"{thread} says {step}", id=f"h-{step}")
            try:
                await runner.ainvoke({"messages": [message], "plan": action}, config)
            except Boom:
                pass
        await compare(a, config)
        await compare(b, config)
        history = [s async for s in plain.aget_state_history(config, limit=12)]
        if len(history) > 3:
            await compare(a, rng.choice(history[1:]).config)
        served += 1
    assert served > 80 and moved > 20
    assert len(hits) > 100  # most reads were served from memory


async def test_writes_a_dying_daemon_stored_on_the_kept_checkpoint(daemons: Daemons) -> None:
    a_saver, b_saver, plain_saver = await daemons.saver(), await daemons.saver(), await daemons.saver(0)
    a, b, reference = _fan(a_saver), _fan(b_saver), _fan(plain_saver)
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    FAIL.update(w0=True, w1=True)
    with pytest.raises(RuntimeError):  # both workers fail; daemon A reads the paused step
        await a.ainvoke({"messages": [HumanMessage("go", id="h1")]}, config)
    assert (await a.aget_state(config)).next == ("worker", "worker")
    FAIL["w0"] = False
    with pytest.raises(RuntimeError):  # daemon B retries: w0's answer is stored, w1 fails again
        await b.ainvoke(None, config)
    FAIL["w1"] = False
    await a.ainvoke(None, config)  # daemon A retries: only w1 runs
    theirs = (await reference.aget_state(config)).values["messages"]
    assert [m.content for m in theirs] == ["go", "from w0", "from w1"]
    assert _full((await a.aget_state(config)).values["messages"]) == _full(theirs)
    assert "t" in a_saver.kept.known


async def test_reads_of_a_thread_during_its_runs_keep_what_the_database_has(daemons: Daemons) -> None:
    """The console or a choices check reading a thread while its turn runs (on this daemon): the
    kept history must still equal the database's afterwards. (The saver's guard against a write
    landing between a read's statements is reasoned, agent/postgres_saver.py ``_Activity``: this
    interleaving did not reach that window in the runs tried without it.)"""
    import asyncio

    kept_saver, plain_saver = await daemons.saver(), await daemons.saver(0)
    kept, plain = _graph(kept_saver, Unsnapshotted), _graph(plain_saver, Unsnapshotted)
    config: dict[str, Any] = {"configurable": {"thread_id": "busy"}}
    running = True

    async def reader() -> None:
        while running:
            await kept.aget_state(config)
            await asyncio.sleep(0)

    readers = [asyncio.create_task(reader()) for _ in range(3)]
    try:
        for i in range(25):
            plan = ("answer", "fan", "rewrite")[i % 3]
            await kept.ainvoke({"messages": [HumanMessage(f"m{i}", id=f"m{i}")], "plan": plan}, config)
            ours = (await kept.aget_state(config)).values["messages"]
            theirs = (await plain.aget_state(config)).values["messages"]
            assert _shape(ours) == _shape(theirs), i
    finally:
        running = False
        await asyncio.gather(*readers)
