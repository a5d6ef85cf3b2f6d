"""A canary server: a real aiohttp server on the loopback addresses that counts every TCP connection
and request, so a web-fetch test can show a refused fetch never reached it."""

from __future__ import annotations

import asyncio

from aiohttp import web


class Canary:
    """A real aiohttp server on 127.0.0.1 (and on ::1, same port, where the host has IPv6
    loopback) counting TCP connections and requests: the daemon's /metrics, a model server or a
    platform API in miniature. A refused fetch must leave both counts at zero."""

    def __init__(self) -> None:
        self.port = 0
        self.connections = 0
        self.requests: list[str] = []
        self.v6 = False
        self._runner: web.AppRunner | None = None
        self._servers: list[asyncio.Server] = []

    async def start(self) -> Canary:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.hit)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        handler = self._runner.server
        assert handler is not None

        def protocol() -> asyncio.BaseProtocol:
            self.connections += 1
            return handler()

        loop = asyncio.get_running_loop()
        v4 = await loop.create_server(protocol, "127.0.0.1", 0)
        self._servers.append(v4)
        self.port = int(v4.sockets[0].getsockname()[1])
        try:
            self._servers.append(await loop.create_server(protocol, "::1", self.port))
            self.v6 = True
        except OSError:
            pass
        return self

    @property
    def hits(self) -> int:
        return self.connections + len(self.requests)

    async def hit(self, request: web.Request) -> web.Response:
        self.requests.append(str(request.rel_url))
        return web.Response(text="chital_secret_metric 42\n", content_type="text/plain")

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        if self._runner is not None:
            await self._runner.cleanup()
