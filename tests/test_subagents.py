"""Sub-agents through the real Harness and a scripted fake OpenAI server.

The lead and its sub-agents talk to the same fake model. A sub-agent's request is told apart by its
system prompt (and its last user text is the task description, which the rules below match on).
The fake runs on its own event loop thread, so the leak check sees only the tasks of this loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import aclosing, suppress
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.tools import tool

from agent.config import AgentSettings, ModelSpec
from agent.events import AgentEvent, Final, StatusUpdate, TextDelta, ToolProgress
from agent.harness import Harness
from agent.middleware import RetryModelCalls
from agent.model import build_chat_model
from agent.subagents import (
    BASH,
    BASH_PROMPT,
    DEFAULT_SUBAGENT_PROMPT,
    GENERAL_PURPOSE,
    SUBAGENT_EVENT,
    ChitalSubAgents,
    SubagentSettings,
    build_subagents,
    refusal_text,
    subagent_event_to_status,
    timeout_text,
)
from tests.fakes.gateway_rig import until
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text

DEADLINE = 10.0


def is_subagent(body: dict[str, Any]) -> bool:
    first = (body.get("messages") or [{}])[0]
    content = first.get("content") if first.get("role") == "system" else None
    return isinstance(content, str) and content.startswith((DEFAULT_SUBAGENT_PROMPT[:80], BASH_PROMPT[:80]))


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body.get("messages", ()) if m.get("role") == "tool"]


class SpyOpenAI(FakeOpenAI):
    """The fake, plus what these tests must observe: sub-agent requests in flight, their
    connections, and an optional barrier that holds sub-agent replies until N are in flight
    (so overlap is proven by the barrier being met, not by timing)."""

    def __init__(self, *, record: bool = True) -> None:
        super().__init__(record=record)
        self.barrier = 0
        self.barrier_met = False
        self.in_flight = 0
        self.max_in_flight = 0
        self.sub_requests: list[web.Request] = []
        self._all_arrived: asyncio.Event | None = None

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()  # aiohttp caches the body: the base handler reads it again
        if not is_subagent(body):
            return await super()._completions(request)
        self.sub_requests.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.barrier:
                if self._all_arrived is None:
                    self._all_arrived = asyncio.Event()
                if self.in_flight >= self.barrier:
                    self.barrier_met = True
                    self._all_arrived.set()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._all_arrived.wait(), 5)
            return await super()._completions(request)
        finally:
            self.in_flight -= 1

    def bodies(self, sub: bool) -> list[dict[str, Any]]:
        return [b for b in list(self.requests) if is_subagent(b) == sub]


def slow_reply(body: dict[str, Any]) -> Reply:
    """A reply that streams for ~20 s; the handler ends at the first write after the client left."""
    return Reply(text="z" * 400, chunks=400, chunk_delay=0.05)


def delegating_lead(
    tasks: list[str], answer: str, kind: str = GENERAL_PURPOSE
) -> Callable[[dict[str, Any]], Reply]:
    """The lead's script: one message with a task call per task, then ``answer``."""

    def reply(body: dict[str, Any]) -> Reply:
        if tool_results(body):
            return Reply(text=answer)
        calls = [
            ToolCall("task", {"description": task, "subagent_type": kind}, id=f"call_{i}")
            for i, task in enumerate(tasks)
        ]
        return Reply(tool_calls=calls)

    return reply


@tool
async def execute(command: str) -> str:
    """Run a shell command in the sandbox."""
    return f"ran: {command}"


@pytest.fixture
def spy_model() -> Iterator[SpyOpenAI]:
    server = SpyOpenAI.start_in_thread()
    try:
        yield server  # type: ignore[misc]
    finally:
        server.stop()


Factory = Callable[..., Any]


def status_events(part: Any) -> list[AgentEvent]:
    """The converter the runtime hands to ``Harness(custom_events=...)``."""
    status = subagent_event_to_status(part)
    return [status] if status is not None else []


@pytest.fixture
def make_harness(spy_model: SpyOpenAI, tmp_path: Path, harnesses: list[Harness]) -> Factory:
    async def make(sub_middleware: Sequence[Any] = (), **limits: Any) -> tuple[Harness, ChitalSubAgents]:
        settings = AgentSettings(model_retries=0, retry_backoff=0, model_timeout=10, max_steps=6)
        spec = ModelSpec(name="fake", base_url=spy_model.base_url, api_key="test-key", model="fake-model")
        model = build_chat_model(spec, settings)
        [middleware] = build_subagents(model, [execute], SubagentSettings(**limits), sub_middleware)
        assert isinstance(middleware, ChitalSubAgents)
        harness = Harness(
            settings,
            spec,
            tmp_path / f"ck{len(harnesses)}.sqlite",
            extra_middleware=[middleware],
            custom_events=[status_events],
        )
        await harness.start()
        harnesses.append(harness)
        return harness, middleware

    return make


