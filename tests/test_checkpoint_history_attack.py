"""Attacks on agent/checkpoints.py's kept message history: every read through the saver that keeps
it must equal a read of the same SQLite file by a saver that keeps nothing (``history_cache=0``),
and nothing done to the messages handed out may change later reads.

The real agent flows (tools, approvals, a failed model call retried, /stop mid-tool, images that
fade, two threads at once, a restart) run through the Harness against the fake OpenAI server. A
toy graph pins what the review found and agent/checkpoints.py now handles: a ``put_writes`` batch
that fails halfway (it is one transaction now), a node that changes a handed-out message in place
(nested lists and dicts are the copy's own), writes another process stores against the kept
checkpoint (``PRAGMA data_version``). One finding was not the cache's: after a model step whose
checkpoint could not be stored (a full disk), the thread answered HTTP 400 forever; the harness
now finishes that step instead of answering its tool call beside it."""

from __future__ import annotations

import asyncio
import base64
import operator
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from deepagents._messages_reducer import _messages_delta_reducer
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph

from agent.approvals import with_approvals
from agent.checkpoints import InlineSqliteSaver
from agent.config import AgentSettings, ModelSpec
from agent.events import AgentEvent, ApprovalDecision, ApprovalRequested, Final, TurnFailed
from agent.harness import Harness
from agent.settings import ApprovalSettings
from agent.turn import ImagePart, TurnOptions
from tests.checkpoint_history_support import FAIL
from tests.checkpoint_history_support import fan as _fan
from tests.checkpoint_history_support import full as _full
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

API_KEY = "sk-test-secret-0123456789"
FAST = AgentSettings(retry_backoff=0.001, model_retries=1, model_timeout=5)


# ---- a toy graph for the pinned divergences ---------------------------------------------------
class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer, snapshot_frequency=10_000)]
    plan: str
    fanout: Annotated[list[str], operator.add]


def _answer(state: Any) -> dict[str, Any]:
    n = len(state.get("messages", []))
    call = {"name": "shell", "args": {"cmd": "ls"}, "id": f"call-{n}"}
    # Two channels in one task: put_writes stores them as one batch of rows.
    return {"messages": [AIMessage(f"answer {n}", id=f"ai-{n}", tool_calls=[call])], "fanout": [f"f{n}"]}


def _mutate_nested(state: Any) -> dict[str, Any]:
    """Changes, in place, what the messages it was handed hold (not a field reassignment): a
    content part appended, a tool call's arguments edited, a kwarg added. Writes nothing back."""
    for message in state.get("messages", []):
        if isinstance(message.content, list):
            message.content.append({"type": "text", "text": "INJECTED"})
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                call["args"]["cmd"] = "rm -rf /"
        message.additional_kwargs["seen"] = True
    return {}


def _toy(saver: InlineSqliteSaver) -> Any:
    builder = StateGraph(State)
    builder.add_node("answer", _answer)
    builder.add_node("mutate", _mutate_nested)
    builder.add_conditional_edges(START, lambda s: s.get("plan") or "answer", ["answer", "mutate"])
    builder.add_edge("answer", END)
    builder.add_edge("mutate", END)
    return builder.compile(checkpointer=saver)


def _fill_disk(conn: Any, table: str, when: str) -> None:
    """From now on, an insert into ``table`` for which ``when`` holds fails as on a full disk (a
    real SQLite error raised by a trigger), until :func:`_free_disk`."""
    conn.execute("CREATE TABLE fault (armed INTEGER)")
    conn.execute("INSERT INTO fault VALUES (1)")
    conn.execute(
        f"CREATE TRIGGER disk_full BEFORE INSERT ON {table} WHEN ({when}) AND (SELECT armed FROM fault) = 1"
        " BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )


def _free_disk(conn: Any) -> None:
    conn.execute("UPDATE fault SET armed = 0")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[InlineSqliteSaver, InlineSqliteSaver]]:
    db = tmp_path / "c.sqlite"
    kept, plain = InlineSqliteSaver.open(db), InlineSqliteSaver.open(db, history_cache=0)
    yield kept, plain
    kept.close()
    plain.close()


