"""A fake of the web search providers ``web_search`` speaks to, on 127.0.0.1: one aiohttp app with
each provider's wire shape under its own prefix, so a test points ``agent.web.base_url`` at
``{base}/<provider>`` and the real request builder and parser run against it.

- ``POST /duckduckgo/html/`` (form ``q``): DuckDuckGo's no-JavaScript results page, result links
  wrapped as ``//duckduckgo.com/l/?uddg=<url>`` and one ad, as the real page has them;
- ``GET /brave/res/v1/web/search`` (``X-Subscription-Token``): ``{"web": {"results": [...]}}``;
- ``GET /searxng/search?format=json``: ``{"results": [...]}``;
- ``POST /exa/search`` (``x-api-key``): ``{"results": [{title, url, text}]}``;
- ``POST /tavily/search`` (``Authorization: Bearer`` or ``api_key`` in the body):
  ``{"results": [{title, url, content}]}``;
- ``GET /jina/?q=`` (``Authorization: Bearer``): ``{"code": 200, "data": [...]}``;
- ``GET /page/<name>``: a result's page, for ``web_fetch``.

``mode`` makes every provider misbehave the same way: ``huge`` streams 50 MB (``sent`` counts what
left), ``huge_announced`` declares it in Content-Length, ``malformed`` answers a body of the right
content type that does not parse, ``status:<n>`` answers that HTTP status with the request's key
echoed in the body (a real provider's error page may), ``bot`` is DuckDuckGo's bot check,
``redirect`` sends a 302 to the metadata address, ``slow`` never answers, ``wrong_shape`` is valid
JSON of the wrong shape, ``drop`` cuts the connection mid-answer. ``results`` is what a
good answer lists; ``requests`` records every request (provider, headers, query, body);
``hold`` keeps every answer back until the test sets it.
"""

from __future__ import annotations

import asyncio
import html
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web

KEY = "search-test-key-7f3a9c"
"""The key every keyed provider accepts."""
HUGE = 50 * 1024 * 1024


@dataclass
class Result:
    title: str
    url: str
    snippet: str


