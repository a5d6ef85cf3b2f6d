"""What the model sees of an MCP catalog, for the MCP tests (test_mcp, test_mcp_oauth, ...).

One definition of "call a catalog tool as the agent would" and "a server's state", so the tests
of transports, OAuth and reloads assert on the same view (docs/design.md "Test fixtures").
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool, ToolException

from agent.tools.mcp import McpCatalog


def tool(c: McpCatalog, name: str) -> BaseTool:
    return next(t for t in c.tools() if t.name == name)


async def call(c: McpCatalog, name: str, args: dict[str, Any] | None = None) -> str:
    """What the model gets: the text of the tool's result (``ERROR: `` and a ToolException's text
    on failure)."""
    try:
        out = await tool(c, name).ainvoke({"type": "tool_call", "id": "c1", "name": name, "args": args or {}})
    except ToolException as exc:
        return f"ERROR: {exc}"
    content = out.content
    if isinstance(content, list):
        return "".join(b["text"] if isinstance(b, dict) else str(b) for b in content)
    return str(content)


def state(c: McpCatalog, name: str) -> tuple[str, str]:
    """A server's state and reason, as ``/mcp`` shows them."""
    view = next(v for v in c.servers() if v.name == name)
    return view.state, view.reason