def test_a_write_batch_that_fails_halfway_is_kept_as_the_database_has_it(
    pair: tuple[InlineSqliteSaver, InlineSqliteSaver],
) -> None:
    kept_saver, plain_saver = pair
    kept, plain = _toy(kept_saver), _toy(plain_saver)
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    kept.invoke({"messages": [HumanMessage("hi", id="h1")]}, config)
    kept.get_state(config)  # the thread's history is kept from here
    # The disk fills up while the step's second row (``fanout``) is written: a real SQLite error
    # from a trigger, the first row (``messages``) is already committed.
    db = kept_saver.conn
    _fill_disk(db, "writes", "NEW.channel = 'fanout'")
    with pytest.raises(Exception, match="disk is full"):
        kept.invoke({"messages": [HumanMessage("second", id="h2")]}, config)
    _free_disk(db)  # space freed; the turn is retried
    kept.invoke(None, config)
    kept.invoke({"messages": [HumanMessage("third", id="h3")]}, config)
    ours, theirs = kept.get_state(config), plain.get_state(config)
    # The database has the retried step's answer; the third turn's node counted its messages
    # from the kept history (4 without it, 5 with it).
    assert [m.content for m in theirs.values["messages"]][:5] == [
        "hi",
        "answer 1",
        "second",
        "answer 3",
        "third",
    ]
    assert _full(ours.values["messages"]) == _full(theirs.values["messages"])


def test_messages_changed_in_place_by_a_node_do_not_change_later_reads(
    pair: tuple[InlineSqliteSaver, InlineSqliteSaver],
) -> None:
    kept_saver, plain_saver = pair
    kept, plain = _toy(kept_saver), _toy(plain_saver)
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    kept.invoke({"messages": [HumanMessage([{"type": "text", "text": "hi"}], id="h1")]}, config)
    kept.invoke({"messages": [HumanMessage("look", id="h2")], "plan": "mutate"}, config)
    ours = kept.get_state(config).values["messages"]
    theirs = plain.get_state(config).values["messages"]
    assert theirs[1].tool_calls[0]["args"] == {"cmd": "ls"}
    assert _full(ours) == _full(theirs)


def test_writes_another_process_stored_on_the_kept_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "c.sqlite"
    first, second, plain = (
        InlineSqliteSaver.open(db),
        InlineSqliteSaver.open(db),
        InlineSqliteSaver.open(db, history_cache=0),
    )
    try:
        a, b, reference = _fan(first), _fan(second), _fan(plain)
        config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
        FAIL.update(w0=True, w1=True)
        with pytest.raises(RuntimeError):  # both workers fail; process A reads the paused step
            a.invoke({"messages": [HumanMessage("go", id="h1")]}, config)
        assert a.get_state(config).next == ("worker", "worker")
        FAIL["w0"] = False
        with pytest.raises(RuntimeError):  # process B retries: w0's answer is stored, w1 fails again
            b.invoke(None, config)
        FAIL["w1"] = False
        a.invoke(None, config)  # process A retries: only w1 runs
        theirs = reference.get_state(config).values["messages"]
        assert [m.content for m in theirs] == ["go", "from w0", "from w1"]
        assert _full(a.get_state(config).values["messages"]) == _full(theirs)
    finally:
        for saver in (first, second, plain):
            saver.close()


def test_a_write_batch_that_fails_whole_changes_nothing(
    pair: tuple[InlineSqliteSaver, InlineSqliteSaver],
) -> None:
    """The same failure on the batch's first row: nothing stored, nothing kept; the retry matches."""
    kept_saver, plain_saver = pair
    kept, plain = _toy(kept_saver), _toy(plain_saver)
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    kept.invoke({"messages": [HumanMessage("hi", id="h1")]}, config)
    kept.get_state(config)
    db = kept_saver.conn
    _fill_disk(db, "writes", "NEW.channel = 'messages' AND instr(NEW.value, CAST('answer' AS BLOB)) > 0")
    with pytest.raises(Exception, match="disk is full"):
        kept.invoke({"messages": [HumanMessage("second", id="h2")]}, config)
    _free_disk(db)
    kept.invoke(None, config)
    kept.invoke({"messages": [HumanMessage("third", id="h3")]}, config)
    ours, theirs = kept.get_state(config), plain.get_state(config)
    assert [m.content for m in theirs.values["messages"]][-2:] == ["third", "answer 5"]
    assert _full(ours.values["messages"]) == _full(theirs.values["messages"])


