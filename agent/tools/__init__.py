"""Chital's non-sandbox tools: web fetch/search, file delivery, MCP servers, clarification.

The harness passes them as ``extra_tools`` (``ask_clarification`` comes with its middleware, see
``agent.context``) and turns their custom stream events into agent events with
:func:`events_from_custom`.
"""

from __future__ import annotations

from typing import Any

from agent.events import AgentEvent

from .clarify import (
    ASK_CLARIFICATION,
    CLARIFICATION_EVENT,
    ClarificationMiddleware,
    clarification_from_custom,
    is_clarification,
)
from .mcp import McpCatalog, McpServer, McpSettings, load_mcp_tools
from .mcp_middleware import McpToolsMiddleware
from .present import FILES_EVENT, OutputsResolver, build_present_files, files_from_custom, outputs_resolver
from .web import UrlRefused, WebSettings, build_web_tools

__all__ = [
    "ASK_CLARIFICATION",
    "CLARIFICATION_EVENT",
    "FILES_EVENT",
    "ClarificationMiddleware",
    "McpCatalog",
    "McpServer",
    "McpSettings",
    "McpToolsMiddleware",
    "OutputsResolver",
    "UrlRefused",
    "WebSettings",
    "build_present_files",
    "build_web_tools",
    "clarification_from_custom",
    "events_from_custom",
    "files_from_custom",
    "is_clarification",
    "load_mcp_tools",
    "outputs_resolver",
]


def events_from_custom(part: Any) -> list[AgentEvent]:
    """Agent events for one ``custom`` stream part of a run ([] for parts that are not ours).

    ``{"chital.files": [...], "caption": str}`` -> FileOut per file;
    ``{"chital.clarification": question}`` -> Clarification.
    """
    events: list[AgentEvent] = list(files_from_custom(part))
    clarification = clarification_from_custom(part)
    if clarification is not None:
        events.append(clarification)
    return events