async def turn(harness: Harness, text: str, message_id: str, thread: str = "t1") -> list[AgentEvent]:
    async with aclosing(harness.run(thread, user_id="u1", message_id=message_id, text=text)) as events:
        return [event async for event in events]


def answer(events: list[AgentEvent]) -> str:
    assert isinstance(events[-1], Final), events[-1]
    return events[-1].text


# ---- the tests ---------------------------------------------------------------------------------
async def test_three_run_in_parallel_and_a_fourth_is_refused(
    spy_model: SpyOpenAI, make_harness: Factory
) -> None:
    spy_model.barrier = 3
    spy_model.add_rule(
        lambda t: t.startswith("job"), lambda body: Reply(text=f"result of {last_user_text(body)}")
    )
    spy_model.add_rule(
        lambda t: True, delegating_lead(["job 1", "job 2", "job 3", "job 4"], "All jobs handled.")
    )
    harness, _ = await make_harness()

    events = await turn(harness, "Do four jobs", "m1")

    assert answer(events) == "All jobs handled."
    # Sub-agent tokens never pose as the lead's answer.
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "All jobs handled."
    assert spy_model.barrier_met and spy_model.max_in_flight == 3
    assert len(spy_model.bodies(sub=True)) == 3
    results = tool_results(spy_model.bodies(sub=False)[-1])
    assert len(results) == 4 and results.count(refusal_text(3)) == 1
    ran = {r for r in results if r != refusal_text(3)}
    assert len(ran) == 3 and ran < {f"result of job {i}" for i in range(1, 5)}
    assert refusal_text(3) == (
        "Refused: 3 sub-agents are already running in this turn; wait for one to finish or do it yourself."
    )


async def test_subagent_sees_only_its_task(spy_model: SpyOpenAI, make_harness: Factory) -> None:
    spy_model.add_rule(lambda t: t.startswith("job"), Reply(text="counted 3 files"))
    spy_model.add_rule(lambda t: "PELICAN" in t, Reply(text="Noted."))
    spy_model.add_rule(lambda t: True, delegating_lead(["job: count the files"], "There are 3 files."))
    harness, _ = await make_harness()

    assert answer(await turn(harness, "The code word is PELICAN.", "m1")) == "Noted."
    assert answer(await turn(harness, "How many files are there?", "m2")) == "There are 3 files."

    [sub] = spy_model.bodies(sub=True)
    assert [m["role"] for m in sub["messages"]] == ["system", "user"]
    assert sub["messages"][1]["content"] == "job: count the files"
    assert "PELICAN" not in str(sub) and "How many files" not in str(sub)
    assert {t["function"]["name"] for t in sub["tools"]} == {"execute"}  # no task: no recursion
    # The lead's own history is intact and got the sub-agent's report as the tool result.
    lead = spy_model.bodies(sub=False)[-1]
    assert "PELICAN" in str(lead["messages"]) and tool_results(lead) == ["counted 3 files"]


async def test_timeout_is_reported_to_the_lead(spy_model: SpyOpenAI, make_harness: Factory) -> None:
    spy_model.add_rule(lambda t: t.startswith("job"), slow_reply)
    spy_model.add_rule(lambda t: True, delegating_lead(["job: a long build"], "The build took too long."))
    harness, middleware = await make_harness(timeout_seconds=0.5)

    started = time.monotonic()
    events = await turn(harness, "Build it", "m1")

    assert answer(events) == "The build took too long."
    assert time.monotonic() - started < 8
    assert tool_results(spy_model.bodies(sub=False)[-1]) == [timeout_text(GENERAL_PURPOSE, 0.5)]
    assert "timed out after 0.5 s" in timeout_text(GENERAL_PURPOSE, 0.5)
    # The sub-agent's model call was cancelled: its connection is closed.
    await until(
        lambda: all(r.transport is None for r in spy_model.sub_requests),
        DEADLINE,
        "the sub-agent's connection to close",
    )
    assert middleware.running("t1") == 0


