"""Binds the MCP catalog's current tools to each model call and runs them: the tool set is live.

``create_agent`` fixes its tools when the graph is built, but a ``/mcp reload`` or a server that
comes back changes the MCP tools while the daemon runs. This middleware adds
:meth:`McpCatalog.tools` to every model request (``wrap_model_call``) and executes a call of one
of them (``wrap_tool_call``: LangChain's documented way to run tools the ``ToolNode`` was not
built with). A tool of the same name the agent was built with wins; a call of an MCP tool that
is gone since the model saw it gets the ``ToolNode``'s "not a valid tool" error.

A deferred ``tool_search`` may replace this by binding only the tools it found (it reads the same
``catalog.tools()``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest, ModelResponse, ToolCallRequest
from langchain_core.messages import ToolMessage
from langgraph.types import Command

from agent.tools.mcp import McpCatalog


class McpToolsMiddleware(AgentMiddleware[Any, Any, Any]):
    """The catalog's tools on every model call of the agent it is part of."""

    def __init__(self, catalog: McpCatalog) -> None:
        super().__init__()
        self.catalog = catalog

    def _with_tools(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        have = {getattr(t, "name", None) for t in request.tools}
        extra = [t for t in self.catalog.tools() if t.name not in have]
        return request.override(tools=[*request.tools, *extra]) if extra else request

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelResponse[Any]:
        return handler(self._with_tools(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await handler(self._with_tools(request))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        if request.tool is None:
            name = request.tool_call["name"]
            tool = next((t for t in self.catalog.tools() if t.name == name), None)
            if tool is not None:
                request = request.override(tool=tool)
        return await handler(request)
