"""The part the fake push servers share (tests/fakes/bark_server.py, tests/fakes/ntfy_server.py): a
real aiohttp server on 127.0.0.1 that records every request and answers what a test scripted.

A script is a list of steps, one per request, taken in order; when it runs out the server answers
as the real service would. A step is ``("status", code, headers)`` (answer that), ``"drop"`` (read
the request, then close the connection without an answer: the client sees a reset) or ``"refuse"``
(the same, for every request until the script changes) or ``"stall"`` (read the request and
never answer: a server that hangs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")
Step = tuple[str, int, dict[str, str]] | str


@dataclass
class Recorded:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int | None = None
    """The status sent back (None: the connection was dropped)."""
    raw_headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class FakePushServer:
    """Start with :meth:`start`, stop with :meth:`stop`; ``base_url`` is what a config names."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.script: list[Step] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._changed = asyncio.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakePushServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        handler = self._runner.server
        assert handler is not None
        self._server = await asyncio.get_running_loop().create_server(handler, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        rec = Recorded(
            request.method,
            request.path,
            dict(request.headers),
            await request.read(),
            raw_headers=list(request.raw_headers),
        )
        self.requests.append(rec)
        self._poke()
        step: Step | None = self.script[0] if self.script else None
        if step is not None and step != "refuse":
            self.script.pop(0)
        if step in ("drop", "refuse"):
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(0)
            raise ConnectionResetError("dropped by the fake")
        if step == "stall":
            await asyncio.sleep(3600)  # cancelled when the client gives up or the server stops
        if isinstance(step, tuple):
            _, status, headers = step
            rec.answered = status
            return web.json_response({"code": status, "error": "scripted"}, status=status, headers=headers)
        response = self.answer(rec)
        rec.answered = response.status
        self._poke()
        return response

    def answer(self, rec: Recorded) -> web.Response:
        """What the real service answers to ``rec`` (each fake says)."""
        raise NotImplementedError

    def _poke(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], T], timeout: float = 20.0, what: str = "") -> T:
        """Wait until ``predicate()`` is truthy (re-checked on every request) and return it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._changed
            value = predicate()
            if value:
                return value
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {what or predicate}: {self.requests}")
            try:
                await asyncio.wait_for(changed.wait(), min(remaining, 0.5))
            except TimeoutError:
                pass


def json_of(rec: Recorded) -> dict[str, Any]:
    import json

    data = json.loads(rec.body or b"{}")
    assert isinstance(data, dict)
    return data
