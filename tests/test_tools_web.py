"""web_fetch and web_search, offline: a tiny aiohttp site and fake search providers on 127.0.0.1.

The default fetcher must refuse everything on loopback, so the "allowed" path uses the test-only
``allow_private_for_tests={"127.0.0.1"}`` exemption; every refusal test runs without it (or shows
that the exemption covers exactly that one address).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from langchain_core.messages import ToolMessage

from agent.config import AgentSettings, ModelSpec
from agent.context import ContextSettings, build_context_middleware
from agent.events import Final, ToolProgress
from agent.harness import Harness
from agent.model import build_chat_model
from agent.tools.web import GuardedResolver, UrlRefused, WebFetcher, WebSettings, build_web_tools, ip_allowed
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

LOOPBACK = {"127.0.0.1"}

PAGE = """<!doctype html><html><head><title>Llama facts</title>
<style>body { color: red }</style><script>var secret = "should-not-appear";</script></head>
<body><nav><a href="/home">Home</a></nav>
<h1>All about llamas</h1><p>Llamas are <b>social</b> animals.</p>
<ul><li>They hum.</li><li>They spit.</li></ul>
<noscript>enable js</noscript><p>See <a href="/more">more facts</a>.</p></body></html>"""


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


class Site:
    """A test web site on 127.0.0.1 that also plays SearXNG and Tavily."""

    def __init__(self) -> None:
        self.base = ""
        self.requests: list[dict[str, Any]] = []
        self.hang = asyncio.Event()
        self._runner: web.AppRunner | None = None

    async def start(self) -> Site:
        app = web.Application()
        app.router.add_get("/page", self.page)
        app.router.add_get("/big", self.big)
        app.router.add_get("/text", self.text)
        app.router.add_get("/image", self.image)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/missing", self.missing)
        app.router.add_get("/redirect", self.redirect)
        app.router.add_get("/loop", self.loop)
        app.router.add_get("/search", self.searxng)
        app.router.add_post("/tavily/search", self.tavily)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        self.hang.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def page(self, request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def big(self, request: web.Request) -> web.Response:
        return web.Response(text="<p>" + "x" * 5000 + "END-MARKER</p>", content_type="text/html")

    async def text(self, request: web.Request) -> web.Response:
        return web.Response(text="plain words", content_type="text/plain")

    async def image(self, request: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG....", content_type="image/png")

    async def slow(self, request: web.Request) -> web.Response:
        await self.hang.wait()
        return web.Response(text="late")

    async def missing(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text="nope")

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def loop(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    async def searxng(self, request: web.Request) -> web.Response:
        self.requests.append({"kind": "searxng", "query": dict(request.query)})
        results = [
            {
                "title": "Llama - Wikipedia",
                "url": "https://en.wikipedia.org/wiki/Llama",
                "content": "The llama is a domesticated South American camelid.",
            },
            {
                "title": "Llama care",
                "url": "https://example.org/care",
                "content": "How to care   for llamas.",
            },
        ]
        return web.json_response({"query": request.query.get("q"), "results": results})

    async def tavily(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"kind": "tavily", "body": body, "auth": request.headers.get("Authorization")})
        if request.headers.get("Authorization") != "Bearer tvly-test-key-123":
            return web.json_response({"detail": {"error": "Unauthorized: key tvly-wrong"}}, status=401)
        return web.json_response(
            {
                "query": body["query"],
                "results": [
                    {
                        "title": "Alpaca vs llama",
                        "url": "https://example.com/a",
                        "content": "Alpacas are smaller.",
                        "score": 0.9,
                    }
                ],
            }
        )


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    s = await Site().start()
    try:
        yield s
    finally:
        await s.stop()


# ---- address policy -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "2002:7f00:1::",
        "64:ff9b::a00:1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    import ipaddress

    assert not ip_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_are_allowed(address: str) -> None:
    import ipaddress

    assert ip_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://10.0.0.5:8080/admin",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "https://192.168.0.1/",
        "http://224.0.0.1/",
    ],
)
async def test_fetch_refuses_private_ip_literals(url: str) -> None:
    with pytest.raises(UrlRefused, match="private, loopback, link-local or reserved"):
        await WebFetcher(WebSettings()).fetch(url)


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://example.com/x",
        "gopher://example.com/",
        "javascript:alert(1)",
        "data:text/html,hi",
    ],
)
async def test_fetch_refuses_other_schemes(url: str) -> None:
    with pytest.raises(UrlRefused, match="only http and https"):
        await WebFetcher(WebSettings()).fetch(url)


async def test_hostname_resolving_to_loopback_is_refused(site: Site) -> None:
    port = site.base.rsplit(":", 1)[1]
    # The server is up on 127.0.0.1, so only the address check stands between us and it.
    with pytest.raises(UrlRefused, match=r"localhost .*\(127\.0\.0\.1|localhost .*\(::1"):
        await WebFetcher(WebSettings()).fetch(f"http://localhost:{port}/page")
    with pytest.raises(UrlRefused):
        await GuardedResolver().resolve("localhost", 80)


async def test_default_fetcher_refuses_the_loopback_test_server(site: Site) -> None:
    with pytest.raises(UrlRefused):
        await WebFetcher(WebSettings()).fetch(f"{site.base}/page")


# ---- the allowed path (test-only exemption of exactly 127.0.0.1) --------------------------------
async def test_fetch_returns_markdown_without_scripts(site: Site) -> None:
    text = await WebFetcher(WebSettings(), allow_private_for_tests=LOOPBACK).fetch(f"{site.base}/page")
    assert text.startswith("# Llama facts")
    assert f"Source: {site.base}/page" in text
    assert "# All about llamas" in text
    assert "Llamas are **social** animals." in text
    assert "- They hum." in text
    assert f"[more facts]({site.base}/more)" in text  # links made absolute
    assert "should-not-appear" not in text and "color: red" not in text and "enable js" not in text


async def test_fetch_plain_text_and_refuses_binary(site: Site) -> None:
    fetcher = WebFetcher(WebSettings(), allow_private_for_tests=LOOPBACK)
    assert "plain words" in await fetcher.fetch(f"{site.base}/text")
    with pytest.raises(Exception, match="image/png"):
        await fetcher.fetch(f"{site.base}/image")
    with pytest.raises(Exception, match="HTTP 404"):
        await fetcher.fetch(f"{site.base}/missing")


async def test_fetch_size_and_time_limits(site: Site) -> None:
    small = WebFetcher(WebSettings(max_fetch_bytes=1024), allow_private_for_tests=LOOPBACK)
    text = await small.fetch(f"{site.base}/big")
    assert "END-MARKER" not in text and "page truncated" in text
    quick = WebFetcher(WebSettings(fetch_timeout=0.5), allow_private_for_tests=LOOPBACK)
    with pytest.raises(Exception, match="timed out after 0.5s"):
        await quick.fetch(f"{site.base}/slow")


@pytest.mark.parametrize(
    "target",
    [
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data/iam",
        "http://[::1]:{port}/page",
        "http://localhost:{port}/page.v6",
        "http://[::ffff:127.0.0.2]:{port}/page",
    ],
)
async def test_redirect_to_private_address_is_refused(site: Site, target: str) -> None:
    port = site.base.rsplit(":", 1)[1]
    target = target.format(port=port)
    fetcher = WebFetcher(WebSettings(), allow_private_for_tests=LOOPBACK)
    if "localhost" in target:
        # localhost may resolve to 127.0.0.1 only (then it is the exempt test server): force a
        # name whose every address must pass, via the default policy.
        fetcher = WebFetcher(WebSettings())
    with pytest.raises(UrlRefused):
        await fetcher.fetch(f"{site.base}/redirect?to={target}")


async def test_redirects_are_followed_and_bounded(site: Site) -> None:
    fetcher = WebFetcher(WebSettings(max_redirects=3), allow_private_for_tests=LOOPBACK)
    text = await fetcher.fetch(f"{site.base}/redirect?to=/page")
    assert f"Source: {site.base}/page" in text
    with pytest.raises(Exception, match="too many redirects"):
        await fetcher.fetch(f"{site.base}/loop")


async def test_tool_reports_refusal_as_error_message() -> None:
    fetch = build_web_tools(WebSettings())[0]
    msg = await fetch.ainvoke(
        {"name": "web_fetch", "args": {"url": "http://169.254.169.254/"}, "id": "c1", "type": "tool_call"}
    )
    assert isinstance(msg, ToolMessage) and msg.status == "error"
    assert "refused" in msg.text and "169.254.169.254" in msg.text


# ---- search -------------------------------------------------------------------------------------
async def _search(settings: WebSettings, query: str) -> ToolMessage:
    search = build_web_tools(settings)[1]
    return await search.ainvoke(
        {"name": "web_search", "args": {"query": query}, "id": "s1", "type": "tool_call"}
    )


async def test_search_off_says_so() -> None:
    msg = await _search(WebSettings(), "llamas")
    assert "not configured" in msg.text and msg.status != "error"


async def test_searxng_search(site: Site) -> None:
    msg = await _search(
        WebSettings(search_provider="searxng", base_url=site.base, max_results=5), "llama facts"
    )
    assert site.requests[-1]["query"] == {"q": "llama facts", "format": "json"}
    assert "1. [Llama - Wikipedia](https://en.wikipedia.org/wiki/Llama)" in msg.text
    assert "How to care for llamas." in msg.text


async def test_searxng_needs_base_url() -> None:
    msg = await _search(WebSettings(search_provider="searxng"), "x")
    assert msg.status == "error" and "base_url" in msg.text


async def test_tavily_search_sends_key_as_bearer_and_hides_it(site: Site) -> None:
    good = WebSettings(search_provider="tavily", api_key="tvly-test-key-123", base_url=f"{site.base}/tavily")
    msg = await _search(good, "alpaca or llama")
    assert site.requests[-1]["auth"] == "Bearer tvly-test-key-123"
    assert site.requests[-1]["body"]["query"] == "alpaca or llama"
    assert "[Alpaca vs llama](https://example.com/a)" in msg.text
    bad = WebSettings(search_provider="tavily", api_key="tvly-wrong-key-456", base_url=f"{site.base}/tavily")
    msg = await _search(bad, "x")
    assert msg.status == "error" and "HTTP 401" in msg.text
    assert "tvly" not in msg.text
    assert "tvly-wrong-key-456" not in repr(bad)


# ---- through the agent: the scripted model calls web_fetch ---------------------------------------
async def test_agent_fetches_a_page_and_a_refused_one(site: Site, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        spec = ModelSpec(base_url=fake.base_url, api_key="k", model="m")
        settings = AgentSettings(model_retries=0)
        middleware = build_context_middleware(
            ContextSettings(title="off", summarize_after_tokens=None), build_chat_model(spec, settings)
        )
        tools = build_web_tools(WebSettings(), allow_private_for_tests=LOOPBACK)
        fake.script(
            Reply(
                tool_calls=[
                    ToolCall("web_fetch", {"url": f"{site.base}/page"}, id="ok"),
                    ToolCall("web_fetch", {"url": "http://169.254.169.254/latest/meta-data/"}, id="meta"),
                ]
            ),
            Reply(text="Llamas hum."),
        )
        harness = Harness(
            settings, spec, tmp_path / "cp.sqlite", extra_tools=tools, extra_middleware=middleware
        )
        async with harness:
            async with aclosing(harness.run("t", user_id="u", message_id="m1", text="llamas?")) as run:
                events = [e async for e in run]
        assert events[-1] == Final("Llamas hum.")
        phases = [(e.name, e.phase) for e in events if isinstance(e, ToolProgress)]
        assert phases.count(("web_fetch", "start")) == 2
        assert ("web_fetch", "error") in phases and ("web_fetch", "end") in phases
        tool_msgs = {
            m["tool_call_id"]: m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"
        }
        assert "# All about llamas" in tool_msgs["ok"]
        assert "refused" in tool_msgs["meta"]
        assert json.dumps(fake.requests[-1]).count("should-not-appear") == 0
