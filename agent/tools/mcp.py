"""MCP servers from config, as LangChain tools, behind one live catalog (:class:`McpCatalog`).

The interface other parts build on (the lead's tools middleware, ``/mcp``, a deferred
``tool_search``) is small on purpose:

- ``catalog.tools()``: the MCP tools callable right now (a fresh list; the objects stay the same
  until a server's tool list changes), each a ``StructuredTool`` whose ``metadata["mcp_server"]``
  names its server;
- ``catalog.servers()``: one :class:`~agent.mcp_view.McpServerView` per configured server;
- ``await catalog.reload(settings)``: apply a new ``agent.mcp`` section (servers added, removed,
  changed; unchanged connected servers are kept as they are);
- ``catalog.subscribe(callback)``: called with the new tool list whenever it changes (a reload, a
  server that came back).

Sessions stay stateless (``langchain-mcp-adapters``' default): each tool call opens a fresh session
(for stdio: starts the server process), so no process outlives a call. What the catalog adds is
state per server: a server whose transport fails (at start or in a call) is marked ``failed`` with
a reason in Chital's own words and retried in the background with exponential backoff; meanwhile
its tools answer at once with that reason, so the model gets a tool error, never a crashed or hung
turn. A server that refuses its credentials (HTTP 401/403) is not retried: it is reported once and
waits for an admin's ``/mcp reload``. So is an OAuth server whose authorization server refuses the
client or its grant, or that needs an operator's ``chital mcp login`` (agent/tools/mcp_oauth.py).

Untrusted input: tool names, descriptions and input schemas come from the server. They are
screened when listed (agent/tools/mcp_bounds.py): a name the model API would refuse, a schema over
``max_schema_chars`` and tools past ``max_tools_per_server`` are left out, descriptions are cut
(2,000 characters) with invisible characters removed; what was left out is logged and noted in
``/mcp``. Error texts of transports (which may quote URLs or headers) are never passed on: only the
exception's type or the HTTP status.

stdio servers get the MCP SDK's minimal environment (PATH, HOME, USER, SHELL, TERM, LOGNAME) plus
the ``env`` configured here, never the daemon's own environment, so chat tokens and model keys do
not reach them. HTTP responses are read through :mod:`agent.tools.mcp_http`, which stops reading
one past ``agent.mcp.max_response_bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool, ToolException

from agent.mcp_stdio_guard import TOO_LARGE
from agent.mcp_view import McpServerView, McpState
from agent.settings import McpServer, McpSettings
from agent.tools.mcp_bounds import bounded_description, cleaned_schema, screen
from agent.tools.mcp_http import (
    InvalidMessage,
    ResponseTooLarge,
    capped_client_factory,
    guarded,
    message_handler,
)

log = logging.getLogger(__name__)

BACKOFF_MAX = 300.0
LOGIN_POLL = 2.0
"""Seconds between looks at a logged-out server's token file (one ``stat``), so the tokens of a
``chital mcp login`` are used without a reload."""
"""Longest wait between two reconnection attempts, in seconds."""
_GUARD = Path(__file__).resolve().parent.parent / "mcp_stdio_guard.py"


def _oauth_error() -> Callable[[BaseException], tuple[str, bool] | None]:
    """agent.tools.mcp_oauth's classifier, imported when a failure is classified: that module
    pulls in the MCP SDK's OAuth client (PyJWT, cryptography), which a daemon without OAuth
    servers never needs at start (tests/test_import_slimming.py)."""
    from agent.tools.mcp_oauth import oauth_error

    return oauth_error


def _flatten(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [e for sub in exc.exceptions for e in _flatten(sub)]
    out = [exc]
    if exc.__cause__ is not None:
        out += _flatten(exc.__cause__)
    return out


def _brief_error(exc: BaseException) -> str:
    """Exception type names only (nested groups flattened): the text may carry URLs or tokens."""
    if isinstance(exc, BaseExceptionGroup):
        return ", ".join(dict.fromkeys(_brief_error(e) for e in exc.exceptions))
    return type(exc).__name__


def classify(exc: BaseException, limit: int = 0) -> tuple[str, bool]:
    """(reason in Chital's words, worth retrying). Never the exception's text: it may hold a URL
    with a token, a header, or whatever the server chose to say."""
    import httpx
    from mcp.shared.exceptions import McpError
    from mcp.types import CONNECTION_CLOSED

    found = _flatten(exc)
    oauth_error = _oauth_error()
    for e in found:
        if (oauth := oauth_error(e)) is not None:
            return oauth
        if isinstance(e, ResponseTooLarge):
            return str(e), True
        if isinstance(e, InvalidMessage):
            return f"sent a message that is not valid JSON-RPC ({e})", True
        if isinstance(e, McpError) and e.error.code == TOO_LARGE:
            return f"was larger than {limit:,} bytes (agent.mcp.max_response_bytes)", True
        if isinstance(e, McpError) and e.error.code == CONNECTION_CLOSED:
            return "the connection closed (the server exited?)", True
        if isinstance(e, httpx.HTTPStatusError):
            status = e.response.status_code
            if status in (401, 403):
                return f"credentials refused (HTTP {status}): check its token or headers", False
            return f"HTTP {status}", True
    for e in found:
        if isinstance(e, httpx.ConnectError | httpx.ConnectTimeout | ConnectionRefusedError):
            return f"cannot connect ({type(e).__name__})", True
        if isinstance(e, httpx.TransportError | ConnectionError | OSError):
            return f"connection lost ({type(e).__name__})", True
    return f"failed ({_brief_error(exc)})", True


@dataclass(eq=False)
class _Server:
    """A configured server and what the catalog knows of it."""

    name: str
    config: McpServer
    state: McpState = "connecting"
    reason: str = ""
    retryable: bool = True
    tools: list[BaseTool] = field(default_factory=list)
    failures: int = 0
    retry_at: float = 0.0
    task: asyncio.Task[None] | None = None
    auth: Any = None
    """The server's OAuth provider (an ``httpx.Auth`` holding its tokens), made on first connect."""
    notes: list[str] = field(default_factory=list)
    """What its last listing left out or cut (agent/tools/mcp_bounds.py), for ``/mcp``."""

    def view(self, tools: list[BaseTool]) -> McpServerView:
        return McpServerView(
            self.name,
            self.config.transport,
            self.state,
            self.reason,
            tuple(t.name for t in tools),
            tuple(self.notes),
        )


class McpCatalog:
    """The MCP tools of the configured servers, kept current (module docstring)."""

    def __init__(
        self,
        settings: McpSettings,
        *,
        reconnect: bool = True,
        token_dir: Path | None = None,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        """``reconnect``: retry failed servers in the background (off for one-shot loading);
        ``token_dir``: where OAuth tokens are kept (0600 files; None: in memory only);
        ``redact``: masks the daemon's secrets in the tools' descriptions and schemas (they go to
        the model provider with every request that binds the tool)."""
        self.settings = settings
        self._redact = redact or (lambda text: text)
        self._token_dir = token_dir
        self._reconnect = reconnect
        self._servers: dict[str, _Server] = {}
        self._tools: list[BaseTool] = []
        self._owner: dict[str, _Server] = {}
        """Which server each tool of :attr:`_tools` belongs to."""
        self._lock = asyncio.Lock()
        self._subscribers: list[Callable[[list[BaseTool]], None]] = []
        self._closed = False

    # -- the interface --------------------------------------------------------------------------
    def tools(self) -> list[BaseTool]:
        """The MCP tools callable now (a failed server's last known tools answer with its reason)."""
        return list(self._tools)

    def servers(self) -> list[McpServerView]:
        """Every configured server, in config order, with the tools it contributes now."""
        return [
            s.view([t for t in self._tools if self._owner.get(t.name) is s]) for s in self._servers.values()
        ]

    def subscribe(self, callback: Callable[[list[BaseTool]], None]) -> None:
        """Call ``callback(tools)`` after every change of the tool list."""
        self._subscribers.append(callback)

    async def start(self) -> None:
        """Connect to every enabled server (concurrently, each within its ``timeout``)."""
        await self.reload(self.settings)

    async def reload(self, settings: McpSettings) -> list[McpServerView]:
        """Apply ``settings``: servers whose config is unchanged and that are connected are kept;
        the others are (re)connected; removed ones are dropped (their tools answer that they are
        gone). Returns the servers as :meth:`servers` then sees them."""
        async with self._lock:
            same_naming = settings.tool_name_prefix == self.settings.tool_name_prefix
            old, new = self._servers, {}
            fresh: list[_Server] = []
            for name, config in settings.servers.items():
                prev = old.get(name)
                if prev is not None and same_naming and prev.config == config and prev.state == "connected":
                    new[name] = prev
                    continue
                server = _Server(name, config, state="connecting" if config.enabled else "disabled")
                new[name] = server
                if config.enabled:
                    fresh.append(server)
            for name, prev in old.items():
                if new.get(name) is not prev:
                    _cancel(prev)
            self.settings, self._servers = settings, new
            await asyncio.gather(*(self._connect(s) for s in fresh))
            self._rebuild()
            return self.servers()

    async def close(self) -> None:
        """Stop the background reconnections."""
        self._closed = True
        for server in self._servers.values():
            _cancel(server)

    # -- connecting -----------------------------------------------------------------------------
    async def _list(self, server: _Server) -> list[BaseTool]:
        """The server's tools, listed over a fresh session, wrapped for :meth:`_call`."""
        from langchain_mcp_adapters.client import MultiServerMCPClient  # only when servers are configured

        connection = server.config.connection()
        connection["session_kwargs"] = {"message_handler": message_handler}
        limit = self.settings.max_response_bytes
        if server.config.transport == "stdio":  # through the line-bounding relay (its docstring)
            args = [str(limit), "--", connection["command"], *connection["args"]]
            connection["command"], connection["args"] = sys.executable, [str(_GUARD), *args]
        if server.config.transport != "stdio":
            connection["httpx_client_factory"] = capped_client_factory(limit)
        if server.config.oauth is not None:
            from agent.tools.mcp_oauth import LoginRequired, build_auth, has_tokens, storage_for

            if server.auth is None:
                storage = storage_for(server.name, server.config, self._token_dir)
                if server.config.oauth.grant == "authorization_code" and not await has_tokens(storage):
                    raise LoginRequired(server.name)  # never logged in: nothing to ask a server
                server.auth = build_auth(server.name, server.config, storage)
            connection["auth"] = server.auth
        connections: dict[str, Any] = {server.name: connection}
        client = MultiServerMCPClient(connections, tool_name_prefix=self.settings.tool_name_prefix)
        raw = await guarded(lambda: client.get_tools(server_name=server.name), limit=server.config.timeout)
        kept, server.notes = screen(server.name, raw, self.settings)  # bounds: agent/tools/mcp_bounds.py
        return [self._wrap(server, tool) for tool in kept]

    async def _connect(self, server: _Server) -> None:
        try:
            server.tools = await self._list(server)
        except TimeoutError:
            log.warning(
                "MCP server %r did not start within %gs; its tools are skipped",
                server.name,
                server.config.timeout,
            )
            self._failed(server, f"did not start within {server.config.timeout:g}s", True, quiet=True)
            return
        except Exception as exc:
            reason, retryable = classify(exc)
            log.warning("MCP server %r failed to start (%s); its tools are skipped", server.name, reason)
            self._failed(server, reason, retryable, quiet=True)
            return
        server.state, server.reason, server.failures = "connected", "", 0
        log.info("MCP server %r: %d tool(s)", server.name, len(server.tools))

    def _failed(
        self, server: _Server, reason: str, retryable: bool, *, quiet: bool = False, schedule: bool = True
    ) -> None:
        """Mark ``server`` failed and schedule its reconnection (with backoff) when worth it."""
        if server.state != "failed" and not quiet:
            log.warning("MCP server %r failed: %s", server.name, reason)
        server.state, server.reason, server.retryable = "failed", reason, retryable
        server.failures += 1
        delay = min(BACKOFF_MAX, self.settings.reconnect_backoff * 2 ** (server.failures - 1))
        server.retry_at = asyncio.get_running_loop().time() + delay
        running = server.task is not None and not server.task.done()
        if schedule and retryable and self._reconnect and not self._closed and not running:
            server.task = asyncio.create_task(
                self._reconnect_loop(server), name=f"mcp-reconnect-{server.name}"
            )
        elif not retryable and self._reconnect and not self._closed and not running:
            if (tokens := self._login_file(server)) is not None:
                server.task = asyncio.create_task(
                    self._login_watch(server, tokens), name=f"mcp-login-{server.name}"
                )

    def _login_file(self, server: _Server) -> Path | None:
        """The token file an operator's ``chital mcp login`` writes for ``server``, when the
        server logs in that way and the catalog keeps tokens on disk."""
        oauth = server.config.oauth
        if oauth is None or oauth.grant != "authorization_code" or self._token_dir is None:
            return None
        from agent.tools.mcp_oauth import token_path

        return token_path(self._token_dir, server.name, server.config)

    async def _login_watch(self, server: _Server, tokens: Path) -> None:
        """Wait for new tokens (the file changes) for a server that needs a login, then connect
        with them. Nothing is asked of any server meanwhile: a refused login is never retried,
        only a new one is used."""
        seen = _stamp(tokens)
        while self._servers.get(server.name) is server and server.state == "failed" and not server.retryable:
            await asyncio.sleep(LOGIN_POLL)
            now = _stamp(tokens)
            if now == seen or now is None:
                continue
            seen = now
            server.auth = None  # a fresh provider reads the new tokens
            tools = await self._try_list(server)
            if isinstance(tools, tuple):
                reason, retryable = tools
                log.warning("MCP server %r: the new login did not work (%s)", server.name, reason)
                server.state, server.reason, server.retryable = "failed", reason, retryable
                continue
            self._back(server, tools, "logged in")
            return

    async def _try_list(self, server: _Server) -> list[BaseTool] | tuple[str, bool]:
        """The server's tools, or (reason, worth retrying) when listing them failed."""
        try:
            return await self._list(server)
        except Exception as exc:
            return classify(exc) if not isinstance(exc, TimeoutError) else ("no answer", True)

    def _back(self, server: _Server, tools: list[BaseTool], how: str) -> None:
        """``server`` answers again with ``tools`` (unless it was reconfigured meanwhile)."""
        if self._servers.get(server.name) is not server:
            return
        server.tools, server.state, server.reason, server.failures = tools, "connected", "", 0
        log.info("MCP server %r: %s, %d tool(s)", server.name, how, len(tools))
        self._rebuild()

    async def _reconnect_loop(self, server: _Server) -> None:
        loop = asyncio.get_running_loop()
        while self._servers.get(server.name) is server and server.state == "failed" and server.retryable:
            await asyncio.sleep(max(0.0, server.retry_at - loop.time()))
            tools = await self._try_list(server)
            if isinstance(tools, tuple):
                reason, retryable = tools
                log.debug("MCP server %r: reconnection failed (%s)", server.name, reason)
                self._failed(server, reason, retryable, quiet=True, schedule=False)
                continue
            self._back(server, tools, "is back")
            return
        if self._servers.get(server.name) is server and server.state == "failed" and not server.retryable:
            if (tokens := self._login_file(server)) is not None:  # refused while reconnecting
                await self._login_watch(server, tokens)

    def _rebuild(self) -> None:
        tools: list[BaseTool] = []
        owner: dict[str, _Server] = {}
        for server in self._servers.values():
            if server.state == "disabled":
                continue
            for tool in server.tools:
                if tool.name in owner:
                    log.warning("MCP server %r: tool %r is already defined; skipped", server.name, tool.name)
                    continue
                owner[tool.name] = server
                tools.append(tool)
        changed = [t.name for t in tools] != [t.name for t in self._tools] or any(
            a is not b for a, b in zip(tools, self._tools, strict=False)
        )
        self._tools, self._owner = tools, owner
        if changed:
            for callback in self._subscribers:
                callback(list(tools))

    # -- calling --------------------------------------------------------------------------------
    def _wrap(self, server: _Server, tool: BaseTool) -> BaseTool:
        """``tool`` (the adapter's) behind :meth:`_call`, with its description bounded."""
        inner = getattr(tool, "coroutine", None)
        assert inner is not None, "langchain-mcp-adapters tools are async"

        async def call(**arguments: Any) -> Any:
            return await self._call(server, tool.name, inner, arguments)

        schema = tool.args_schema
        return StructuredTool(
            name=tool.name,
            description=self._redact(bounded_description(tool.description or "")),
            args_schema=cleaned_schema(schema, self._redact) if isinstance(schema, dict) else schema,
            coroutine=call,
            response_format=tool.response_format,
            metadata={**(tool.metadata or {}), "mcp_server": server.name},
        )

    async def _call(
        self, server: _Server, tool: str, inner: Callable[..., Awaitable[Any]], arguments: dict[str, Any]
    ) -> Any:
        """One tool call: refused at once while the server is down, bounded in time, and any
        transport failure turned into a :class:`ToolException` naming the server."""
        name = server.name
        if self._servers.get(name) is not server:
            raise ToolException(
                f"MCP server {name!r} was reconfigured or removed; its tool {tool!r} is gone."
            )
        if server.state == "failed":
            if not server.retryable:
                raise ToolException(
                    f"MCP server {name!r} is unavailable: {server.reason}. An admin must fix its "
                    "configuration and run /mcp reload."
                )
            wait = server.retry_at - asyncio.get_running_loop().time()
            if wait > 0 or (server.task is not None and not server.task.done()):
                raise ToolException(
                    f"MCP server {name!r} is unavailable ({server.reason}); Chital is reconnecting "
                    f"(next try in about {max(wait, 0):.0f}s). Go on without it or try later."
                )
        timeout = server.config.call_timeout
        try:
            return await guarded(lambda: inner(**arguments), limit=timeout)
        except TimeoutError:
            raise ToolException(f"MCP server {name!r} did not answer {tool!r} within {timeout:g}s.") from None
        except ToolException:
            raise
        except Exception as exc:
            reason, retryable = classify(exc, self.settings.max_response_bytes)
            if _too_large(exc):
                raise ToolException(
                    f"MCP server {name!r}: the result of {tool!r} {reason}; nothing was kept."
                ) from None
            if _is_protocol_error(exc):
                raise ToolException(f"MCP server {name!r} answered {tool!r} badly: {reason}.") from None
            self._failed(server, reason, retryable)
            raise ToolException(f"MCP server {name!r} failed during {tool!r}: {reason}.") from None


def _stamp(path: Path) -> tuple[int, int] | None:
    """What tells a rewritten file from the one seen before: (mtime ns, size); None if absent."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _too_large(exc: BaseException) -> bool:
    from mcp.shared.exceptions import McpError

    return any(
        isinstance(e, ResponseTooLarge) or (isinstance(e, McpError) and e.error.code == TOO_LARGE)
        for e in _flatten(exc)
    )


def _is_protocol_error(exc: BaseException) -> bool:
    """The server is there but its answer is wrong (not a dead transport): not worth a reconnect."""
    from mcp.shared.exceptions import McpError
    from mcp.types import CONNECTION_CLOSED
    from pydantic import ValidationError

    found = _flatten(exc)
    if any(isinstance(e, OSError) for e in found):
        return False
    if any(isinstance(e, McpError) and e.error.code == CONNECTION_CLOSED for e in found):
        return False
    return any(isinstance(e, InvalidMessage | McpError | ValidationError | ValueError) for e in found)


def _cancel(server: _Server) -> None:
    if server.task is not None and not server.task.done():
        server.task.cancel()
    server.task = None


async def load_mcp_tools(settings: McpSettings) -> list[BaseTool]:
    """Tools of every enabled server, loaded once (no background reconnection); a server that
    fails to start or list is logged and skipped. Prefer :class:`McpCatalog`."""
    catalog = McpCatalog(settings, reconnect=False)
    await catalog.start()
    with contextlib.suppress(Exception):
        await catalog.close()
    return catalog.tools()