# ---- the real agent -----------------------------------------------------------------------------
RAN: list[str] = []
RELEASE = asyncio.Event()


@tool
def shell(command: str) -> str:
    """Run a shell command."""
    RAN.append(command)
    return f"output of {command}"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def deploy(target: str) -> str:
    """Deploy something (slowly)."""
    RAN.append(f"deploy {target}")
    await RELEASE.wait()
    return "deployed"


class Checker:
    """Reads each thread through the harness's saver and through a saver that keeps nothing."""

    def __init__(self, harness: Harness, db: Path) -> None:
        self.harness = harness
        self.plain_saver = InlineSqliteSaver.open(db, history_cache=0)
        self.compared = 0

    async def same(self, thread: str) -> list[dict[str, Any]]:
        graph = self.harness._graph
        assert graph is not None
        plain = graph.copy(update={"checkpointer": self.plain_saver})
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        ours, theirs = await graph.aget_state(config), await plain.aget_state(config)
        assert thread in self.harness._saver._known  # the read went through the kept history
        assert _full(ours.values.get("messages", [])) == _full(theirs.values.get("messages", []))
        assert ours.next == theirs.next
        assert [i.id for i in ours.interrupts] == [i.id for i in theirs.interrupts]
        # Older checkpoints of the thread too, through both.
        async for old in plain.aget_state_history(config, limit=6):
            mine = await graph.aget_state(old.config)
            assert _full(mine.values.get("messages", [])) == _full(old.values.get("messages", []))
        self.compared += 1
        assert await self.harness.message_count(thread) == len(theirs.values.get("messages", []))
        return _full(theirs.values.get("messages", []))


async def collect(events: AsyncIterator[AgentEvent]) -> list[AgentEvent]:
    async with aclosing(events) as run:  # type: ignore[type-var]
        return [event async for event in run]


def _harness(fake: FakeOpenAI, db: Path) -> Harness:
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key=API_KEY, vision=True)
    middleware = with_approvals([], ApprovalSettings(tools=["shell"]), ["shell", "add", "deploy"])
    return Harness(FAST, spec, db, extra_tools=[shell, add, deploy], extra_middleware=middleware)