async def test_step_cap_makes_the_last_call_answer(spy_model: SpyOpenAI, make_harness: Factory) -> None:
    def sub(body: dict[str, Any]) -> Reply:
        if body.get("tool_choice") == "none":
            return Reply(text="partial report")
        return Reply(tool_calls=[ToolCall("execute", {"command": "make"})])

    spy_model.add_rule(lambda t: t.startswith("job"), sub)
    spy_model.add_rule(lambda t: True, delegating_lead(["job: loop forever"], "Got a partial report."))
    harness, _ = await make_harness(max_steps=2)

    assert answer(await turn(harness, "Go", "m1")) == "Got a partial report."
    subs = spy_model.bodies(sub=True)
    assert len(subs) == 2 and subs[-1]["tool_choice"] == "none"
    assert tool_results(spy_model.bodies(sub=False)[-1]) == ["partial report"]


async def test_failed_subagent_does_not_fail_the_turn(spy_model: SpyOpenAI, make_harness: Factory) -> None:
    spy_model.add_rule(
        lambda t: t.startswith("job"), Reply(status=400, error_message="secret-ish provider text")
    )
    spy_model.add_rule(lambda t: True, delegating_lead(["job: x"], "I will do it myself."))
    harness, _ = await make_harness()

    assert answer(await turn(harness, "Go", "m1")) == "I will do it myself."
    [result] = tool_results(spy_model.bodies(sub=False)[-1])
    assert result.startswith("Sub-agent 'general-purpose' failed (error: ") and "HTTP 400" in result
    assert "secret-ish" not in result


async def test_progress_reaches_the_chat_as_status(spy_model: SpyOpenAI, make_harness: Factory) -> None:
    def sub(body: dict[str, Any]) -> Reply:
        if tool_results(body):
            return Reply(text="listed")
        return Reply(tool_calls=[ToolCall("execute", {"command": "ls -la"})])

    spy_model.add_rule(lambda t: t.startswith("job"), sub)
    spy_model.add_rule(lambda t: True, delegating_lead(["job: list the workspace"], "Listed.", kind=BASH))
    harness, _ = await make_harness()

    events = await turn(harness, "List it", "m1")

    assert answer(events) == "Listed."
    shown = [e for e in events if isinstance(e, StatusUpdate | ToolProgress)]
    assert shown[0] == ToolProgress(
        "task", "start", '{"description": "job: list the workspace", "subagent_type": "bash"}'
    )
    assert [e.text for e in shown[1:3]] == [
        "Sub-agent bash (job: list the workspace) started",
        'Sub-agent bash (job: list the workspace): execute {"command": "ls -la"}',
    ]
    assert isinstance(shown[3], StatusUpdate)
    assert shown[3].text.startswith("Sub-agent bash (job: list the workspace) finished in ")
    assert shown[4:] == [ToolProgress("task", "end")]  # the sub-agent's own tool is not the lead's


async def test_status_lines_show_the_models_text_visible_and_bounded(
    spy_model: SpyOpenAI, make_harness: Factory
) -> None:
    """A task and a sub-agent's tool call are the model's text: a bidi override or a zero-width
    character in them does not reach the chat's status line, and a long one is cut."""

    def sub(body: dict[str, Any]) -> Reply:
        if tool_results(body):
            return Reply(text="done")
        return Reply(tool_calls=[ToolCall("execute", {"command": "cat \u202etxt.exe" + " x" * 500})])

    spy_model.add_rule(lambda t: t.startswith("job"), sub)
    task = "job: read\u200b the \u202efile" + " y" * 200
    spy_model.add_rule(lambda t: True, delegating_lead([task], "Read.", kind=BASH))
    harness, _ = await make_harness()
    events = await turn(harness, "Read it", "m1")
    assert answer(events) == "Read."
    lines = [e.text for e in events if isinstance(e, StatusUpdate)]
    assert any("execute" in line and "cat txt.exe" in line for line in lines), lines
    assert not any("\u202e" in line or "\u200b" in line for line in lines)
    assert max(map(len, lines)) < 250


