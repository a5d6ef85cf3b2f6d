"""What the tuning tests share: an agent on the fake model whose middleware records the LangSmith run
each model call ran in, and its answer. One home, so no test module imports another (and a fresh
interpreter can import it by name)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langsmith.run_helpers import get_current_run_tree

from agent import tuning
from agent.config import AgentSettings, ModelSpec
from agent.model import build_chat_model


class Watch(AgentMiddleware[Any, Any]):
    """Records, for every model call, the LangSmith run the hook ran in (None: no wrapper)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[str | None] = []

    def _seen(self) -> None:
        run = get_current_run_tree()
        self.runs.append(None if run is None else run.name)

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> ModelResponse:
        self._seen()
        return handler(request)

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> ModelResponse:
        self._seen()
        return await handler(request)


def agent_on(fake: Any) -> tuple[Any, Watch]:
    tuning.apply()
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key="sk-test")
    watch = Watch()
    return create_agent(build_chat_model(spec, AgentSettings()), [], middleware=[watch]), watch


def answer(result: dict[str, Any]) -> str:
    return str(result["messages"][-1].content)