async def test_real_turns_read_the_same_through_the_kept_history(fake: FakeOpenAI, tmp_path: Path) -> None:
    """Tools, an approval granted and one refused, a model failure and its retry, /stop during a
    tool, images until they fade, turns of two threads at once, and a restart of the harness."""
    RAN.clear()
    RELEASE.clear()
    db = tmp_path / "cp.sqlite"
    harness = _harness(fake, db)
    await harness.start()
    check = Checker(harness, db)

    def run(thread: str, mid: str, text: str, **kw: Any) -> AsyncIterator[AgentEvent]:
        return harness.run(thread, user_id="u1", message_id=mid, text=text, **kw)

    try:
        # A tool round trip.
        fake.script(Reply(tool_calls=[ToolCall("add", {"a": 2, "b": 3})]), Reply(text="5"))
        assert (await collect(run("a", "a1", "2+3?")))[-1] == Final("5")
        await check.same("a")
        # An approval: paused, read while paused, then granted.
        fake.script(Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]), Reply(text="listed"))
        asks = [e for e in await collect(run("a", "a2", "list")) if isinstance(e, ApprovalRequested)]
        assert len(asks) == 1
        await check.same("a")
        done = await collect(
            harness.resume(
                "a", user_id="u1", message_id="a2", approval_id=asks[0].id, decision=ApprovalDecision(True)
            )
        )
        assert done[-1] == Final("listed") and RAN == ["ls"]
        await check.same("a")
        # Two gated calls in one step, one refused.
        fake.script(
            Reply(tool_calls=[ToolCall("shell", {"command": "rm x"}), ToolCall("add", {"a": 1, "b": 1})]),
            Reply(text="did what I could"),
        )
        asks = [e for e in await collect(run("a", "a3", "clean")) if isinstance(e, ApprovalRequested)]
        await check.same("a")
        done = await collect(
            harness.resume(
                "a", user_id="u1", message_id="a3", approval_id=asks[0].id, decision=ApprovalDecision(False)
            )
        )
        assert done[-1] == Final("did what I could") and "rm x" not in RAN
        await check.same("a")
        # The model fails (retries spent), the gateway retries the same message.
        fake.script(*[Reply(status=500)] * 2)
        assert isinstance((await collect(run("a", "a4", "hello?")))[-1], TurnFailed)
        await check.same("a")
        assert (await collect(run("a", "a4", "hello?")))[-1] == Final("echo: hello?")
        await check.same("a")
        # An image, shown for keep_turns user messages, then faded (same id, new content).
        png = ImagePart("image/png", base64.b64decode(b"iVBORw0KGgo="), name="p.png", path="/uploads/p.png")
        await collect(run("b", "b1", "see this", options=TurnOptions(images=(png,))))
        await check.same("b")
        for i in range(2, 2 + FAST.vision.keep_turns + 1):
            await collect(run("b", f"b{i}", f"and now {i}"))
            await check.same("b")
        history = await check.same("b")
        assert isinstance(history[0]["content"], str) and "no longer attached" in history[0]["content"]
        # /stop during a tool on thread b while thread a takes turns.
        fake.script(Reply(tool_calls=[ToolCall("deploy", {"target": "prod"}, id="call_d")]))
        stopped = asyncio.create_task(collect(run("b", "b9", "deploy")))
        while "deploy prod" not in RAN:
            await asyncio.sleep(0.01)
        await check.same("b")  # read while the tool runs
        await collect(run("a", "a5", "meanwhile"))
        stopped.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopped
        await check.same("b")
        assert (await collect(run("b", "b10", "status?")))[-1] == Final("echo: status?")
        await check.same("b")
        # Turns of two threads interleaving on the loop, and state reads between them.
        for i in range(4):
            await asyncio.gather(
                collect(run("a", f"ca{i}", f"a says {i}")),
                collect(run("b", f"cb{i}", f"b says {i}")),
                check.same("a"),
            )
            await check.same("a")
            await check.same("b")
        # A restart: nothing kept, the file is read; then more turns extend what is kept again.
        await harness.close()
        harness = _harness(fake, db)
        await harness.start()
        check.harness = harness
        await check.same("a")
        await collect(run("a", "a99", "after restart"))
        assert (await check.same("a"))[-1]["content"] == "echo: after restart"
        assert check.compared > 20
    finally:
        RELEASE.set()
        await harness.close()
        check.plain_saver.close()


async def test_a_long_thread_past_several_snapshots_reads_the_same(fake: FakeOpenAI, tmp_path: Path) -> None:
    """More than 50 updates of the channel (a snapshot is put, the kept history is dropped and read
    again), with a tool step now and then."""
    db = tmp_path / "cp.sqlite"
    harness = _harness(fake, db)
    await harness.start()
    check = Checker(harness, db)
    try:
        for i in range(40):
            if i % 7 == 3:
                fake.script(Reply(tool_calls=[ToolCall("add", {"a": i, "b": 1})]), Reply(text=f"sum {i}"))
            await collect(harness.run("long", user_id="u1", message_id=f"l{i}", text=f"turn {i}"))
            if i % 5 == 4:
                await check.same("long")
        history = await check.same("long")
        assert len(history) == 2 * 40 + 2 * 6
    finally:
        await harness.close()
        check.plain_saver.close()


