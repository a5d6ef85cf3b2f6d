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
from typing import Any, Literal

from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

log = logging.getLogger(__name__)


class McpServer(BaseModel):
    """One MCP server: ``command``/``args``/``env`` for stdio, ``url``/``headers`` for HTTP."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["stdio", "streamable_http", "sse"] = "stdio"
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, SecretStr] | None = None
    """Extra environment of a stdio server (values may be secrets; ``${VAR}`` is expanded)."""
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, SecretStr] | None = None
    """HTTP headers (e.g. Authorization); kept as secrets, never logged."""
    timeout: float = Field(30.0, gt=0)
    """Seconds the server may take to start and list its tools."""
    enabled: bool = True

    @model_validator(mode="after")
    def _check(self) -> McpServer:
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio MCP server needs 'command'")
        if self.transport != "stdio" and not self.url:
            raise ValueError(f"a {self.transport} MCP server needs 'url'")
        return self

    def connection(self) -> dict[str, Any]:
        """The adapter's connection dict (secrets revealed here only)."""
        if self.transport == "stdio":
            conn: dict[str, Any] = {"transport": "stdio", "command": self.command, "args": list(self.args)}
            if self.env is not None:
                conn["env"] = {k: v.get_secret_value() for k, v in self.env.items()}
            if self.cwd:
                conn["cwd"] = self.cwd
            return conn
        conn = {"transport": self.transport, "url": self.url}
        if self.headers:
            conn["headers"] = {k: v.get_secret_value() for k, v in self.headers.items()}
        return conn

    def secrets(self) -> list[str]:
        values = [*(self.env or {}).values(), *(self.headers or {}).values()]
        return [v.get_secret_value() for v in values if len(v.get_secret_value()) >= 6]


class McpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    servers: dict[str, McpServer] = Field(default_factory=dict)
    tool_name_prefix: bool = False
    """Name tools ``<server>_<tool>``: set it when two servers offer tools of the same name."""

    def secrets(self) -> list[str]:
        """Configured secret values, for redaction of tool error texts."""
        return [s for server in self.servers.values() for s in server.secrets()]


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
