"""Context middleware and the clarification / present_files / MCP tools, driven by real turns.

The scripted fake model (tests/fakes/openai_server.py) asks for tool calls; the real harness,
LangChain agent and langchain-openai client run them. Assertions look at what the user gets
(events) and at what the model was sent (the fake's recorded requests).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from deepagents import DeepAgentState
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import StructuredTool, ToolException
from langgraph.checkpoint.memory import InMemorySaver

from agent.config import AgentSettings, ModelSpec
from agent.context import (
    Allow,
    ContextSettings,
    Deny,
    GuardrailContext,
    Redactor,
    build_context_middleware,
    patch_dangling,
    thread_title,
)
from agent.events import AgentEvent, Clarification, FileOut, Final, TextDelta, ToolProgress
from agent.harness import Harness
from agent.model import build_chat_model
from agent.sandbox.files import HostFiles
from agent.sandbox.paths import PathMapper, ThreadDirs
from agent.tools import (
    McpServer,
    McpSettings,
    build_present_files,
    events_from_custom,
    is_clarification,
    load_mcp_tools,
    outputs_resolver,
)
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text

FIXTURES = Path(__file__).parent / "fixtures"
QUIET = ContextSettings(title="off", summarize_after_tokens=None)


def _spec(fake: FakeOpenAI) -> ModelSpec:
    return ModelSpec(base_url=fake.base_url, api_key="k", model="m")


def _harness(
    fake: FakeOpenAI, tmp_path: Path, ctx: ContextSettings = QUIET, *, tools: Sequence[Any] = (), **kw: Any
) -> Harness:
    settings = AgentSettings(model_retries=0)
    model = build_chat_model(_spec(fake), settings)
    middleware = build_context_middleware(ctx, model, **kw)
    return Harness(
        settings, _spec(fake), tmp_path / "cp.sqlite", extra_tools=tools, extra_middleware=middleware
    )


async def _turn(harness: Harness, text: str, message_id: str, thread: str = "t") -> list[AgentEvent]:
    async with aclosing(harness.run(thread, user_id="u1", message_id=message_id, text=text)) as run:
        return [event async for event in run]


def _graph(fake: FakeOpenAI, ctx: ContextSettings = QUIET, tools: Sequence[Any] = ()) -> Any:
    """The harness's graph shape without the harness, to see custom stream parts and seed state."""
    settings = AgentSettings(model_retries=0)
    model = build_chat_model(_spec(fake), settings)
    return create_agent(
        model,
        list(tools),
        middleware=build_context_middleware(ctx, model),
        state_schema=DeepAgentState,
        checkpointer=InMemorySaver(),
    )


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _tool_messages(body: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: _text(m["content"]) for m in body["messages"] if m["role"] == "tool"}


def _counting_tool(name: str, calls: list[dict[str, Any]], fail: Exception | None = None) -> StructuredTool:
    async def run(text: str) -> str:
        calls.append({"text": text})
        if fail is not None:
            raise fail
        return f"{name} did {text}"

    return StructuredTool.from_function(coroutine=run, name=name, description=f"The {name} tool.")


# ---- settings and small pieces ------------------------------------------------------------------
def test_settings_validate_loop_thresholds() -> None:
    with pytest.raises(ValueError, match="loop_stop_after"):
        ContextSettings(loop_warn_after=4, loop_stop_after=4)


def test_redactor_scrubs_configured_secrets_and_credential_patterns() -> None:
    redact = Redactor(["sk-live-abcdef123"])
    out = redact("key sk-live-abcdef123 and Authorization: Bearer xyz.123 and api_key=hunter22&x=1")
    assert "sk-live-abcdef123" not in out and "xyz.123" not in out and "hunter22" not in out
    assert "x=1" in out


def test_patch_dangling_places_results_after_the_calls() -> None:
    ai = AIMessage(
        "", tool_calls=[{"name": "a", "args": {}, "id": "1"}, {"name": "b", "args": {}, "id": "2"}]
    )
    history = [HumanMessage("hi"), ai, ToolMessage("ok", tool_call_id="1", name="a"), HumanMessage("again")]
    patched = patch_dangling(history)
    assert patched is not None
    assert [type(m).__name__ for m in patched] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "ToolMessage",
        "HumanMessage",
    ]
    synthetic = patched[3]
    assert (
        isinstance(synthetic, ToolMessage) and synthetic.tool_call_id == "2" and synthetic.status == "error"
    )
    assert "cancelled" in synthetic.text
    assert patch_dangling([*history[:3]]) is not None  # dangling at the tail too
    assert patch_dangling([HumanMessage("x"), AIMessage("y")]) is None