@pytest.mark.parametrize(
    ("table", "when"),
    [
        # The step's batch fails at its route row, after its AIMessage row.
        ("writes", "NEW.channel LIKE 'branch:to:ChitalApprovals%'"),
        # The whole batch (the AIMessage with its tool call) is stored, the checkpoint after it not.
        (
            "checkpoints",
            "(SELECT count(*) FROM writes WHERE channel = 'messages'"
            " AND instr(value, CAST('call_disk_full' AS BLOB)) > 0) > 0",
        ),
    ],
)
@pytest.mark.parametrize("retried", [True, False])
async def test_disk_full_in_the_middle_of_a_model_step_of_the_real_agent(
    fake: FakeOpenAI, tmp_path: Path, table: str, when: str, retried: bool
) -> None:
    """A full disk in the real agent's model step: the step's write batch fails at its route row
    (one transaction: none of it is stored), or the batch is stored and the checkpoint after it
    is not (the AIMessage with its tool call is a pending write). Retried, the message is answered;
    the next message is answered too, retried first or not (never an HTTP 400 for a tool result
    whose call LangGraph dropped), and both savers read the same history."""
    RAN.clear()
    db = tmp_path / "cp.sqlite"
    harness = _harness(fake, db)
    await harness.start()
    check = Checker(harness, db)
    try:
        assert (await collect(harness.run("t", user_id="u1", message_id="m1", text="hi")))[-1] == Final(
            "echo: hi"
        )
        await check.same("t")
        conn = harness._saver.conn
        # The model step's rows: its AIMessage (idx 0), then the route to the next node (idx 1).
        _fill_disk(conn, table, when)
        fake.script(
            Reply(tool_calls=[ToolCall("add", {"a": 2, "b": 3}, id="call_disk_full")]), Reply(text="5")
        )
        assert isinstance(
            (await collect(harness.run("t", user_id="u1", message_id="m2", text="2+3?")))[-1], TurnFailed
        )
        _free_disk(conn)
        if retried:  # the gateway retries the message; else the user's next message comes first
            again = await collect(harness.run("t", user_id="u1", message_id="m2", text="2+3?"))
            assert again[-1] == Final("5")
        last = await collect(harness.run("t", user_id="u1", message_id="m3", text="next"))
        await check.same("t")
        # Answered, not an HTTP 400 (without the retry, the reply the fake still holds for m2).
        assert last[-1] == Final("echo: next" if retried else "5")
    finally:
        await harness.close()
        check.plain_saver.close()


async def test_summaries_titles_and_a_failed_checkpoint_write_read_the_same(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    """The context stack (a title call in parallel with the first model call, summaries that
    rewrite the history the model sees), and a step whose checkpoint row cannot be written."""
    from agent.context import build_context_middleware
    from agent.model import build_chat_model
    from agent.settings import ContextSettings

    db = tmp_path / "cp.sqlite"
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key=API_KEY)
    context = ContextSettings(summarize_after_tokens=1_500, keep_recent_messages=4, title="model")
    middleware = build_context_middleware(context, build_chat_model(spec, FAST))
    harness = Harness(FAST, spec, db, extra_tools=[add], extra_middleware=middleware)
    await harness.start()
    check = Checker(harness, db)
    try:
        for i in range(9):
            if i == 7:  # the tool step's checkpoint cannot be stored (the row after its writes)
                conn = harness._saver.conn
                _fill_disk(
                    conn,
                    "checkpoints",
                    "(SELECT count(*) FROM writes WHERE channel = 'messages'"
                    " AND instr(value, CAST('call_fault' AS BLOB)) > 0) > 0",
                )

                # A rule, not the queue: the summary call comes first and would take a queued reply.
                def once(text: str, asked: list[str] = []) -> bool:  # noqa: B006 - fires once
                    if text == "1+2?" and not asked:
                        asked.append(text)
                        return True
                    return False

                fake.add_rule(once, Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2}, id="call_fault")]))
                failed = await collect(harness.run("s", user_id="u1", message_id=f"s{i}", text="1+2?"))
                assert isinstance(failed[-1], TurnFailed)
                await check.same("s")
                _free_disk(conn)
                await collect(harness.run("s", user_id="u1", message_id=f"s{i}", text="1+2?"))
                await check.same("s")
                continue
            text = f"message {i}: " + "lorem ipsum dolor sit amet " * 20
            await collect(harness.run("s", user_id="u1", message_id=f"s{i}", text=text))
            await check.same("s")
        summaries = [r for r in fake.requests if "Context Extraction Assistant" in str(r["messages"])]
        assert summaries, "no summary was made"
    finally:
        await harness.close()
        check.plain_saver.close()


