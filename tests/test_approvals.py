"""Approval before risky actions (docs/approvals.md).

Agent side: the real harness against the fake OpenAI server pauses on a gated tool call, resumes
with the decision (also in a new process-like harness on the same checkpoint), and refuses denied
tools. Gateway side (in-process rig): the buttons message, who may answer, exactly-once clicks,
timeouts, restarts. Per-platform e2e tests live at the end of this file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path

import pytest
from langchain_core.tools import tool

from agent.approvals import with_approvals
from agent.config import AgentSettings, ModelSpec
from agent.events import AgentEvent, ApprovalDecision, ApprovalRequested, Final, ToolProgress
from agent.harness import Harness
from agent.safety import Redactor
from agent.settings import ApprovalSettings
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

API_KEY = "sk-test-secret-0123456789"
FAST = AgentSettings(retry_backoff=0.001, model_retries=0, model_timeout=5)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(key, raising=False)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


RAN: list[str] = []


@tool
def shell(command: str) -> str:
    """Run a shell command."""
    RAN.append(command)
    return f"output of {command}"


@tool
def wipe(path: str) -> str:
    """Delete a path."""
    RAN.append(f"wipe {path}")
    return "wiped"


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    RAN.clear()


def harness_for(fake: FakeOpenAI, path: Path, policy: ApprovalSettings) -> Harness:
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key=API_KEY)
    middleware = with_approvals([], policy, ["shell", "wipe"])
    return Harness(
        FAST,
        spec,
        path,
        extra_tools=[shell, wipe],
        extra_middleware=middleware,
        redact=Redactor(["hunter2-secret"]),
    )


async def collect(events: AsyncIterator[AgentEvent]) -> list[AgentEvent]:
    async with aclosing(events) as run:  # type: ignore[type-var]
        return [event async for event in run]


async def test_a_gated_call_pauses_and_an_approval_runs_it(fake: FakeOpenAI, tmp_path: Path) -> None:
    harness = harness_for(fake, tmp_path / "cp.sqlite", ApprovalSettings(tools=["shell"]))
    await harness.start()
    try:
        fake.script(
            Reply(tool_calls=[ToolCall("shell", {"command": "ls", "env": "TOKEN=hunter2-secret"})]),
            Reply(text="Here is the listing."),
        )
        events = await collect(harness.run("t1", user_id="u1", message_id="m1", text="list files"))
        asks = [e for e in events if isinstance(e, ApprovalRequested)]
        assert len(asks) == 1 and not any(isinstance(e, Final) for e in events)
        assert asks[0].tool == "shell" and asks[0].args["command"] == "ls"
        assert "hunter2-secret" not in repr(asks[0]) and "***" in asks[0].args["env"]
        assert RAN == [] and len(fake.requests) == 1
        # A replayed turn (a crash before the buttons were recorded) asks again with the same id.
        again = await collect(harness.run("t1", user_id="u1", message_id="m1", text="list files"))
        assert [e.id for e in again if isinstance(e, ApprovalRequested)] == [asks[0].id]
        assert RAN == []
        events = await collect(
            harness.resume(
                "t1", user_id="u1", message_id="m1", approval_id=asks[0].id, decision=ApprovalDecision(True)
            )
        )
        assert RAN == ["ls"] and events[-1] == Final("Here is the listing.")
        assert fake.requests[-1]["messages"][-1]["content"] == "output of ls"
        # The same click again (a redelivery): the answer is replayed, the tool does not run twice.
        events = await collect(
            harness.resume(
                "t1", user_id="u1", message_id="m1", approval_id=asks[0].id, decision=ApprovalDecision(True)
            )
        )
        assert RAN == ["ls"] and events == [Final("Here is the listing.")]
    finally:
        await harness.close()


async def test_a_denial_is_the_tools_result_and_survives_a_restart(fake: FakeOpenAI, tmp_path: Path) -> None:
    policy = ApprovalSettings(tools=["sh*"])
    first = harness_for(fake, tmp_path / "cp.sqlite", policy)
    await first.start()
    fake.script(
        Reply(tool_calls=[ToolCall("shell", {"command": "rm -rf /"})]), Reply(text="OK, I did not run it.")
    )
    events = await collect(first.run("t1", user_id="u1", message_id="m1", text="clean up"))
    (ask,) = [e for e in events if isinstance(e, ApprovalRequested)]
    await first.close()  # the daemon restarts between the request and the click
    second = harness_for(fake, tmp_path / "cp.sqlite", policy)
    await second.start()
    try:
        decision = ApprovalDecision(False, "denied by Alice")
        events = await collect(
            second.resume("t1", user_id="u1", message_id="m1", approval_id=ask.id, decision=decision)
        )
        assert RAN == [] and events[-1] == Final("OK, I did not run it.")
        tool_result = fake.requests[-1]["messages"][-1]
        assert tool_result["role"] == "tool" and "denied by Alice" in tool_result["content"]
        assert ("shell", "error") in [(e.name, e.phase) for e in events if isinstance(e, ToolProgress)]
    finally:
        await second.close()


async def test_the_policy_guardrail_refuses_denied_tools_without_asking(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    harness = harness_for(fake, tmp_path / "cp.sqlite", ApprovalSettings(tools=["*"], deny=["wipe"]))
    await harness.start()
    try:
        fake.script(Reply(tool_calls=[ToolCall("wipe", {"path": "/"})]), Reply(text="Not allowed."))
        events = await collect(harness.run("t1", user_id="u1", message_id="m1", text="wipe it"))
        assert not any(isinstance(e, ApprovalRequested) for e in events)
        assert events[-1] == Final("Not allowed.") and RAN == []
        assert "policy does not allow wipe" in fake.requests[-1]["messages"][-1]["content"]
    finally:
        await harness.close()


async def test_a_new_message_while_waiting_closes_the_paused_call(fake: FakeOpenAI, tmp_path: Path) -> None:
    harness = harness_for(fake, tmp_path / "cp.sqlite", ApprovalSettings(tools=["shell"]))
    await harness.start()
    try:
        fake.script(Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]), Reply(text="Sure, hello."))
        events = await collect(harness.run("t1", user_id="u1", message_id="m1", text="list"))
        assert any(isinstance(e, ApprovalRequested) for e in events)
        events = await collect(harness.run("t1", user_id="u1", message_id="m2", text="never mind, hi"))
        assert events[-1] == Final("Sure, hello.") and RAN == []
        roles = [m["role"] for m in fake.requests[-1]["messages"]]
        assert roles[-3:] == ["assistant", "tool", "user"]  # the paused call got a result
    finally:
        await harness.close()
