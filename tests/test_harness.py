"""The agent core against the fake OpenAI server: streaming, tools, retries, failures, exactly-once
resume after a crash (a real killed process), and /stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from agent.config import AgentSettings
from agent.events import Final, StatusUpdate, TextDelta, ToolProgress, TurnFailed
from agent.harness import Harness
from tests.daemon import REPO, env_without
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.harness_support import API_KEY, FAST, roles, spec, turn, user_texts


@pytest.fixture
def make(fake: FakeOpenAI, tmp_path: Path, harnesses: list[Harness]) -> Callable[..., Any]:
    """``await make(settings=..., tools=...)``: a started Harness on ``tmp_path/cp.sqlite``."""

    async def build(settings: AgentSettings = FAST, tools: Sequence[Any] = ()) -> Harness:
        harness = Harness(settings, spec(fake), tmp_path / "cp.sqlite", extra_tools=tools)
        await harness.start()
        harnesses.append(harness)
        return harness

    return build


# ---- streaming and tools --------------------------------------------------------------------


async def test_streams_deltas_then_one_final(fake: FakeOpenAI, make: Callable[..., Any]) -> None:
    harness = await make()
    fake.script(Reply(text="Hello from **Chital**", chunks=4))
    events = await turn(harness, "hi", "m1")
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) == 4 and "".join(deltas) == "Hello from **Chital**"
    assert events[-1] == Final("Hello from **Chital**")
    assert sum(isinstance(e, Final | TurnFailed) for e in events) == 1
    request = fake.requests[0]
    assert request["stream"] is True and request["model"] == "fake-model"
    assert roles(request) == ["system", "user"] and "Chital" in request["messages"][0]["content"]
    assert harness.model_name == "fake-model"
    assert await harness.message_count("t1") == 2


async def test_tool_round_trip(fake: FakeOpenAI, make: Callable[..., Any]) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    harness = await make(tools=[add])
    fake.script(Reply(tool_calls=[ToolCall("add", {"a": 2, "b": 3})]), Reply(text="2 + 3 = 5"))
    events = await turn(harness, "what is 2+3?", "m1")
    progress = [(e.name, e.phase) for e in events if isinstance(e, ToolProgress)]
    assert progress == [("add", "start"), ("add", "end")]
    assert next(e for e in events if isinstance(e, ToolProgress)).detail == '{"a": 2, "b": 3}'
    assert events[-1] == Final("2 + 3 = 5")
    assert [t["function"]["name"] for t in fake.requests[0]["tools"]] == ["add"]
    second = fake.requests[1]["messages"]
    assert second[-1] == {"role": "tool", "content": "5", "tool_call_id": "call_0_add"}


async def test_only_the_lead_agents_tokens_are_streamed(fake: FakeOpenAI, make: Callable[..., Any]) -> None:
    inner = ChatOpenAI(base_url=fake.base_url, api_key=API_KEY, model="m", streaming=True, max_retries=0)

    @tool
    async def consult(question: str) -> str:
        """Ask another model."""
        return (await inner.ainvoke(question)).text

    harness = await make(tools=[consult])
    fake.script(
        Reply(tool_calls=[ToolCall("consult", {"question": "q"})]),
        Reply(text="INNER thoughts", chunks=2),
        Reply(text="outer answer"),
    )
    events = await turn(harness, "ask around", "m1")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "outer answer"
    assert events[-1] == Final("outer answer")


async def test_files_are_named_in_the_message(fake: FakeOpenAI, make: Callable[..., Any]) -> None:
    harness = await make()
    events = await turn(harness, "summarise", "m1", files=[Path("/data/in/report.pdf")])
    assert user_texts(fake.requests[0])[-1] == "summarise\n\nAttached files:\n- /data/in/report.pdf"
    assert isinstance(events[-1], Final)


async def test_last_allowed_step_must_answer(fake: FakeOpenAI, make: Callable[..., Any]) -> None:
    @tool
    def look(x: str) -> str:
        """Look something up."""
        return "nothing"

    harness = await make(settings=AgentSettings(retry_backoff=0.001, max_steps=2), tools=[look])
    fake.script(Reply(tool_calls=[ToolCall("look", {"x": "a"})]), Reply(text="best effort"))
    events = await turn(harness, "dig", "m1")
    assert events[-1] == Final("best effort")
    assert "tool_choice" not in fake.requests[0]
    assert fake.requests[1]["tool_choice"] == "none"
    assert "step limit" in fake.requests[1]["messages"][0]["content"]


# ---- model errors -----------------------------------------------------------------------------


async def test_429_then_success_is_retried_after_retry_after(
    fake: FakeOpenAI, make: Callable[..., Any]
) -> None:
    harness = await make()
    fake.script(Reply(status=429, retry_after=0.3), Reply(text="made it"))
    started = time.monotonic()
    events = await turn(harness, "hi", "m1")
    assert time.monotonic() - started >= 0.25  # Retry-After outranks the 1 ms backoff
    assert events[-1] == Final("made it")
    assert any(isinstance(e, StatusUpdate) and "retrying" in e.text for e in events)
    assert len(fake.requests) == 2


async def test_a_stream_cut_mid_answer_is_retried_without_repeating_text(
    fake: FakeOpenAI, make: Callable[..., Any]
) -> None:
    harness = await make()
    fake.script(
        Reply(text="Hello big world", chunks=5, drop_after=2), Reply(text="Hello big world", chunks=3)
    )
    events = await turn(harness, "hi", "m1")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Hello big world"
    assert events[-1] == Final("Hello big world")
    assert len(fake.requests) == 2


async def test_persistent_500_fails_clearly_and_the_thread_goes_on(
    fake: FakeOpenAI, make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    harness = await make()
    fake.script(*[Reply(status=500, error_message="upstream broke")] * 3)
    events = await turn(harness, "hi", "m1")
    assert events[-1] == TurnFailed("The model service failed. Please try again later.", retryable=True)
    assert len(fake.requests) == 3  # one call + model_retries
    assert API_KEY not in caplog.text and API_KEY not in repr(events)
    assert (await turn(harness, "again", "m2"))[-1] == Final("echo: again")
    assert user_texts(fake.requests[-1]) == ["hi", "again"]


async def test_a_failed_message_retried_by_the_gateway_is_not_appended_twice(
    fake: FakeOpenAI, make: Callable[..., Any]
) -> None:
    harness = await make()
    fake.script(*[Reply(status=503)] * 3)
    assert isinstance((await turn(harness, "hi", "m1"))[-1], TurnFailed)
    assert (await turn(harness, "hi", "m1"))[-1] == Final("echo: hi")
    assert user_texts(fake.requests[-1]) == ["hi"]
    assert await harness.message_count("t1") == 2


async def test_a_model_that_never_stops_calling_tools_is_cut_off(
    fake: FakeOpenAI, make: Callable[..., Any]
) -> None:
    @tool
    def look(x: str) -> str:
        """Look something up."""
        return "nothing"

    harness = await make(settings=AgentSettings(max_steps=1), tools=[look])
    fake.add_rule(lambda text: text == "dig", Reply(tool_calls=[ToolCall("look", {"x": "a"})]))
    events = await turn(harness, "dig", "m1")
    assert events[-1] == TurnFailed("This task needed too many steps and was stopped.")
    # The last tool call got no result; the next turn must still be valid for the API.
    assert (await turn(harness, "ok, stop", "m2"))[-1] == Final("echo: ok, stop")


@pytest.mark.parametrize(
    ("reply", "settings", "message", "calls"),
    [
        (Reply(status=429), FAST, "The model is rate-limited right now", 3),
        (
            Reply(first_byte_delay=3),
            AgentSettings(model_timeout=0.2, model_retries=1),
            "did not answer in time",
            2,
        ),
        (Reply(status=401), FAST, "refused our credentials", 1),
        (Reply(status=400), FAST, "Something went wrong", 1),
    ],
)
async def test_failures_map_to_user_safe_messages(
    fake: FakeOpenAI,
    make: Callable[..., Any],
    reply: Reply,
    settings: AgentSettings,
    message: str,
    calls: int,
) -> None:
    harness = await make(settings=settings.model_copy(update={"retry_backoff": 0.001}))
    fake.script(*[reply] * calls)
    events = await turn(harness, "hi", "m1")
    assert isinstance(events[-1], TurnFailed) and message in events[-1].message
    assert len(fake.requests) == calls


# ---- persistence and exactly-once -------------------------------------------------------------


async def test_answered_message_is_replayed_not_re_asked(fake: FakeOpenAI, make: Callable[..., Any]) -> None:
    first = await make()
    ran = (await turn(first, "hello", "m1"))[-1]
    assert ran == Final("echo: hello") and isinstance(ran, Final) and ran.fresh  # ran whole here
    await first.close()

    second = await make()  # a restarted daemon: same file, new process state
    assert await second.message_count("t1") == 2
    replayed = await turn(second, "hello", "m1")
    assert replayed == [Final("echo: hello")]
    assert not replayed[0].fresh  # a replay: whether it ended on a question is the checkpoint's
    assert len(fake.requests) == 1
    # A new message on the same thread runs normally and sees the history.
    assert (await turn(second, "more", "m2"))[-1] == Final("echo: more")
    assert user_texts(fake.requests[-1]) == ["hello", "more"]
    assert roles(fake.requests[-1]) == ["system", "user", "assistant", "user"]
    assert await turn(second, "more", "m2") == [Final("echo: more")]
    assert len(fake.requests) == 2


async def test_own_message_with_nothing_scheduled_goes_back_to_the_model(
    fake: FakeOpenAI, make: Callable[..., Any]
) -> None:
    """A checkpoint that holds the message but schedules nothing (written by an older version, or
    by hand) is continued by asking the model, not by appending the message again."""
    harness = await make()
    config = {"configurable": {"thread_id": "t1"}}
    graph = harness.require_graph()
    await graph.aupdate_state(config, {"messages": [HumanMessage("stuck?", id="m1")]}, as_node="model")
    assert not (await graph.aget_state(config)).next
    answered = (await turn(harness, "stuck?", "m1"))[-1]
    assert answered == Final("echo: stuck?")
    # The message was in the thread before this run: what it left is the checkpoint's to say.
    assert isinstance(answered, Final) and not answered.fresh
    assert user_texts(fake.requests[-1]) == ["stuck?"]


CHILD = """
import asyncio, pathlib, sys
from langchain_core.tools import tool
from agent.config import AgentSettings, ModelSpec
from agent.harness import Harness

