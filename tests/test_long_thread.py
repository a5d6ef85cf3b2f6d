"""A long conversation costs what a short one does (issue 27, agent/compaction.py): after many turns
the thread's state holds a summary and the recent turns, its stored checkpoints are few, what a
fresh process reads back is exactly what was there, and a turn killed mid-way on such a thread
resumes exactly. On SQLite, then on PostgreSQL (skipped where no server can run). The costs
themselves are measured by ``bench/harness_turns.py --long``, not here."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from langchain.agents.middleware.summarization import DEFAULT_SUMMARY_PROMPT
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langchain_core.tools import tool

from agent.compaction import (
    MAX_SUPERSTEPS_SINCE_SNAPSHOT,
    PRUNE_EVERY,
    bounded_history,
    drop_summarised,
    kept_chain,
)
from agent.events import AgentEvent, Final, ToolProgress
from agent.harness import Harness
from tests.daemon import REPO, env_without
from tests.fakes.openai_server import SUMMARY_MARKER, FakeOpenAI, Reply, ToolCall
from tests.long_thread_support import CONTEXT, build

SUMMARY = "SUMMARY: the user said hello many times."
EVENT = "_summarization_event"


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str | None]:
    """(SQLite file, PostgreSQL URL or None): the checkpoints on SQLite, then on PostgreSQL."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    return tmp_path / "cp.sqlite", url


@pytest.fixture
def summarising(fake: FakeOpenAI) -> FakeOpenAI:
    fake.add_rule(lambda t: SUMMARY_MARKER in t, Reply(text=SUMMARY))
    return fake


async def turn(harness: Harness, text: str, message_id: str) -> list[AgentEvent]:
    async with aclosing(harness.run("t1", user_id="u1", message_id=message_id, text=text)) as run:
        return [event async for event in run]


async def values(harness: Harness) -> dict[str, Any]:
    snap = await harness.require_graph().aget_state({"configurable": {"thread_id": "t1"}})
    return dict(snap.values)


