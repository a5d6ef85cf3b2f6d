"""The HTTP client of MCP's HTTP transports (streamable HTTP, SSE), with its reading bounded.

The MCP SDK reads a server's answer into memory before it becomes a tool result: a server that
answers with 50 MB would cost 50 MB (and more, as JSON and as text) before
:class:`agent.tool_output.ToolOutputCap` cuts what reaches the model. This client counts the bytes
of every response body as they arrive and stops reading one past ``max_bytes`` with
:class:`ResponseTooLarge`, which the catalog turns into a tool error naming the server.

Everything else is the SDK's own client (``mcp.shared._httpx_utils.create_mcp_http_client``'s
timeouts, no redirects followed by httpx itself).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

MCP_TIMEOUT = 30.0
"""Connect, write and pool timeout (the SDK's)."""
MCP_READ_TIMEOUT = 300.0
"""Read timeout (the SDK's: a server may hold a response stream open)."""


class ResponseTooLarge(Exception):
    """A response body went past the configured limit; reading stopped there."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"was larger than {limit:,} bytes (agent.mcp.max_response_bytes)")
        self.limit = limit


class _CappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise ResponseTooLarge(self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _CappedTransport(httpx.AsyncBaseTransport):
    def __init__(self, limit: int) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
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
