"""agent/tuning.py's speed fixes keep LangChain's behaviour: a middleware hook runs without
LangSmith's wrapper only while tracing is off, and with it (its span, its run tree) when tracing is
on, whichever way it was turned on; the agent's answer is the same either way."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain_core.tracers.langchain import LangChainTracer
from langsmith import Client
from langsmith.run_helpers import trace, tracing_context

from agent import tuning
from tests.daemon import env_without
from tests.fakes.openai_server import FakeOpenAI
from tests.fresh_python import run_python
from tests.tuning_support import agent_on, answer


async def test_hook_runs_without_langsmith_while_tracing_is_off(fake: FakeOpenAI) -> None:
    graph, watch = agent_on(fake)
    result = await graph.ainvoke({"messages": [{"role": "user", "content": "hello"}]})
    assert answer(result) == "echo: hello"
    assert watch.runs == [None]


@pytest.mark.parametrize("how", ["context", "parent run", "tracer callback"])
async def test_hook_is_traced_when_tracing_is_on(
    fake: FakeOpenAI, langsmith: tuple[str, list[bytes]], how: str
) -> None:
    url, posts = langsmith
    client = Client(api_url=url, api_key="ls-test")
    graph, watch = agent_on(fake)
    inp = {"messages": [{"role": "user", "content": "hi"}]}
    if how == "context":
        with tracing_context(enabled=True, client=client):
            result = await graph.ainvoke(inp)
    elif how == "parent run":
        with tracing_context(enabled=True, client=client), trace("outer", client=client):
            with tracing_context(enabled=None):  # no override left: only the run tree says so
                result = await graph.ainvoke(inp)
    else:  # LangChain's tracer handed in as a callback, tracing otherwise off
        result = await graph.ainvoke(inp, {"callbacks": [LangChainTracer(client=client)]})
    client.flush()
    assert answer(result) == "echo: hi"
    assert watch.runs == ["Watch.awrap_model_call"]
    assert any(b"Watch.awrap_model_call" in body for body in posts)


async def test_hook_is_traced_when_the_environment_turns_tracing_on(
    fake: FakeOpenAI, langsmith: tuple[str, list[bytes]]
) -> None:
    """LangSmith reads (and caches) its environment once: a fresh interpreter."""
    url, posts = langsmith
    out = await asyncio.to_thread(
        run_python,
        f"""
        import asyncio, json
        from tests.tuning_support import Watch, agent_on, answer
        from langsmith import Client

        class Remote:
            base_url = {fake.base_url!r}

        graph, watch = agent_on(Remote())
        result = asyncio.run(graph.ainvoke({{"messages": [{{"role": "user", "content": "env"}}]}}))
        Client().flush()
        print(json.dumps([answer(result), watch.runs]))
        """,
        timeout=120,
        env={
            **env_without(),
            "LANGSMITH_TRACING": "true",
            "LANGSMITH_ENDPOINT": url,
            "LANGSMITH_API_KEY": "ls-test",
        },
    )
    assert json.loads(out.splitlines()[-1]) == ["echo: env", ["Watch.awrap_model_call"]]
    assert any(b"Watch.awrap_model_call" in body for body in posts)


async def test_sync_hook_follows_the_same_rule(fake: FakeOpenAI, langsmith: tuple[str, list[bytes]]) -> None:
    url, _ = langsmith
    graph, watch = agent_on(fake)
    inp = {"messages": [{"role": "user", "content": "sync"}]}

    def traced() -> dict[str, Any]:
        client = Client(api_url=url, api_key="ls-test")
        with tracing_context(enabled=True, client=client):
            result = dict(graph.invoke(inp))
        client.flush()
        return result

    untraced = await asyncio.to_thread(graph.invoke, inp)
    assert answer(untraced) == "echo: sync"
    assert answer(await asyncio.to_thread(traced)) == "echo: sync"
    assert watch.runs == [None, "Watch.wrap_model_call"]


def test_applying_twice_wraps_once() -> None:
    from langchain.agents import factory

    tuning.apply()
    first = factory.traceable
    tuning._applied = False
    try:
        tuning.apply()
    finally:
        tuning._applied = True
    assert factory.traceable is first