# ---- dangling tool calls ------------------------------------------------------------------------
async def test_dangling_tool_call_in_history_is_answered_before_the_model_call(fake: FakeOpenAI) -> None:
    graph = _graph(fake)
    dangling = AIMessage("", tool_calls=[{"name": "lookup", "args": {"q": "x"}, "id": "call_lost"}], id="ai1")
    seeded = [
        HumanMessage("first", id="h1"),
        dangling,
        AIMessage("sorry, that broke", id="ai2"),
        HumanMessage("second", id="h2"),
    ]
    fake.script(Reply(text="fine"))
    result = await graph.ainvoke({"messages": seeded}, {"configurable": {"thread_id": "d"}})
    assert result["messages"][-1].text == "fine"
    sent = fake.requests[-1]["messages"]
    roles = [m["role"] for m in sent]
    i = next(i for i, m in enumerate(sent) if m.get("tool_calls"))
    assert roles[i + 1] == "tool" and sent[i + 1]["tool_call_id"] == "call_lost"
    assert "cancelled" in sent[i + 1]["content"]
    # The repair is in the request only: the checkpoint keeps the history as it was.
    assert not any(isinstance(m, ToolMessage) for m in result["messages"])


# ---- tool errors --------------------------------------------------------------------------------
async def test_tool_exceptions_become_short_secret_free_error_messages(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    secret = "sk-secret-9876543210"
    crash_calls: list[dict[str, Any]] = []
    picky_calls: list[dict[str, Any]] = []
    tools = [
        _counting_tool("crash", crash_calls, RuntimeError(f"db password {secret} rejected")),
        _counting_tool("picky", picky_calls, ToolException(f"bad input; token {secret} not valid for it")),
    ]
    fake.script(
        Reply(
            tool_calls=[ToolCall("crash", {"text": "a"}, id="c1"), ToolCall("picky", {"text": "b"}, id="c2")]
        ),
        Reply(text="Both tools failed; here is what I know."),
    )
    async with _harness(fake, tmp_path, tools=tools, secrets=[secret]) as harness:
        events = await _turn(harness, "do it", "m1")
    assert events[-1] == Final("Both tools failed; here is what I know.")
    assert [(e.name, e.phase) for e in events if isinstance(e, ToolProgress) and e.phase == "error"] == [
        ("crash", "error"),
        ("picky", "error"),
    ]
    results = _tool_messages(fake.requests[-1])
    assert (
        results["c1"]
        == "Error: crash failed (RuntimeError). Fix the arguments and retry, or go on without it."
    )
    assert "bad input" in results["c2"] and "***" in results["c2"]
    assert secret not in json.dumps(fake.requests[-1])


# ---- loop detection -----------------------------------------------------------------------------
async def test_repeated_identical_calls_warn_then_force_an_answer(fake: FakeOpenAI, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    same = ToolCall("probe", {"text": "same"})
    fake.script(
        Reply(tool_calls=[same]),
        Reply(tool_calls=[same]),
        Reply(tool_calls=[same]),
        Reply(tool_calls=[same]),  # the model ignores tool_choice=none: the call is dropped anyway
    )
    ctx = ContextSettings(title="off", summarize_after_tokens=None, loop_warn_after=2, loop_stop_after=3)
    async with _harness(fake, tmp_path, ctx, tools=[_counting_tool("probe", calls)]) as harness:
        events = await _turn(harness, "probe it", "m1")
    assert len(calls) == 3
    assert isinstance(events[-1], Final) and "repeating the same step (probe)" in events[-1].text
    systems = [r["messages"][0]["content"] for r in fake.requests]
    assert "same arguments" not in systems[1]
    assert "same arguments 2 times" in systems[2] and fake.requests[2].get("tool_choice") != "none"
    assert "Stop calling tools" in systems[3] and fake.requests[3]["tool_choice"] == "none"


async def test_different_arguments_are_not_a_loop(fake: FakeOpenAI, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    fake.script(
        *(Reply(tool_calls=[ToolCall("probe", {"text": f"page {i}"})]) for i in range(4)), Reply(text="done")
    )
    ctx = ContextSettings(title="off", summarize_after_tokens=None, loop_warn_after=2, loop_stop_after=3)
    async with _harness(fake, tmp_path, ctx, tools=[_counting_tool("probe", calls)]) as harness:
        events = await _turn(harness, "read four pages", "m1")
    assert len(calls) == 4 and events[-1] == Final("done")
    assert all("same arguments" not in r["messages"][0]["content"] for r in fake.requests)


# ---- guardrails ---------------------------------------------------------------------------------
async def test_guardrails_veto_fail_closed(fake: FakeOpenAI, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    seen: list[GuardrailContext] = []
    stuck = asyncio.Event()

    async def policy(name: str, args: dict[str, Any], ctx: GuardrailContext) -> Allow | Deny:
        seen.append(ctx)
        if "forbidden" in args.get("text", ""):
            return Deny("notes about forbidden things are not allowed")
        return Allow()

    async def fragile(name: str, args: dict[str, Any], ctx: GuardrailContext) -> Allow | Deny:
        if "crash" in args.get("text", ""):
            raise RuntimeError("guardrail bug")
        if "slow" in args.get("text", ""):
            await stuck.wait()
        return Allow()

    fake.script(
        Reply(
            tool_calls=[
                ToolCall("note", {"text": "forbidden plan"}, id="g1"),
                ToolCall("note", {"text": "crash please"}, id="g2"),
                ToolCall("note", {"text": "slow one"}, id="g3"),
                ToolCall("note", {"text": "groceries"}, id="g4"),
            ]
        ),
        Reply(text="One note saved."),
    )
    ctx = ContextSettings(title="off", summarize_after_tokens=None, guardrail_timeout=0.3)
    async with _harness(
        fake, tmp_path, ctx, tools=[_counting_tool("note", calls)], guardrails=[policy, fragile]
    ) as harness:
        events = await _turn(harness, "take notes", "m1", thread="guarded")
    stuck.set()
    assert calls == [{"text": "groceries"}]
    assert events[-1] == Final("One note saved.")
    results = _tool_messages(fake.requests[-1])
    assert results["g1"] == "Refused: note was not run. Reason: notes about forbidden things are not allowed"
    assert "safety check failed" in results["g2"]
    assert "did not answer in time" in results["g3"]
    assert results["g4"] == "note did groceries"
    assert seen[0].thread_id == "guarded" and seen[0].user_id == "u1" and seen[0].message_id == "m1"
    assert {c.tool_call_id for c in seen} == {"g1", "g2", "g3", "g4"}


# ---- clarification ------------------------------------------------------------------------------
async def test_clarification_ends_the_turn_with_the_question(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.script(Reply(tool_calls=[ToolCall("ask_clarification", {"question": "Which city do you mean?"})]))
    async with _harness(fake, tmp_path) as harness:
        events = await _turn(harness, "book me a hotel", "m1")
        assert len(fake.requests) == 1  # the question costs no second model call
        assert events[-1] == Final("Which city do you mean?")
        # A redelivered message replays the question instead of running the model again.
        again = await _turn(harness, "book me a hotel", "m1")
        assert again == [Final("Which city do you mean?")] and len(fake.requests) == 1
        # The user's reply is a normal next turn that sees the question and the answer.
        fake.script(Reply(text="Booked in Porto."))
        nxt = await _turn(harness, "Porto", "m2")
    assert nxt[-1] == Final("Booked in Porto.")
    sent = fake.requests[-1]["messages"]
    assert [m["role"] for m in sent[-4:]] == ["assistant", "tool", "assistant", "user"]
    assert sent[-2]["content"] == "Which city do you mean?"


async def test_clarification_custom_event_converts_to_agent_event(fake: FakeOpenAI) -> None:
    graph = _graph(fake)
    fake.script(Reply(tool_calls=[ToolCall("ask_clarification", {"question": "Formal or casual?"})]))
    converted: list[AgentEvent] = []
    config = {"configurable": {"thread_id": "c"}}
    async for part in graph.astream(
        {"messages": [HumanMessage("write an invite")]}, config, stream_mode="custom"
    ):
        converted.extend(events_from_custom(part))
    assert converted == [Clarification("Formal or casual?")]
    assert len(fake.requests) == 1
    last = (await graph.aget_state(config)).values["messages"][-1]
    assert is_clarification(last) and not last.tool_calls


# ---- summarization ------------------------------------------------------------------------------
def _summary_rule(fake: FakeOpenAI, reply: Reply) -> None:
    fake.add_rule(lambda text: "Messages to summarize" in text, reply)


async def test_summarization_shortens_the_request_and_carries_the_summary(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    _summary_rule(fake, Reply(text="SUMMARY-7: the user described aardvarks at length."))
    ctx = ContextSettings(title="off", summarize_after_tokens=200, keep_recent_messages=1)
    long_text = "AARDVARK-1 " + "aardvarks dig burrows at night. " * 60
    async with _harness(fake, tmp_path, ctx) as harness:
        first = await _turn(harness, long_text, "m1")
        assert first[-1].text.startswith("echo: AARDVARK-1")  # type: ignore[union-attr]
        assert len(fake.requests) == 1  # one message only: nothing to summarize yet
        second = await _turn(harness, "what do they eat?", "m2")
        history = await harness.message_count("t")
    summary_requests = [r for r in fake.requests if "Messages to summarize" in last_user_text(r)]
    assert len(summary_requests) == 1 and "AARDVARK-1" in last_user_text(summary_requests[0])
    after = fake.requests[-1]
    assert "Messages to summarize" not in last_user_text(after)
    body = json.dumps(after)
    assert "SUMMARY-7" in body and "AARDVARK-1" not in body
    assert len(body) < len(json.dumps(fake.requests[0]))
    assert second[-1] == Final("echo: what do they eat?")
    assert not any(isinstance(e, TextDelta) and "SUMMARY" in e.text for e in second)  # hidden from the chat
    # The state keeps the summary and the messages since: the summarised turn left it in the same
    # step (agent/compaction.py); its text is in the summarised-history file.
    assert history == 2


async def test_failed_summary_call_falls_back_to_the_full_history(fake: FakeOpenAI, tmp_path: Path) -> None:
    _summary_rule(fake, Reply(status=400, error_message="summary refused"))
    ctx = ContextSettings(title="off", summarize_after_tokens=200, keep_recent_messages=1)
    async with _harness(fake, tmp_path, ctx) as harness:
        await _turn(harness, "AARDVARK-1 " + "long story. " * 100, "m1")
        events = await _turn(harness, "and then?", "m2")
    assert events[-1] == Final("echo: and then?")
    assert "AARDVARK-1" in json.dumps(fake.requests[-1])


# ---- title --------------------------------------------------------------------------------------
async def test_title_is_generated_once_and_reported(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.add_rule(lambda text: "Write a title" in text, Reply(text='"Weekend in Lisbon."'))
    titles: list[tuple[str, str]] = []

    async def on_title(thread_id: str, title: str) -> None:
        titles.append((thread_id, title))

    ctx = ContextSettings(summarize_after_tokens=None)
    async with _harness(fake, tmp_path, ctx, on_title=on_title) as harness:
        events = await _turn(harness, "plan a weekend in Lisbon for two", "m1", thread="trip")
        await _turn(harness, "and a day trip?", "m2", thread="trip")
        graph = harness.require_graph()
        values = (await graph.aget_state({"configurable": {"thread_id": "trip"}})).values
    assert events[-1] == Final("echo: plan a weekend in Lisbon for two")  # the title is not the answer
    assert not any(isinstance(e, TextDelta) and "Lisbon." in e.text and "echo" not in e.text for e in events)
    assert titles == [("trip", "Weekend in Lisbon")]
    assert thread_title(values) == "Weekend in Lisbon"
    assert sum("Write a title" in last_user_text(r) for r in fake.requests) == 1


async def test_title_falls_back_to_the_first_message(fake: FakeOpenAI, tmp_path: Path) -> None:
    fake.add_rule(lambda text: "Write a title" in text, Reply(status=500))
    ctx = ContextSettings(summarize_after_tokens=None, title_max_chars=20)
    titles: list[str] = []

    async def on_title(thread_id: str, title: str) -> None:
        titles.append(title)

    async with _harness(fake, tmp_path, ctx, on_title=on_title) as harness:
        events = await _turn(harness, "please compare three laptops for me", "m1")
    assert isinstance(events[-1], Final)
    assert titles == ["please compare thre…"]


# ---- present_files ------------------------------------------------------------------------------
async def test_present_files_emits_virtual_paths_inside_outputs_only(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    root = tmp_path / "sandboxes"
    dirs = ThreadDirs.for_thread(root, "files", None)
    dirs.ensure()
    (dirs.outputs / "report.md").write_text("# Report\n")
    (dirs.workspace / "draft.md").write_text("draft")
    (dirs.outputs / "escape.txt").symlink_to("/etc/hostname")
    tool = build_present_files(
        outputs_resolver(lambda tid: HostFiles(PathMapper(ThreadDirs.for_thread(root, tid, None))))
    )
    graph = _graph(fake, tools=[tool])
    fake.script(
        Reply(
            tool_calls=[
                ToolCall(
                    "present_files",
                    {"paths": ["/mnt/user-data/outputs/report.md", "/mnt/user-data/workspace/draft.md"]},
                    id="p1",
                )
            ]
        ),
        Reply(
            tool_calls=[
                ToolCall(
                    "present_files",
                    {"paths": ["/mnt/user-data/outputs/escape.txt", "../outputs/../../x"]},
                    id="p2",
                )
            ]
        ),
        Reply(
            tool_calls=[
                ToolCall("present_files", {"paths": ["report.md"], "caption": "Your report"}, id="p3")
            ]
        ),
        Reply(text="Sent."),
    )
    events: list[AgentEvent] = []
    config = {"configurable": {"thread_id": "files"}}
    async for part in graph.astream(
        {"messages": [HumanMessage("send me the report")]}, config, stream_mode="custom"
    ):
        events.extend(events_from_custom(part))
    assert events == [FileOut("/mnt/user-data/outputs/report.md", "Your report")]
    results = _tool_messages(fake.requests[-1])
    assert "nothing was sent" in results["p1"] and "not inside /mnt/user-data/outputs/" in results["p1"]
    assert "nothing was sent" in results["p2"] and "symlink escape" in results["p2"]
    assert results["p3"].startswith("Sent to the chat: report.md (9 B)")


# ---- MCP ----------------------------------------------------------------------------------------
def _echo_server(**kw: Any) -> McpServer:
    return McpServer(
        transport="stdio", command=sys.executable, args=[str(FIXTURES / "mcp_echo_server.py")], **kw
    )


async def test_mcp_stdio_tools_run_in_a_turn_and_broken_servers_are_skipped(
    fake: FakeOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHITAL_TEST_DAEMON_SECRET", "do-not-leak")
    settings = McpSettings(
        servers={
            "echo": _echo_server(env={"ECHO_TOKEN": "tok-123456"}),
            "missing": McpServer(transport="stdio", command="/nonexistent/mcp-server"),
            "hangs": McpServer(
                transport="stdio",
                command=sys.executable,
                args=["-c", "import time; time.sleep(30)"],
                timeout=2,
            ),
            "off": _echo_server(enabled=False),
        }
    )
    tools = await load_mcp_tools(settings)
    assert sorted(t.name for t in tools) == ["add", "echo", "env_probe", "explode"]
    assert "'missing' failed to start" in caplog.text and "'hangs' did not start within 2s" in caplog.text
    assert "tok-123456" not in caplog.text
    fake.script(
        Reply(
            tool_calls=[
                ToolCall("echo", {"text": "hello"}, id="e1"),
                ToolCall("add", {"a": 2, "b": 40}, id="e2"),
                ToolCall("env_probe", {"name": "CHITAL_TEST_DAEMON_SECRET"}, id="e3"),
                ToolCall("env_probe", {"name": "ECHO_TOKEN"}, id="e4"),
                ToolCall("explode", {}, id="e5"),
            ]
        ),
        Reply(text="All done."),
    )
    async with _harness(fake, tmp_path, tools=tools, secrets=settings.secrets()) as harness:
        events = await _turn(harness, "use the echo server", "m1")
    assert events[-1] == Final("All done.")
    results = _tool_messages(fake.requests[-1])
    assert "echo: hello" in results["e1"] and "42" in results["e2"]
    assert "unset" in results["e3"]  # the daemon's environment does not reach MCP servers
    assert results["e4"] == "set"
    assert "exploded on purpose" in results["e5"] and "tok-123456" not in results["e5"]
    assert ("explode", "error") in [(e.name, e.phase) for e in events if isinstance(e, ToolProgress)]