base_url, db, marker = sys.argv[1:4]

@tool
async def long_job() -> str:
    '''Runs for a long time.'''
    pathlib.Path(marker).touch()
    await asyncio.sleep(3600)
    return "never"

async def main() -> None:
    spec = ModelSpec(model="m", base_url=base_url, api_key="sk-child")
    harness = Harness(AgentSettings(retry_backoff=0.001), spec, pathlib.Path(db), extra_tools=[long_job])
    await harness.start()
    async for _ in harness.run("t1", user_id="u1", message_id="m1", text="run the job"):
        pass

asyncio.run(main())
"""


async def crash_mid_turn(fake: FakeOpenAI, db: Path, started: Callable[[], bool]) -> None:
    """Run turn m1 in a child process and SIGKILL it once ``started()`` says it is mid-turn."""
    env = env_without(PYTHONPATH=str(REPO))
    marker = db.with_suffix(".started")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, fake.base_url, str(db), str(marker), cwd=REPO, env=env
    )
    try:
        deadline = time.monotonic() + 45
        while not started():
            assert child.returncode is None, "the child ended before the crash point"
            assert time.monotonic() < deadline, "the child never reached the crash point"
            await asyncio.sleep(0.02)
    finally:
        if child.returncode is None:
            child.send_signal(signal.SIGKILL)
        await child.wait()


async def test_crash_during_a_tool_resumes_from_the_checkpoint(
    fake: FakeOpenAI, make: Callable[..., Any], tmp_path: Path
) -> None:
    fake.script(Reply(tool_calls=[ToolCall("long_job", {})]), Reply(text="job finished"))
    marker = tmp_path / "cp.started"
    await crash_mid_turn(fake, tmp_path / "cp.sqlite", marker.exists)

    @tool
    def long_job() -> str:
        """Runs for a long time."""
        return "job done"

    harness = await make(tools=[long_job])
    events = await turn(harness, "run the job", "m1")
    assert events[-1] == Final("job finished")
    assert [(e.name, e.phase) for e in events if isinstance(e, ToolProgress)] == [("long_job", "end")]
    assert len(fake.requests) == 2  # the tool call was not asked for again
    last = fake.requests[-1]
    assert user_texts(last) == ["run the job"]  # the message was not appended twice
    assert roles(last) == ["system", "user", "assistant", "tool"]
    assert last["messages"][-1]["content"] == "job done"


async def test_crash_while_the_model_streams_continues_without_a_second_message(
    fake: FakeOpenAI, make: Callable[..., Any], tmp_path: Path
) -> None:
    fake.script(Reply(text="a slow answer that never ends", chunks=30, chunk_delay=1))
    await crash_mid_turn(fake, tmp_path / "cp.sqlite", lambda: len(fake.requests) == 1)
    harness = await make()
    fake.script(Reply(text="a fresh answer"))
    events = await turn(harness, "run the job", "m1")
    assert events[-1] == Final("a fresh answer")
    assert len(fake.requests) == 2
    assert roles(fake.requests[-1]) == ["system", "user"]


# ---- /stop ------------------------------------------------------------------------------------


async def stop_when(harness: Harness, text: str, message_id: str, mid_turn: asyncio.Event) -> None:
    """Consume a turn in a task and cancel that task (as /stop does) once ``mid_turn`` is set (the
    first TextDelta sets it too); the task must end promptly."""

    async def consume() -> None:
        async with aclosing(harness.run("t1", user_id="u1", message_id=message_id, text=text)) as run:
            async for event in run:
                if isinstance(event, TextDelta):
                    mid_turn.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(mid_turn.wait(), 10)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert time.monotonic() - started < 1


async def test_stop_mid_stream_leaves_the_thread_usable(fake: FakeOpenAI, make: Callable[..., Any]) -> None:
    harness = await make()
    fake.script(Reply(text="one two three four five six", chunks=6, chunk_delay=5))
    await stop_when(harness, "tell me a long story", "m1", asyncio.Event())
    assert (await turn(harness, "never mind", "m2"))[-1] == Final("echo: never mind")
    assert user_texts(fake.requests[-1]) == ["tell me a long story", "never mind"]
    assert roles(fake.requests[-1]) == ["system", "user", "user"]


async def test_stop_during_a_tool_closes_the_dangling_call(
    fake: FakeOpenAI, make: Callable[..., Any]
) -> None:
    runs: list[str] = []
    running = asyncio.Event()

    @tool
    async def deploy(target: str) -> str:
        """Deploy something (slowly)."""
        runs.append(target)
        running.set()
        await asyncio.Event().wait()
        return "deployed"

    harness = await make(tools=[deploy])
    fake.script(Reply(tool_calls=[ToolCall("deploy", {"target": "prod"}, id="call_d")]))
    await stop_when(harness, "deploy prod", "m1", running)
    # The fake rejects an unanswered tool call (HTTP 400) exactly like the real API would.
    assert (await turn(harness, "status?", "m2"))[-1] == Final("echo: status?")
    assert runs == ["prod"]  # the stopped tool is not run again
    last = fake.requests[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool", "user"]
    assert last[3]["tool_call_id"] == "call_d" and "stopped" in last[3]["content"]
    assert await harness.message_count("t1") == 5