async def stored_checkpoints(db: Path, url: str | None) -> int:
    if url is None:
        conn = sqlite3.connect(db)
        try:
            return int(conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = 't1'").fetchone()[0])
        finally:
            conn.close()
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = 't1'")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


def user_texts(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


def test_the_fakes_summary_marker_is_the_summary_prompts() -> None:
    assert SUMMARY_MARKER in DEFAULT_SUMMARY_PROMPT


def test_langgraph_snapshots_delta_channels_as_often_as_pruning_assumes() -> None:
    # agent/__init__.py sets it before LangGraph is imported (LangGraph reads it once then).
    assert os.environ["LANGGRAPH_DELTA_MAX_SUPERSTEPS_SINCE_SNAPSHOT"] == str(MAX_SUPERSTEPS_SINCE_SNAPSHOT)


# ---- the pure parts -----------------------------------------------------------------------------
def test_drop_summarised_removes_what_the_summary_covers_and_moves_the_cut() -> None:
    state = [
        HumanMessage("a", id="h1"),
        AIMessage("b", id="a1"),
        HumanMessage("c", id="h2"),
        AIMessage("d", id="a2"),
        HumanMessage("e", id="h3"),
    ]
    event = {"cutoff_index": 3, "summary_message": HumanMessage("S"), "created_at_index": 5}
    update = drop_summarised({EVENT: event, "messages": [AIMessage("x", id="tail")]}, state)
    assert [(type(m), m.id) for m in update["messages"]] == [
        (RemoveMessage, "h1"),
        (RemoveMessage, "a1"),
        (RemoveMessage, "h2"),
        (AIMessage, "tail"),
    ]
    assert update[EVENT]["cutoff_index"] == 0 and update[EVENT]["created_at_index"] == 2
    # Never the running turn's start: a cut past it stops there.
    late = drop_summarised({EVENT: dict(event, cutoff_index=5)}, state)
    assert [m.id for m in late["messages"]] == ["h1", "a1", "h2", "a2"]
    assert late[EVENT]["cutoff_index"] == 1
    # A message without an id cannot be removed: the cut stops before it.
    state[1] = AIMessage("b")
    assert [m.id for m in drop_summarised({EVENT: event}, state)["messages"]] == ["h1"]
    assert drop_summarised({"messages": []}, state) == {"messages": []}  # no summary, no change
    state[1] = AIMessage("b", id="a1")
    # Nor past a message the update rewrites, or where the request's messages differ from the state.
    rewrites = drop_summarised({EVENT: event, "messages": [AIMessage("B", id="a1")]}, state)
    assert [(type(m), m.id) for m in rewrites["messages"]] == [(RemoveMessage, "h1"), (AIMessage, "a1")]
    seen = [state[0], state[1], HumanMessage("other", id="x")]
    assert [m.id for m in drop_summarised({EVENT: event}, state, seen)["messages"]] == ["h1", "a1"]


def test_kept_chain_follows_the_latest_back_to_the_farthest_snapshot() -> None:
    parents: dict[str, str | None] = {"c1": None, "c2": "c1", "c3": "c2", "c4": "c3", "c5": "c4"}
    counters = {"messages": [3, 2], "files": [1, 3]}
    assert kept_chain("c5", parents, counters, ["messages"]) == {"c5", "c4", "c3"}
    assert kept_chain("c5", parents, counters, ["messages", "files"]) == {"c5", "c4", "c3", "c2"}
    assert kept_chain("c5", parents, {}, ["messages"]) == {"c5"}  # snapshotted in the latest
    assert kept_chain("c5", parents, {"messages": [1, 9]}, ["messages"]) == set(parents)  # to the root
    del parents["c2"]
    assert kept_chain("c5", parents, counters, ["files"]) is None  # a missing ancestor: prune nothing
    assert kept_chain("c5", parents, {"messages": "bad"}, ["messages"]) is None


def test_the_history_file_keeps_its_newest_whole_sections() -> None:
    sections = [f"## Summarized at {i}\n\n" + "x" * 100 + "\n\n" for i in range(10)]
    text = "".join(sections)
    kept = bounded_history(text, 370)  # three sections of 122 characters
    assert kept == "".join(sections[-3:]) and len(kept) <= 370
    assert bounded_history(text, 10) == sections[-1]  # the newest section whole, even when longer
    assert bounded_history(text, 10_000) == text


# ---- a long thread ------------------------------------------------------------------------------
async def test_a_long_thread_holds_a_summary_and_recent_turns_in_few_checkpoints(
    summarising: FakeOpenAI, where: tuple[Path, str | None]
) -> None:
    db, url = where
    turns = 150  # 450 checkpoints without pruning
    harness = build(summarising.base_url, db, url)
    await harness.start()
    try:
        for i in range(1, turns + 1):
            events = await turn(harness, f"hello {i}", f"m{i}")
            assert events[-1] == Final(f"echo: hello {i}")
        state = await values(harness)
        messages = state["messages"]
        # The summary plus the turns since the last one (the trigger counts what the model sees).
        assert len(messages) <= CONTEXT.summarize_after_messages + 2  # type: ignore[operator]
        assert messages[-2].text == f"hello {turns}" and messages[-1].text == f"echo: hello {turns}"
        assert SUMMARY in state[EVENT]["summary_message"].text
        assert state[EVENT]["cutoff_index"] == 0  # everything before the kept turns is dropped
        last = [r for r in summarising.requests if SUMMARY_MARKER not in str(r["messages"])][-1]
        texts = user_texts(last)
        assert SUMMARY in texts[0] and texts[-1] == f"hello {turns}"
        assert "hello 1" not in texts and len(texts) < 12
        # The checkpoints stored for the thread stay bounded: the latest's chain back to the
        # snapshots it is rebuilt from, plus three a turn for the (at most 10) turns since the last
        # prune; 450 without pruning.
        assert PRUNE_EVERY <= 10
        assert await stored_checkpoints(db, url) <= MAX_SUPERSTEPS_SINCE_SNAPSHOT + 3 * 10 + 1
        await harness.prune("t1")
        before = await values(harness)
    finally:
        await harness.close()
    # A fresh process reads back exactly what was there (no history in memory: the database walk).
    again = build(summarising.base_url, db, url)
    await again.start()
    try:
        after = await values(again)
        assert [(type(m), m.id, m.content) for m in after["messages"]] == [
            (type(m), m.id, m.content) for m in before["messages"]
        ]
        assert after[EVENT] == before[EVENT] and after.get("files") == before.get("files")
        events = await turn(again, "one more", "m-last")
        assert events[-1] == Final("echo: one more")
    finally:
        await again.close()


CHILD = """
import asyncio, pathlib, sys
sys.path.insert(0, ".")
from langchain_core.tools import tool
from tests.long_thread_support import build

base_url, db, url, marker = sys.argv[1:5]

@tool
async def long_job() -> str:
    '''Runs for a long time.'''
    pathlib.Path(marker).touch()
    await asyncio.sleep(3600)
    return "never"

async def main() -> None:
    harness = build(base_url, pathlib.Path(db), url or None, [long_job])
    await harness.start()
    async for _ in harness.run("t1", user_id="u1", message_id="job", text="run the job"):
        pass

asyncio.run(main())
"""


def job(body: dict[str, Any]) -> Reply:
    """The model's side of "run the job": call the tool, then answer from its result."""
    if body["messages"][-1]["role"] == "tool":
        return Reply(text="job finished")
    return Reply(tool_calls=[ToolCall("long_job", {})])


async def kill_mid_tool(fake: FakeOpenAI, db: Path, url: str | None) -> None:
    """Turn "job" in a child process, SIGKILLed while its tool runs."""
    marker = db.with_suffix(".started")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, fake.base_url, str(db), url or "", str(marker), cwd=REPO,
        env=env_without(PYTHONPATH=str(REPO)),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.returncode is None, "the child ended before the crash point"
            assert time.monotonic() < deadline, "the child never reached the crash point"
            await asyncio.sleep(0.02)
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGKILL)
        await child.wait()


async def test_a_turn_killed_mid_tool_on_a_compacted_thread_resumes_exactly(
    summarising: FakeOpenAI, where: tuple[Path, str | None]
) -> None:
    db, url = where
    harness = build(summarising.base_url, db, url)
    await harness.start()
    try:
        for i in range(1, 61):
            await turn(harness, f"hello {i}", f"m{i}")
        assert (await values(harness))[EVENT] is not None  # summarised, compacted and pruned
    finally:
        await harness.close()
    summarising.add_rule(lambda t: t == "run the job", job)
    await kill_mid_tool(summarising, db, url)
    asked = len(summarising.requests)

    @tool
    def long_job() -> str:
        """Runs for a long time."""
        return "job done"

    again = build(summarising.base_url, db, url, [long_job])
    await again.start()
    try:
        events = await turn(again, "run the job", "job")
        assert events[-1] == Final("job finished")
        assert [(e.name, e.phase) for e in events if isinstance(e, ToolProgress)] == [("long_job", "end")]
        answers = [r for r in summarising.requests[asked:] if SUMMARY_MARKER not in str(r["messages"])]
        assert len(answers) == 1  # the tool call was not asked for again
        texts = user_texts(answers[0])
        assert texts.count("run the job") == 1 and SUMMARY in texts[0]  # not appended twice
        assert answers[0]["messages"][-1]["content"] == "job done"
        # The same message again: the answer is replayed, the model not asked.
        replay = await turn(again, "run the job", "job")
        assert replay[-1] == Final("job finished") and len(summarising.requests) == asked + len(answers)
    finally:
        await again.close()
