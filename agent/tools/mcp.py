"""MCP servers from config, as LangChain tools, through ``langchain-mcp-adapters``.

``MultiServerMCPClient`` is stateless by default and we keep it so: each tool call opens a fresh
session (for stdio: starts the server process), so a crashed or restarted server heals by itself
and no process outlives the call. The cost is a process start per call for stdio servers; a
server that is slow to start is better run as ``streamable_http``.

stdio servers get the MCP SDK's minimal environment (PATH, HOME, USER, SHELL, TERM, LOGNAME) plus
the ``env`` configured here, never the daemon's own environment, so chat tokens and model keys do
not reach them.
"""

from __future__ import annotations

import asyncio
import logging

from langchain_core.tools import BaseTool

from agent.settings import McpServer, McpSettings

log = logging.getLogger(__name__)


def _brief_error(exc: BaseException) -> str:
    """Exception type names only (nested groups flattened): the text may carry URLs or tokens."""
    if isinstance(exc, BaseExceptionGroup):
        return ", ".join(dict.fromkeys(_brief_error(e) for e in exc.exceptions))
    return type(exc).__name__


async def load_mcp_tools(settings: McpSettings) -> list[BaseTool]:
    """Tools of every enabled server; a server that fails to start or list is logged and skipped.

    Servers are loaded concurrently, each within its own ``timeout``. A tool whose name is
    already taken (by an earlier server) is skipped with a warning.
    """
    servers = {name: s for name, s in settings.servers.items() if s.enabled}
    if not servers:
        return []
    from langchain_mcp_adapters.client import MultiServerMCPClient  # only when servers are configured

    client = MultiServerMCPClient(
        {name: s.connection() for name, s in servers.items()},  # type: ignore[misc]
        tool_name_prefix=settings.tool_name_prefix,
    )

    async def one(name: str, server: McpServer) -> list[BaseTool]:
        try:
            return await asyncio.wait_for(client.get_tools(server_name=name), server.timeout)
        except TimeoutError:
            log.warning("MCP server %r did not start within %gs; its tools are skipped", name, server.timeout)
        except Exception as exc:
            log.warning("MCP server %r failed to start (%s); its tools are skipped", name, _brief_error(exc))
        return []

    loaded = await asyncio.gather(*(one(name, s) for name, s in servers.items()))
    tools: list[BaseTool] = []
    seen: set[str] = set()
    for name, server_tools in zip(servers, loaded, strict=True):
        for tool in server_tools:
            if tool.name in seen:
                log.warning("MCP server %r: tool %r is already defined; skipped", name, tool.name)
                continue
            seen.add(tool.name)
            tools.append(tool)
        if server_tools:
            log.info("MCP server %r: %d tool(s)", name, len(server_tools))
    return tools
