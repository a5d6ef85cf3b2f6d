"""The HTTP client of MCP's HTTP transports (streamable HTTP, SSE), with its reading bounded, and
the fault box that makes a broken transport end the call instead of hanging it.

The MCP SDK reads a server's answer into memory before it becomes a tool result: a server that
answers with 50 MB would cost 50 MB (and more, as JSON and as text) before
:class:`agent.tool_output.ToolOutputCap` cuts what reaches the model. This client counts the bytes
of every response body as they arrive and stops reading one past ``max_bytes`` with
:class:`ResponseTooLarge`, which the catalog turns into a tool error naming the server.

The MCP SDK (1.30) swallows some transport failures: an SSE response stream that breaks (the
server died mid-call), a POST that cannot connect, a line on stdout that is not JSON-RPC are
logged or handed to the session's message handler, and the request then waits for an answer that
never comes. :func:`guarded` runs one MCP operation with a :class:`Fault` in a context variable
(inherited by the SDK's tasks); this client and :func:`message_handler` report such failures into
it, and the operation ends at once with that exception.

Everything else is the SDK's own client (``mcp.shared._httpx_utils.create_mcp_http_client``'s
timeouts, no redirects followed by httpx itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

MCP_TIMEOUT = 30.0
"""Connect, write and pool timeout (the SDK's)."""
MCP_READ_TIMEOUT = 300.0
"""Read timeout (the SDK's: a server may hold a response stream open)."""


class ResponseTooLarge(Exception):
    """A response body went past the configured limit; reading stopped there."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"was larger than {limit:,} bytes (agent.mcp.max_response_bytes)")
        self.limit = limit


class InvalidMessage(Exception):
    """The server sent something that is not a valid JSON-RPC message of MCP."""


class Fault:
    """The first transport failure of one MCP operation."""

    def __init__(self) -> None:
        self.exc: BaseException | None = None
        self.event = asyncio.Event()

    def set(self, exc: BaseException) -> None:
        if self.exc is None:
            self.exc = exc
            self.event.set()


_FAULT: ContextVar[Fault | None] = ContextVar("chital_mcp_fault", default=None)


def report(exc: BaseException) -> None:
    """Record ``exc`` as the failure of the MCP operation running in this context (if any)."""
    fault = _FAULT.get()
    if fault is not None:
        fault.set(exc)


async def message_handler(message: Any) -> None:
    """The ``ClientSession``'s message handler: the SDK hands it what it could not parse or send."""
    from mcp.client.auth import OAuthFlowError

    if isinstance(message, httpx.TransportError | OSError | ResponseTooLarge | OAuthFlowError):
        report(message)  # an OAuth failure keeps its type: the catalog does not retry a refused grant
    elif isinstance(message, Exception):
        report(InvalidMessage(type(message).__name__))


async def guarded(make: Callable[[], Awaitable[T]], *, limit: float) -> T:
    """``await make()`` within ``limit`` seconds (TimeoutError), ended early by a reported fault (raised)."""
    fault = Fault()
    token = _FAULT.set(fault)
    try:
        task = asyncio.ensure_future(make())  # copies the context: the SDK's tasks see the fault
    finally:
        _FAULT.reset(token)
    waiter = asyncio.ensure_future(fault.event.wait())
    try:
        done, _ = await asyncio.wait({task, waiter}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # not ``await task`` under a suppress: our own cancel goes on
            if not task.cancelled():
                task.exception()  # retrieved: a call given up on has no result to report
    if task in done:
        return task.result()
    if fault.exc is not None:
        raise fault.exc
    raise TimeoutError


class _CappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        try:
            async for chunk in self._inner:
                seen += len(chunk)
                if seen > self._limit:
                    raise ResponseTooLarge(self._limit)
                yield chunk
        except (ResponseTooLarge, httpx.TransportError) as exc:
            report(exc)
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedTransport(httpx.AsyncBaseTransport):
    def __init__(self, limit: int) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.TransportError as exc:
            report(exc)
            raise
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        response.stream = _CappedStream(stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def capped_client_factory(max_bytes: int) -> Any:
    """An ``McpHttpClientFactory`` whose clients stop reading a response past ``max_bytes``."""

    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        auth: httpx.Auth | None = None,
    ) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers=headers,
            timeout=timeout or httpx.Timeout(MCP_TIMEOUT, read=MCP_READ_TIMEOUT),
            auth=auth,
            transport=_CappedTransport(max_bytes),
        )

    return factory