@dataclass
class SearchRequest:
    provider: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class FakeSearch:
    """The fake providers (see the module doc). ``start()`` before use, ``stop()`` after."""

    mode: str = "ok"
    results: list[Result] = field(default_factory=list)
    requests: list[SearchRequest] = field(default_factory=list)
    pages: dict[str, str] = field(default_factory=dict)
    sent: int = 0
    """Bytes of a ``huge`` answer written before the client went away."""
    hold: asyncio.Event | None = None
    """When set to an event: every request is recorded, then waits for it before it is answered
    (so a test can have several searches in flight at once without relying on timing)."""
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, provider: str) -> str:
        """The ``base_url`` to configure for ``provider``."""
        return f"{self.base}/{provider}"

    async def start(self) -> FakeSearch:
        app = web.Application()
        app.router.add_post("/duckduckgo/html/", self._ddg)
        app.router.add_get("/brave/res/v1/web/search", self._brave)
        app.router.add_get("/searxng/search", self._searxng)
        app.router.add_post("/exa/search", self._exa)
        app.router.add_post("/tavily/search", self._tavily)
        app.router.add_get("/jina/", self._jina)
        app.router.add_get("/page/{name}", self._page)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        if not self.results:
            self.results = [
                Result(
                    "Llama - Wikipedia", f"{self.base}/page/llama", "The llama is a domesticated camelid."
                ),
                Result("Alpaca vs llama", "https://example.com/alpaca", "How to tell them apart."),
            ]
            self.pages["llama"] = (
                "<html><head><title>Llama page</title></head><body><h1>Llamas</h1>"
                "<p>Llamas hum when they are content.</p></body></html>"
            )
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- plumbing ------------------------------------------------------------------------------
    async def _record(self, request: web.Request, provider: str) -> SearchRequest:
        raw = await request.read()
        body: Any
        if request.content_type == "application/x-www-form-urlencoded":
            body = dict(await request.post())
        elif raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        else:
            body = None
        rec = SearchRequest(
            provider, request.method, request.path, dict(request.query), dict(request.headers), body
        )
        self.requests.append(rec)
        if self.hold is not None:
            await self.hold.wait()
        return rec

    async def _misbehave(
        self, request: web.Request, rec: SearchRequest, ctype: str
    ) -> web.StreamResponse | None:
        mode = self.mode
        if mode == "ok":
            return None
        if mode == "slow":
            await asyncio.sleep(3600)
        if mode.startswith("status:"):
            echo = json.dumps({"error": "nope", "echo": {"headers": rec.headers, "body": rec.body}})
            return web.Response(status=int(mode.split(":", 1)[1]), text=echo, content_type="application/json")
        if mode == "redirect":
            raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")
        if mode == "malformed":
            bad = "<html><body><p>Nothing like a result list here.</p></body></html>"
            return web.Response(text=bad if ctype == "text/html" else '{"results": [oops', content_type=ctype)
        if mode == "wrong_shape":
            if ctype == "text/html":
                return web.Response(text="<html><body>No list</body></html>", content_type=ctype)
            return web.json_response({"results": "none", "web": {"results": 7}, "data": {"x": 1}})
        if mode == "drop":  # the connection dies mid-answer
            resp = web.StreamResponse(headers={"Content-Type": ctype})
            resp.content_length = 10_000
            await resp.prepare(request)
            await resp.write(b'{"results": [')
            assert request.transport is not None
            request.transport.abort()
            return resp
        if mode == "bot":
            page = '<html><body><div class="anomaly-modal">Unfortunately, bots use DuckDuckGo too.</div></body></html>'
            return web.Response(status=200, text=page, content_type="text/html")
        if mode in ("huge", "huge_announced"):
            resp = web.StreamResponse(headers={"Content-Type": ctype})
            if mode == "huge_announced":
                resp.content_length = HUGE
            await resp.prepare(request)
            chunk = (b"<p>" if ctype == "text/html" else b" ") * 65536
            self.sent = 0
            try:
                while self.sent < HUGE:
                    await resp.write(chunk[: min(len(chunk), HUGE - self.sent)])
                    self.sent += min(len(chunk), HUGE - self.sent)
            except (ConnectionError, RuntimeError):
                pass
            return resp
        raise AssertionError(f"unknown mode {mode!r}")

    def _authorized(self, rec: SearchRequest, header: str, bearer: bool = False) -> bool:
        value = rec.headers.get(header, "")
        return value == (f"Bearer {KEY}" if bearer else KEY)

    @staticmethod
    def _denied() -> web.Response:
        return web.json_response({"error": "invalid api key"}, status=401)

    # ---- providers -----------------------------------------------------------------------------
    async def _ddg(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request, "duckduckgo")
        bad = await self._misbehave(request, rec, "text/html")
        if bad is not None:
            return bad
        items = [
            '<div class="result results_links result--ad"><h2 class="result__title">'
            '<a class="result__a" href="https://duckduckgo.com/y.js?ad_domain=ads.example">Sponsored thing</a>'
            '</h2><a class="result__snippet" href="#">An ad.</a></div>'
        ]
        for r in self.results:
            href = "//duckduckgo.com/l/?uddg=" + quote(r.url, safe="") + "&amp;rut=abc"
            items.append(
                '<div class="result results_links results_links_deep web-result">'
                '<div class="links_main links_deep result__body"><h2 class="result__title">'
                f'<a rel="nofollow" class="result__a" href="{href}">{html.escape(r.title)}</a></h2>'
                f'<a class="result__snippet" href="{href}">{html.escape(r.snippet)}</a></div></div>'
            )
        body = "".join(items) if self.results else '<div class="no-results">No results.</div>'
        page = f'<html><body><div id="links" class="results">{body}</div></body></html>'
        return web.Response(text=page, content_type="text/html")

    def _json(self, data: Any) -> web.Response:
        return web.json_response(data)

    async def _brave(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request, "brave")
        bad = await self._misbehave(request, rec, "application/json")
        if bad is not None:
            return bad
        if not self._authorized(rec, "X-Subscription-Token"):
            return self._denied()
        results = [
            {"title": r.title, "url": r.url, "description": f"<strong>{html.escape(r.snippet)}</strong>"}
            for r in self.results
        ]
        return self._json(
            {"type": "search", "query": {"original": rec.query.get("q")}, "web": {"results": results}}
        )

    async def _searxng(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request, "searxng")
        bad = await self._misbehave(request, rec, "application/json")
        if bad is not None:
            return bad
        results = [{"title": r.title, "url": r.url, "content": r.snippet} for r in self.results]
        return self._json({"query": rec.query.get("q"), "results": results})

    async def _exa(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request, "exa")
        bad = await self._misbehave(request, rec, "application/json")
        if bad is not None:
            return bad
        if not self._authorized(rec, "x-api-key"):
            return self._denied()
        results = [{"id": r.url, "title": r.title, "url": r.url, "text": r.snippet} for r in self.results]
        return self._json({"requestId": "r1", "results": results})

    async def _tavily(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request, "tavily")
        bad = await self._misbehave(request, rec, "application/json")
        if bad is not None:
            return bad
        in_body = isinstance(rec.body, dict) and rec.body.get("api_key") == KEY
        if not (self._authorized(rec, "Authorization", bearer=True) or in_body):
            return self._denied()
        results = [{"title": r.title, "url": r.url, "content": r.snippet, "score": 0.9} for r in self.results]
        return self._json({"query": (rec.body or {}).get("query"), "results": results})

    async def _jina(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request, "jina")
        bad = await self._misbehave(request, rec, "application/json")
        if bad is not None:
            return bad
        if not self._authorized(rec, "Authorization", bearer=True):
            return self._denied()
        data = [
            {"title": r.title, "url": r.url, "description": r.snippet, "content": ""} for r in self.results
        ]
        return self._json({"code": 200, "status": 20000, "data": data})

    async def _page(self, request: web.Request) -> web.StreamResponse:
        page = self.pages.get(request.match_info["name"])
        if page is None:
            raise web.HTTPNotFound()
        return web.Response(text=page, content_type="text/html")
