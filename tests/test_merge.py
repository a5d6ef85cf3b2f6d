"""agent/merge.py: adjacent wrap_model_call middleware run as one layer, with the same effect.

The model is langchain-openai against the fake OpenAI server; what is asserted is the request the
model received (system prompt order, tools) and the state the graph kept (a member's command).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NotRequired

from langchain.agents import create_agent
from langchain.agents.middleware import AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import AgentMiddleware, ExtendedModelResponse
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from agent.config import AgentSettings, ModelSpec
from agent.merge import ModelCallGroup, merge_model_calls
from agent.model import build_chat_model
from agent.safety import ToolErrors
from tests.fakes.openai_server import FakeOpenAI


class _Append(AgentMiddleware[Any, Any, Any]):
    """Appends its label to the system prompt; records the response text it saw."""

    def __init__(self, label: str, seen: list[str]) -> None:
        super().__init__()
        self.label, self.seen = label, seen

    @property
    def name(self) -> str:
        return f"Append{self.label}"

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> Any:
        base = request.system_message.text if request.system_message is not None else ""
        response = await handler(request.override(system_message=SystemMessage(f"{base}[{self.label}]")))
        self.seen.append(f"{self.label}:{response.result[-1].text}")
        return response


class _NoteState(AgentState[Any]):
    note: NotRequired[str]


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return q


class _Noting(AgentMiddleware[Any, Any, Any]):
    """Has a tool and a state key, and writes the key through a command."""

    state_schema = _NoteState

    def __init__(self) -> None:
        super().__init__()
        self.tools = [lookup]

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> Any:
        response = await handler(request)
        return ExtendedModelResponse(model_response=response, command=Command(update={"note": "noted"}))


def test_runs_of_model_call_middleware_become_one_layer_and_boundaries_stay() -> None:
    seen: list[str] = []
    a, b, c, d = (_Append(x, seen) for x in "abcd")
    noting, errors = _Noting(), ToolErrors([], 500)

    class _Boundary(_Append):  # a tool-call hook: not merged, ends the run
        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            return await handler(request)

    boundary = _Boundary("x", seen)
    out = merge_model_calls([a, noting, errors, b, boundary, c, d])
    group = out[0]
    assert isinstance(group, ModelCallGroup) and group.members == [a, noting, b]
    carrier = out[1]
    assert carrier.name == "_Noting" and carrier.tools == [lookup] and carrier.state_schema is _NoteState
    assert out[2:4] == [errors, boundary]
    second = out[4]
    assert isinstance(second, ModelCallGroup) and second.members == [c, d]
    assert len({m.name for m in out}) == len(out)  # create_agent requires unique names
    assert merge_model_calls([a]) == [a]


async def test_a_group_calls_the_model_as_the_separate_middleware_did(fake: FakeOpenAI) -> None:
    settings = AgentSettings(model_retries=0)
    model = build_chat_model(ModelSpec(base_url=fake.base_url, api_key="k", model="m"), settings)
    results = []
    for merge in (False, True):
        seen: list[str] = []
        stack: list[AgentMiddleware[Any, Any, Any]] = [_Append("a", seen), _Noting(), _Append("b", seen)]
        graph = create_agent(
            model,
            [],
            system_prompt="base",
            middleware=merge_model_calls(stack) if merge else stack,
            checkpointer=InMemorySaver(),
        )
        before = len(fake.requests)
        state = await graph.ainvoke(
            {"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": f"t{merge}"}}
        )
        (request,) = fake.requests[before:]
        system = request["messages"][0]["content"]
        tools = [t["function"]["name"] for t in request.get("tools", ())]
        results.append((system, tools, state.get("note"), state["messages"][-1].text, seen))
    assert results[0] == results[1]
    system, tools, note, answer, seen = results[1]
    assert "base[a][b]" in str(system) and tools == ["lookup"] and note == "noted"
    assert answer == "echo: hi" and seen == ["b:echo: hi", "a:echo: hi"]
