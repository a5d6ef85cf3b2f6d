"""A middleware that only rewrites the model request: one ``apply`` serves the sync and async paths.

LangChain v1's ``AgentMiddleware`` needs both ``wrap_model_call`` and ``awrap_model_call`` for a
middleware to run under ``invoke`` and ``ainvoke``; every request rewriter here (the turn's model and
persona, the skills listing) would otherwise repeat the same two methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.messages import AIMessage


class RequestRewriter(AgentMiddleware[Any, Any, Any]):
    """Subclasses implement :meth:`apply`; the request it returns goes to the model."""

    def apply(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        raise NotImplementedError

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        return handler(self.apply(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        return await handler(self.apply(request))
