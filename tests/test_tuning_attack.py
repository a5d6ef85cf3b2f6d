"""Attacks on agent/tuning.py's hook bypass: wherever LangSmith's own wrapper (tracing off) and the
bypass could be told apart by a hook or its caller, the bypass must behave as the wrapper does."""

from __future__ import annotations

import asyncio
import contextvars
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langsmith import Client
from langsmith.run_helpers import get_current_run_tree, trace, tracing_context

from agent import tuning
from agent.config import AgentSettings, ModelSpec
from agent.model import build_chat_model
from tests.fakes.openai_server import FakeOpenAI
from tests.tuning_support import agent_on, answer

MARK: contextvars.ContextVar[str] = contextvars.ContextVar("MARK", default="unset")


async def test_a_disabled_branch_inside_a_traced_run_is_handled_as_langsmith_does(
    fake: FakeOpenAI,
    langsmith: tuple[str, list[bytes]],
) -> None:
    """``tracing_context(enabled=False)`` under a live run: LangSmith's wrapper still opens the
    hook's own (unposted) child run, so the hook never sees the outer run as its current one."""
    url, posts = langsmith
    client = Client(api_url=url, api_key="ls-test")
    graph, watch = agent_on(fake)
    with tracing_context(enabled=True, client=client), trace("outer", client=client):
        with tracing_context(enabled=False):
            result = await graph.ainvoke({"messages": [{"role": "user", "content": "off"}]})
    client.flush()
    assert answer(result) == "echo: off"
    assert watch.runs == ["Watch.awrap_model_call"]
    assert not any(b"Watch.awrap_model_call" in body for body in posts)  # disabled: not uploaded


class Inner(AgentMiddleware[Any, Any]):
    """Sets a context variable inside its hook and leaves it set."""

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse:
        MARK.set("inner")
        return handler(request)


class Outer(AgentMiddleware[Any, Any]):
    """Records what the inner hook's context variable reads after the inner hook returned."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse:
        response = handler(request)
        self.seen.append(MARK.get())
        return response


async def test_a_sync_hook_runs_in_its_own_context_copy(fake: FakeOpenAI) -> None:
    """LangSmith's sync wrapper runs the hook in a copied context: what a hook sets in a context
    variable is gone when it returns, for the middleware around it too."""
    tuning.apply()
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key="sk-test")
    outer = Outer()
    graph: Any = create_agent(build_chat_model(spec, AgentSettings()), [], middleware=[outer, Inner()])
    result = await asyncio.to_thread(graph.invoke, {"messages": [{"role": "user", "content": "cv"}]})
    assert answer(result) == "echo: cv"
    assert outer.seen == ["unset"]


class Broken(AgentMiddleware[Any, Any]):
    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise RuntimeError("hook failed") from exc

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        return self.wrap_model_call(request, handler)  # type: ignore[arg-type]


async def test_a_failing_hook_raises_as_under_langsmith(fake: FakeOpenAI) -> None:
    """Same exception, same cause, and no extra frame of ours in the traceback (LangSmith trims its
    wrapper's frame from it)."""
    tuning.apply()
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key="sk-test")
    graph: Any = create_agent(build_chat_model(spec, AgentSettings()), [], middleware=[Broken()])
    inp: Any = {"messages": [{"role": "user", "content": "boom"}]}
    for run in (lambda: graph.ainvoke(inp), lambda: asyncio.to_thread(graph.invoke, inp)):
        try:
            await run()
        except RuntimeError as exc:
            assert str(exc) == "hook failed"
            assert isinstance(exc.__cause__, KeyError)
            files = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
            assert not [f for f in files if f.endswith(("tuning.py", "run_helpers.py"))], files
        else:
            raise AssertionError("the hook's error was lost")


class AsksForItsRun(AgentMiddleware[Any, Any]):
    """A hook with a ``run_tree`` parameter: LangSmith's wrapper passes it (None while off)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[Any] = []

    async def awrap_model_call(  # type: ignore[override]
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
        run_tree: Any,
    ) -> ModelResponse:
        self.runs.append(run_tree)
        return await handler(request)


async def test_a_hook_that_asks_for_its_run_gets_it(fake: FakeOpenAI) -> None:
    tuning.apply()
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key="sk-test")
    asks = AsksForItsRun()
    graph: Any = create_agent(build_chat_model(spec, AgentSettings()), [], middleware=[asks])
    result = await graph.ainvoke({"messages": [{"role": "user", "content": "rt"}]})
    assert answer(result) == "echo: rt"
    assert asks.runs == [None]


async def test_traceable_forced_on_traces_with_tracing_off(
    langsmith: tuple[str, list[bytes]],
) -> None:
    """``traceable(enabled=True)`` traces whatever the context says (the factory's ``traceable``
    is LangSmith's to anyone who passes it that)."""
    from langchain.agents import factory

    tuning.apply()
    url, posts = langsmith
    client = Client(api_url=url, api_key="ls-test")

    async def hook(request: Any, handler: Any) -> str | None:
        run = get_current_run_tree()
        return None if run is None else run.name

    forced = factory.traceable(name="forced_hook", enabled=True, client=client)(hook)
    assert await forced(None, None) == "forced_hook"
    client.flush()
    assert any(b"forced_hook" in body for body in posts)
