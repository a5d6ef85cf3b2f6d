"""agent/checkpoints.py keeps recent threads' rebuilt history in memory: whatever a graph does, a
state read through the saver that keeps it must equal a read of the same database by a saver that
keeps nothing. Random runs of a real LangGraph graph (parallel writers, rewrites and removals by
id, interrupts and resumes, failures, forks from old checkpoints, snapshots) are compared after
every step, at the latest checkpoint and at older ones."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.types import Command

from agent.checkpoints import InlineSqliteSaver
from tests.checkpoint_history_support import Boom, State, Unsnapshotted
from tests.checkpoint_history_support import graph as _graph
from tests.checkpoint_history_support import shape as _shape


@pytest.fixture
def savers(tmp_path: Path) -> Iterator[list[InlineSqliteSaver]]:
    db = tmp_path / "checkpoints.sqlite"
    opened = [InlineSqliteSaver.open(db, history_cache=4), InlineSqliteSaver.open(db, history_cache=0)]
    yield opened
    for saver in opened:
        saver.close()


@pytest.mark.parametrize(("seed", "state"), [(1, State), (2, State), (3, Unsnapshotted), (4, Unsnapshotted)])
def test_reads_from_the_kept_history_equal_reads_from_the_database(
    savers: list[InlineSqliteSaver], tmp_path: Path, seed: int, state: type[Any]
) -> None:
    kept_saver, plain_saver = savers
    rng = random.Random(seed)
    random.seed(seed)
    kept, plain = _graph(kept_saver, state), _graph(plain_saver, state)
    threads = [f"t{i}" for i in range(6)]  # more than the 4 kept, so some are evicted
    served = 0
    thread = threads[0]

    def compare(config: dict[str, Any]) -> None:
        nonlocal served
        ours = kept.get_state(config)
        theirs = plain.get_state(config)
        assert _shape(ours.values.get("messages", [])) == _shape(theirs.values.get("messages", []))
        assert ours.values.get("fanout") == theirs.values.get("fanout")
        assert ours.next == theirs.next

    for step in range(260):
        # Mostly the same thread again (extending what is kept), sometimes another (evicting).
        thread = thread if rng.random() < 0.6 else rng.choice(threads)
        config: dict[str, Any] = {"configurable": {"thread_id": thread}}
        snap = kept.get_state(config)
        if snap.interrupts:
            kept.invoke(Command(resume=rng.choice(["yes", "no"])), config)
        elif snap.next and rng.random() < 0.7:  # a step failed: retry it
            try:
                kept.invoke(None, config)
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
            if action == "restart":  # a new process: nothing kept, the next reads come from the file
                kept_saver = InlineSqliteSaver.open(tmp_path / "checkpoints.sqlite", history_cache=4)
                savers.append(kept_saver)
                kept = _graph(kept_saver, state)
                continue
            if action == "fork":
                history = list(kept.get_state_history(config, limit=12))
                if len(history) > 2:
                    old = rng.choice(history[1:])
                    kept.update_state(old.config, {"messages": [HumanMessage(f"fork {step}")]})
                continue
            message = HumanMessage(f"{thread} says {step}", id=f"h-{step}")
            try:
                kept.invoke({"messages": [message], "plan": action}, config)
            except Boom:
                pass
        compare(config)
        # An older checkpoint of the thread too: served from the database, never from memory.
        history = list(plain.get_state_history(config, limit=12))
        if len(history) > 3:
            compare(rng.choice(history[1:]).config)
        served += 1
    assert served > 150


def test_a_thread_read_again_is_served_from_memory_and_survives_a_snapshot(tmp_path: Path) -> None:
    saver = InlineSqliteSaver.open(tmp_path / "c.sqlite")
    walked: list[str] = []
    walk = InlineSqliteSaver.__mro__[1].get_delta_channel_history

    def counting(self: InlineSqliteSaver, **kwargs: Any) -> Any:
        walked.append(kwargs["config"]["configurable"]["checkpoint_id"])
        return walk(self, **kwargs)

    try:
        InlineSqliteSaver.__mro__[1].get_delta_channel_history = counting  # type: ignore[method-assign]
        graph = _graph(saver)
        config = {"configurable": {"thread_id": "one"}}
        for i in range(30):  # snapshots every 7 updates of the channel
            graph.invoke({"messages": [HumanMessage(f"m{i}", id=f"m{i}")], "plan": "answer"}, config)
        messages = graph.get_state(config).values["messages"]
    finally:
        InlineSqliteSaver.__mro__[1].get_delta_channel_history = walk  # type: ignore[method-assign]
        saver.close()
    assert [m.content for m in messages if isinstance(m, HumanMessage)] == [f"m{i}" for i in range(30)]
    # 30 runs read the thread: the database is walked only after a snapshot was put, not per run.
    assert 0 < len(walked) < 12, walked


def test_a_write_put_twice_keeps_the_first_as_the_database_does(savers: list[InlineSqliteSaver]) -> None:
    kept_saver, plain_saver = savers
    kept = _graph(kept_saver, Unsnapshotted)
    config: dict[str, Any] = {"configurable": {"thread_id": "twice"}}
    kept.invoke({"messages": [HumanMessage("hi", id="h1")], "plan": "answer"}, config)
    latest = kept.get_state(config).config  # read: the thread's history is kept from here
    kept_saver.put_writes(latest, [("messages", [AIMessage("first", id="w1")])], "task-x")
    kept_saver.put_writes(latest, [("messages", [AIMessage("second", id="w2")])], "task-x")  # ignored
    child = {**empty_checkpoint(), "id": str(uuid6())}
    target = kept_saver.put(latest, child, {"source": "loop", "step": 9}, {})

    def writes(saver: InlineSqliteSaver) -> list[tuple[str, list[str]]]:
        history = saver.get_delta_channel_history(config=target, channels=["messages"])["messages"]
        return [(task, [m.content for m in value]) for task, _, value in history["writes"]]

    assert writes(kept_saver) == writes(plain_saver)
    assert ("task-x", ["first"]) in writes(kept_saver)
    assert ("task-x", ["second"]) not in writes(kept_saver)


def test_a_history_unread_for_long_is_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.history_cache as checkpoints

    saver = InlineSqliteSaver.open(tmp_path / "c.sqlite")
    graph = _graph(saver, Unsnapshotted)
    try:
        for thread in ("quiet", "busy"):
            config: dict[str, Any] = {"configurable": {"thread_id": thread}}
            for i in range(2):
                graph.invoke(
                    {"messages": [HumanMessage(f"m{i}", id=f"{thread}{i}")], "plan": "answer"}, config
                )
        assert set(saver._known) == {"quiet", "busy"}
        later = checkpoints.time.monotonic() + checkpoints.HISTORY_IDLE + 1
        monkeypatch.setattr(checkpoints.time, "monotonic", lambda: later)
        graph.invoke(
            {"messages": [HumanMessage("again", id="busy9")], "plan": "answer"},
            {"configurable": {"thread_id": "busy"}},
        )
        assert set(saver._known) == {"busy"}
    finally:
        saver.close()


def test_a_write_to_a_checkpoint_already_folded_in_is_read_from_the_database(
    savers: list[InlineSqliteSaver],
) -> None:
    kept_saver, plain_saver = savers
    kept = _graph(kept_saver, Unsnapshotted)
    config: dict[str, Any] = {"configurable": {"thread_id": "late"}}
    kept.invoke({"messages": [HumanMessage("hi", id="h1")], "plan": "answer"}, config)
    base = kept.get_state(config).config  # kept from here
    child = kept_saver.put(
        base, {**empty_checkpoint(), "id": str(uuid6())}, {"source": "loop", "step": 9}, {}
    )
    kept_saver.get_delta_channel_history(config=child, channels=["messages"])  # folds base in
    kept_saver.put_writes(base, [("messages", [AIMessage("late", id="late1")])], "task-late")

    def writes(saver: InlineSqliteSaver) -> list[list[str]]:
        history = saver.get_delta_channel_history(config=child, channels=["messages"])["messages"]
        return [[m.content for m in value] for _, _, value in history["writes"]]

    assert writes(kept_saver) == writes(plain_saver)
    assert ["late"] in writes(kept_saver)