async def test_stop_of_a_first_turn_whose_title_call_runs_beside_it(fake: FakeOpenAI, tmp_path: Path) -> None:
    """/stop while the lead model streams and the title call runs in the same step (parallel
    tasks), then the thread goes on."""
    from agent.context import build_context_middleware
    from agent.events import TextDelta
    from agent.model import build_chat_model
    from agent.settings import ContextSettings

    fake.add_rule(lambda t: "SLOW" in t, Reply(text="a slow answer " * 20, chunks=40, chunk_delay=0.05))
    db = tmp_path / "cp.sqlite"
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key=API_KEY)
    middleware = build_context_middleware(ContextSettings(title="model"), build_chat_model(spec, FAST))
    harness = Harness(FAST, spec, db, extra_tools=[add], extra_middleware=middleware)
    await harness.start()
    check = Checker(harness, db)
    try:
        for thread in ("x", "y"):
            streaming = asyncio.Event()

            async def consume(thread: str = thread, streaming: asyncio.Event = streaming) -> None:
                events = harness.run(thread, user_id="u1", message_id=f"{thread}1", text="SLOW hi")
                async with aclosing(events) as run:  # type: ignore[type-var]
                    async for event in run:
                        if isinstance(event, TextDelta):
                            streaming.set()

            task = asyncio.create_task(consume())
            await asyncio.wait_for(streaming.wait(), 10)
            await asyncio.sleep(0.3 if thread == "y" else 0)  # y: the title call has finished by now
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await check.same(thread)
            done = await collect(harness.run(thread, user_id="u1", message_id=f"{thread}2", text="again"))
            assert done[-1] == Final("echo: again")
            await check.same(thread)
            await collect(
                harness.run(thread, user_id="u1", message_id=f"{thread}1", text="SLOW hi")
            )  # redelivery
            await check.same(thread)
    finally:
        await harness.close()
        check.plain_saver.close()


async def test_threads_evicted_and_read_again_in_the_middle_of_their_runs(tmp_path: Path) -> None:
    """One kept thread (``history_cache=1``), two runs interleaving on the loop, each reading the
    other's state while its own is half done: every read evicts the other thread's history."""
    db = tmp_path / "c.sqlite"
    kept_saver, plain_saver = (
        InlineSqliteSaver.open(db, history_cache=1),
        InlineSqliteSaver.open(db, history_cache=0),
    )
    gate = {"a": asyncio.Event(), "b": asyncio.Event()}

    async def slow(state: Any) -> dict[str, Any]:
        n = len(state.get("messages", []))
        thread = state["plan"]
        await gate[thread].wait()
        return {"messages": [AIMessage(f"{thread} slow {n}", id=f"{thread}-slow-{n}")]}

    async def quick(state: Any) -> dict[str, Any]:
        n = len(state.get("messages", []))
        return {"messages": [AIMessage(f"quick {n}", id=f"{state['plan']}-quick-{n}")]}

    builder = StateGraph(State)
    builder.add_node("quick", quick)
    builder.add_node("slow", slow)
    builder.add_edge(START, "quick")
    builder.add_edge("quick", "slow")
    builder.add_edge("slow", END)
    kept = builder.compile(checkpointer=kept_saver)
    plain = builder.compile(checkpointer=plain_saver)

    async def same(thread: str) -> None:
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        ours, theirs = await kept.aget_state(config), await plain.aget_state(config)
        assert _full(ours.values.get("messages", [])) == _full(theirs.values.get("messages", []))
        assert ours.next == theirs.next

    try:
        for turn in range(4):
            runs = [
                asyncio.create_task(
                    kept.ainvoke(
                        {"messages": [HumanMessage(f"{t} {turn}", id=f"{t}-h{turn}")], "plan": t},
                        {"configurable": {"thread_id": t}},
                    )
                )
                for t in ("a", "b")
            ]
            for _ in range(5):
                await asyncio.sleep(0.01)
                await same("a")
                await same("b")
            gate["a"].set()
            await runs[0]
            await same("b")
            await same("a")
            gate["b"].set()
            await runs[1]
            await same("a")
            await same("b")
            gate["a"].clear()
            gate["b"].clear()
        assert len(kept_saver._known) == 1
    finally:
        kept_saver.close()
        plain_saver.close()