async def test_subagent_retries_stay_out_of_the_chat(spy_model: SpyOpenAI, make_harness: Factory) -> None:
    """RetryModelCalls inside a sub-agent: its retry events must not reach the lead's stream (where
    the harness would say "retrying" and treat the lead's streamed text as repeated)."""
    failures = iter([Reply(status=503)])

    spy_model.add_rule(lambda t: t.startswith("job"), lambda body: next(failures, Reply(text="fine now")))
    spy_model.add_rule(lambda t: True, delegating_lead(["job: flaky"], "It worked."))
    harness, _ = await make_harness([RetryModelCalls(max_retries=2, initial_delay=0)])

    events = await turn(harness, "Go", "m1")

    assert answer(events) == "It worked."
    assert len(spy_model.bodies(sub=True)) == 2
    assert tool_results(spy_model.bodies(sub=False)[-1]) == ["fine now"]
    assert not [e for e in events if isinstance(e, StatusUpdate) and "retrying" in e.text]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "It worked."


async def test_stop_cancels_running_subagents(spy_model: SpyOpenAI, make_harness: Factory) -> None:
    spy_model.add_rule(lambda t: t.startswith("job"), slow_reply)
    spy_model.add_rule(lambda t: "again" in t, Reply(text="Back."))
    spy_model.add_rule(lambda t: True, delegating_lead(["job: slow 1", "job: slow 2"], "never"))
    harness, middleware = await make_harness()
    before = asyncio.all_tasks()

    async def consume() -> list[AgentEvent]:
        return await turn(harness, "Start the slow jobs", "m1")

    consumer = asyncio.create_task(consume())
    await until(lambda: len(spy_model.sub_requests) == 2, DEADLINE, "both sub-agents to call the model")
    requests_at_stop = len(spy_model.requests)
    stopped = time.monotonic()
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer

    await until(
        lambda: all(r.transport is None for r in spy_model.sub_requests),
        DEADLINE,
        "the sub-agents' connections to close",
    )
    assert time.monotonic() - stopped < 5
    await until(
        lambda: not (asyncio.all_tasks() - before - {asyncio.current_task()}), DEADLINE, "no leaked tasks"
    )
    assert middleware.running("t1") == 0
    assert len(spy_model.requests) == requests_at_stop
    # The thread stays usable: the stopped task calls are closed and the next turn answers.
    assert answer(await turn(harness, "Are you there again?", "m2")) == "Back."
    results = tool_results(spy_model.requests[-1])
    assert len(results) == 2 and all("stopped before it finished" in r for r in results)


def test_status_text_for_every_phase() -> None:
    def status(phase: str, detail: str = "") -> str | None:
        event = {"id": "c1", "type": "bash", "phase": phase, "detail": detail, "task": "run tests"}
        update = subagent_event_to_status({SUBAGENT_EVENT: event})
        return update.text if update else None

    assert status("started") == "Sub-agent bash (run tests) started"
    assert status("running", "execute pytest") == "Sub-agent bash (run tests): execute pytest"
    assert status("done", "12 s") == "Sub-agent bash (run tests) finished in 12 s"
    assert status("failed", "out of steps") == "Sub-agent bash (run tests) failed: out of steps"
    assert status("timed_out", "15 min") == "Sub-agent bash (run tests) timed out after 15 min"
    assert (
        status("refused", "3 already running") == "Sub-agent bash (run tests) not started: 3 already running"
    )
    assert status("bogus") is None
    assert subagent_event_to_status({"chital.model_retry": {"attempt": 1}}) is None
    assert subagent_event_to_status("text") is None


def test_settings_and_types() -> None:
    model = build_chat_model(ModelSpec(api_key="k", base_url="http://127.0.0.1:9/v1"), AgentSettings())
    assert build_subagents(model, [execute], SubagentSettings(enabled=False)) == []
    [with_shell] = build_subagents(model, [execute], SubagentSettings())
    assert isinstance(with_shell, ChitalSubAgents)
    assert with_shell.subagent_names == {GENERAL_PURPOSE, BASH}
    [without_shell] = build_subagents(model, [], SubagentSettings())
    assert isinstance(without_shell, ChitalSubAgents)
    assert without_shell.subagent_names == {GENERAL_PURPOSE}

    class Sandbox(AgentMiddleware[Any, Any, Any]):
        tools = [execute]  # noqa: RUF012  (as deepagents' FilesystemMiddleware provides them)

    [via_middleware] = build_subagents(model, [], SubagentSettings(), [Sandbox()])
    assert isinstance(via_middleware, ChitalSubAgents)
    assert via_middleware.subagent_names == {GENERAL_PURPOSE, BASH}
    defaults = SubagentSettings()
    assert (defaults.max_concurrent, defaults.timeout_seconds, defaults.enabled) == (3, 900.0, True)
    assert "timed out after 15 min" in timeout_text(BASH, 900)
    with pytest.raises(ValueError):
        SubagentSettings(max_concurrent=0)
