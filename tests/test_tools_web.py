"""web_fetch and web_search, offline: a tiny aiohttp site, a canary server and fake search
providers on 127.0.0.1.

The default fetcher must refuse everything on loopback, so the "allowed" path lists the test
site's address in ``WebSettings.allow_hosts``. The guard tests aim URLs spelled every way we know
at a :class:`Canary` on loopback and check it saw no connection at all; a control test shows the
same spellings do reach it through a plain aiohttp session, so the zero counts mean something.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from langchain_core.messages import ToolMessage
from pydantic import ValidationError
from yarl import URL

import agent.tools.web as web_mod
from agent.config import AgentSettings, ModelSpec
from agent.context import ContextSettings, build_context_middleware
from agent.events import Final, ToolProgress
from agent.harness import Harness
from agent.model import build_chat_model
from agent.tools.web import GuardedResolver, UrlRefused, WebFetcher, WebSettings, build_web_tools, ip_allowed
from agent.tools.web_guard import AddressPolicy, GuardedConnector, check_ip, check_url, parse_ip
from tests.fakes.canary_server import Canary
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

ALLOW_LOOPBACK = WebSettings(allow_hosts=["127.0.0.1"])
LOOPBACK = {"127.0.0.1"}  # the older test-only exemption, now an alias of allow_hosts

PAGE = """<!doctype html><html><head><title>Llama facts</title>
<style>body { color: red }</style><script>var secret = "should-not-appear";</script></head>
<body><nav><a href="/home">Home</a></nav>
<h1>All about llamas</h1><p>Llamas are <b>social</b> animals.</p>
<ul><li>They hum.</li><li>They spit.</li></ul>
<noscript>enable js</noscript><p>See <a href="/more">more facts</a>.</p></body></html>"""


class Site:
    """A test web site (on 127.0.0.1 unless told) that also plays SearXNG and Tavily."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
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
        app.router.add_get("/raw-redirect", self.raw_redirect)
        app.router.add_get("/search", self.searxng)
        app.router.add_post("/tavily/search", self.tavily)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base = f"http://{self.host}:{port}"
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

    async def raw_redirect(self, request: web.Request) -> web.Response:
        # HTTPFound would pass the target through yarl (folding its host); send it verbatim.
        return web.Response(status=302, headers={"Location": request.query["to"]})

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


def spellings(address: str) -> dict[str, str]:
    """``address`` (dotted IPv4) written every way we know a client, libc or IDNA step may turn
    back into it. Values are URL hosts (IPv6 in brackets)."""
    octets = [int(x) for x in address.split(".")]
    n = int(ipaddress.IPv4Address(address))
    a, b, c, d = octets

    def digits(table: str | None = None, base: int | None = None, dot: str = ".") -> str:
        def one(ch: str) -> str:
            if table is not None:
                return table[int(ch)]
            return chr(base + int(ch)) if base is not None else ch

        return dot.join("".join(one(ch) for ch in str(o)) for o in octets)

    return {
        "fullwidth digits": digits(base=0xFF10),
        "fullwidth digits and dots": digits(base=0xFF10, dot="\uff0e"),
        "ideographic full stop U+3002": digits(dot="\u3002"),
        "fullwidth full stop U+FF0E": digits(dot="\uff0e"),
        "halfwidth ideographic full stop U+FF61": digits(dot="\uff61"),
        "one dot leader U+2024": digits(dot="\u2024"),
        "fullwidth with ideographic dots": digits(base=0xFF10, dot="\u3002"),
        "circled digits": digits(table="⓪①②③④⑤⑥⑦⑧⑨"),
        "superscript digits": digits(table="⁰¹²³⁴⁵⁶⁷⁸⁹"),
        "mathematical bold digits": digits(base=0x1D7CE),
        "mathematical double-struck digits": digits(base=0x1D7D8),
        "mathematical monospace digits": digits(base=0x1D7F6),
        "arabic-indic digits": digits(base=0x0660),
        "extended arabic-indic digits": digits(base=0x06F0),
        "devanagari digits": digits(base=0x0966),
        "trailing dot": f"{address}.",
        "two trailing dots": f"{address}..",
        "fullwidth with trailing ideographic dot": digits(base=0xFF10) + "\u3002",
        "decimal integer": str(n),
        "hex integer": hex(n),
        "upper-case hex integer": "0X" + format(n, "X"),
        "octal integer": "0" + format(n, "o"),
        "dotted hex": ".".join(hex(o) for o in octets),
        "dotted octal": ".".join("0" + format(o, "o") for o in octets),
        "zero-padded octets": ".".join(format(o, "03d") for o in octets),
        "short a.b.c": f"{a}.{b}.{(c << 8) + d}",
        "short a.b": f"{a}.{(b << 16) + (c << 8) + d}",
        "short hex a.b": f"{hex(a)}.{(b << 16) + (c << 8) + d}",
        "ipv4-mapped": f"[::ffff:{address}]",
        "ipv4-mapped hex": f"[::ffff:{n >> 16:x}:{n & 0xFFFF:x}]",
        "ipv4-mapped long form": f"[0:0:0:0:0:ffff:{address}]",
        "ipv4-compatible": f"[::{address}]",
        "nat64": f"[64:ff9b::{address}]",
        "nat64 hex": f"[64:ff9b::{n >> 16:x}:{n & 0xFFFF:x}]",
        "6to4": f"[2002:{n >> 16:x}:{n & 0xFFFF:x}::]",
        "teredo": f"[2001:0:4136:e378:8000:63bf:{(~n >> 16) & 0xFFFF:x}:{~n & 0xFFFF:x}]",
        "siit translated": f"[::ffff:0:{address}]",
    }


LOOPBACK_SPELLINGS = {
    **spellings("127.0.0.1"),
    "plain": "127.0.0.1",
    "other loopback": "127.9.8.7",
    "ipv6 loopback": "[::1]",
    "ipv6 loopback with zone id": "[::1%25lo]",
    "ipv6 loopback long form": "[0:0:0:0:0:0:0:1]",
    "unspecified v4": "0.0.0.0",
    "unspecified v4 as 0": "0",
    "unspecified v4 circled": "⓪.⓪.⓪.⓪",
    "unspecified v6": "[::]",
    "localhost": "localhost",
    "localhost trailing dot": "localhost.",
    "fullwidth LOCALHOST": "ＬＯＣＡＬＨＯＳＴ",
}
METADATA_SPELLINGS = {
    **spellings("169.254.169.254"),
    "plain": "169.254.169.254",
    "link-local v6 with zone id": "[fe80::1%25eth0]",
    "link-local v6": "[fe80::a9fe:a9fe]",
}


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
        "64:ff9b::7f00:1",
        "64:ff9b:1::1",
        "::7f00:1",
        "::8.8.8.8",
        "::ffff:0:7f00:1",
        "2001:0:4136:e378:8000:63bf:80ff:fffe",
        "2001:db8::1",
        "fec0::1",
        "3fff::1",
        "100::1",
        "fe80::1%eth0",
        "192.0.2.1",
        "198.18.0.1",
        "192.88.99.1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not ip_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:808:808::", "64:ff9b::808:808"],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert ip_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0177.0.0.01", "127.0.0.1"),
        ("127.000.000.001", "127.0.0.1"),
        ("0x7f.0x0.0x0.0x1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("127.0.0.1.", "127.0.0.1"),
        ("[::ffff:7f00:1]", "::ffff:7f00:1"),
        ("fe80::1%25eth0", "fe80::1"),
        ("1.2.3.256", None),
        ("4294967296", None),
        ("1.2.3.4.5", None),
        ("09.1.1.1", None),
        ("example.com", None),
        ("１２７.０.０.１", None),  # not ASCII: host_readings folds it first
    ],
)
def test_parse_ip_reads_every_ascii_spelling(text: str, expected: str | None) -> None:
    parsed = parse_ip(text)
    assert (str(parsed) if parsed is not None else None) == expected


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


# ---- every spelling, against a live target -----------------------------------------------------
REACHABLE = [  # spellings a plain aiohttp client folds into a loopback address and connects to
    "fullwidth digits",
    "fullwidth digits and dots",
    "ideographic full stop U+3002",
    "halfwidth ideographic full stop U+FF61",
    "circled digits",
    "superscript digits",
    "mathematical bold digits",
    "ipv4-mapped",
    "ipv4-mapped hex",
    "unspecified v4",
    "unspecified v4 circled",
    "localhost",
]


async def test_control_a_plain_client_does_reach_the_canary(canary: Canary) -> None:
    """Without the guard these URLs hit the target: the zero counts below are not luck."""
    async with aiohttp.ClientSession(trust_env=False) as session:
        for name in REACHABLE:
            url = f"http://{LOOPBACK_SPELLINGS[name]}:{canary.port}/metrics"
            async with session.get(url) as resp:
                assert resp.status == 200, name
    assert len(canary.requests) == len(REACHABLE)


@pytest.mark.parametrize("name", sorted(LOOPBACK_SPELLINGS))
async def test_loopback_in_any_spelling_is_refused_and_never_connected(canary: Canary, name: str) -> None:
    url = f"http://{LOOPBACK_SPELLINGS[name]}:{canary.port}/metrics"
    with pytest.raises(
        UrlRefused, match=r"^refused: .+ a private, loopback, link-local or reserved address \("
    ):
        await WebFetcher(WebSettings()).fetch(url)
    assert canary.hits == 0


@pytest.mark.parametrize("name", sorted(METADATA_SPELLINGS))
async def test_cloud_metadata_in_any_spelling_is_refused(name: str) -> None:
    url = f"http://{METADATA_SPELLINGS[name]}/latest/meta-data/iam/security-credentials/"
    with pytest.raises(UrlRefused, match="private, loopback, link-local or reserved") as info:
        await WebFetcher(WebSettings(fetch_timeout=5)).fetch(url)
    if "fe80" not in url:
        assert "169.254.169.254" in str(info.value)  # IPv6 forms name the IPv4 address they carry


@pytest.mark.parametrize("name", ["fullwidth digits", "ideographic full stop U+3002", "circled digits"])
async def test_the_model_is_told_why(canary: Canary, name: str) -> None:
    fetch = build_web_tools(WebSettings())[0]
    url = f"http://{LOOPBACK_SPELLINGS[name]}:{canary.port}/metrics"
    msg = await fetch.ainvoke({"name": "web_fetch", "args": {"url": url}, "id": "c1", "type": "tool_call"})
    assert isinstance(msg, ToolMessage) and msg.status == "error"
    assert msg.text.startswith("refused:") and "(127.0.0.1)" in msg.text and "allow_hosts" in msg.text
    assert canary.hits == 0


@pytest.fixture
async def public_site() -> AsyncIterator[Site]:
    """Plays a public server: on 127.0.0.2, which the tests list in allow_hosts (and nothing else)."""
    s = await Site("127.0.0.2").start()
    try:
        yield s
    finally:
        await s.stop()


@pytest.mark.parametrize("route", ["redirect", "raw-redirect"])
@pytest.mark.parametrize(
    "name",
    [
        "plain",
        "fullwidth digits",
        "ideographic full stop U+3002",
        "circled digits",
        "arabic-indic digits",
        "decimal integer",
        "short a.b",
        "ipv4-mapped",
        "nat64",
        "unspecified v4",
        "ipv6 loopback",
        "localhost",
    ],
)
async def test_redirect_from_an_allowed_server_to_loopback_is_refused(
    canary: Canary, public_site: Site, name: str, route: str
) -> None:
    fetcher = WebFetcher(WebSettings(allow_hosts=["127.0.0.2"]))
    assert "plain words" in await fetcher.fetch(f"{public_site.base}/text")  # the allowed server is reachable
    target = quote(f"http://{LOOPBACK_SPELLINGS[name]}:{canary.port}/metrics", safe="")
    with pytest.raises(UrlRefused, match="private, loopback, link-local or reserved"):
        await fetcher.fetch(f"{public_site.base}/{route}?to={target}")
    assert canary.hits == 0


# ---- each layer on its own ----------------------------------------------------------------------
def _no_url_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_mod, "check_target", lambda url, policy: URL(url))


@pytest.mark.parametrize("name", REACHABLE)
async def test_the_socket_guard_alone_refuses(
    canary: Canary, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the URL pre-check switched off, the connector still refuses every connect (names by
    its resolver, every address by its socket factory): no connection reaches the canary."""
    _no_url_check(monkeypatch)
    with pytest.raises(UrlRefused, match="private, loopback, link-local or reserved"):
        await WebFetcher(WebSettings()).fetch(f"http://{LOOPBACK_SPELLINGS[name]}:{canary.port}/metrics")
    assert canary.hits == 0


async def test_the_peer_address_check_alone_refuses_before_the_request(
    canary: Canary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """URL check and socket factory both off: the connection is made, but the peer address is
    checked before the request is written, so the target sees a connection and no request."""
    _no_url_check(monkeypatch)
    monkeypatch.setattr(
        GuardedConnector, "_guarded_socket", lambda self, ai: socket.socket(ai[0], ai[1], ai[2])
    )
    for name in ("fullwidth digits", "circled digits", "ipv4-mapped", "unspecified v4"):
        with pytest.raises(UrlRefused, match="private, loopback, link-local or reserved"):
            await WebFetcher(WebSettings()).fetch(f"http://{LOOPBACK_SPELLINGS[name]}:{canary.port}/metrics")
    await asyncio.sleep(0.05)
    assert canary.connections >= 1 and canary.requests == []


class FixedResolver(AbstractResolver):
    """A DNS that answers ``addresses`` for every name (a rebinding or hostile zone)."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            ResolveResult(
                hostname=host,
                host=a,
                port=port,
                family=socket.AF_INET6 if ":" in a else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for a in self.addresses
        ]

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "addresses", [["127.0.0.1"], ["93.184.216.34", "127.0.0.1"], ["::ffff:127.0.0.1"], ["0.0.0.0"], ["::1"]]
)
@pytest.mark.parametrize("layer", ["resolver", "socket"])
async def test_a_name_answering_a_private_address_is_refused(
    canary: Canary, addresses: list[str], layer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if layer == "socket":  # the resolver passes everything: the socket factory must say no
        monkeypatch.setattr(GuardedResolver, "resolve", lambda self, *a, **k: self._inner.resolve(*a, **k))
    connector = GuardedConnector(AddressPolicy(), resolver=FixedResolver(addresses[-1:]))
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        with pytest.raises((UrlRefused, aiohttp.ClientConnectorError)):
            await session.get(f"http://public.example:{canary.port}/metrics")
    assert connector.refusals or layer == "resolver"
    assert canary.hits == 0
    if layer == "resolver":  # any private address among the answers refuses the name
        with pytest.raises(UrlRefused, match="public.example resolves to"):
            await GuardedResolver(inner=FixedResolver(addresses)).resolve("public.example", 80)


# ---- allow_hosts --------------------------------------------------------------------------------
async def test_allow_hosts_opens_exactly_what_it_lists(canary: Canary) -> None:
    url = f"http://127.0.0.1:{canary.port}/metrics"
    for entries in (["127.0.0.1"], ["127.0.0.0/8"], [" 127.0.0.1 "]):
        assert "chital_secret_metric" in await WebFetcher(WebSettings(allow_hosts=entries)).fetch(url)
    # The decision is on the address connected to, so an allowed address is allowed in any spelling.
    allowed = WebFetcher(WebSettings(allow_hosts=["127.0.0.1"]))
    assert "chital_secret_metric" in await allowed.fetch(f"http://１２７.０.０.１:{canary.port}/metrics")
    assert len(canary.requests) == 4
    # ...and no other address.
    for host in ("127.0.0.2", "169.254.169.254", "10.0.0.1", "[::1]", "0.0.0.0"):
        with pytest.raises(UrlRefused):
            await allowed.fetch(f"http://{host}:{canary.port}/metrics")
    # A name entry opens connections made for that name, not its address spelled out.
    by_name = WebFetcher(WebSettings(allow_hosts=["LOCALHOST."]))
    assert "chital_secret_metric" in await by_name.fetch(f"http://localhost:{canary.port}/metrics")
    for host in ("127.0.0.1", "１２７.０.０.１", "[::ffff:127.0.0.1]"):
        with pytest.raises(UrlRefused):
            await by_name.fetch(f"http://{host}:{canary.port}/metrics")
    # Loopback opened by address: localhost names then go through the resolver like any name.
    by_address = WebFetcher(WebSettings(allow_hosts=["127.0.0.0/8", "::1"]))
    assert "chital_secret_metric" in await by_address.fetch(
        f"http://ＬＯＣＡＬＨＯＳＴ:{canary.port}/metrics"
    )
    assert len(canary.requests) == 6


def test_address_policy_entries() -> None:
    ip = ipaddress.ip_address
    p = AddressPolicy(
        ["wiki.internal", "*.corp.example", "10.1.2.3", "192.168.0.0/16", "fd00::/8", "[fd11::1]"]
    )
    assert p.name_allowed("WIKI.internal.") and p.name_allowed("ｗｉｋｉ.internal")
    assert p.name_allowed("a.b.corp.example") and not p.name_allowed("corp.example")
    assert not p.name_allowed("evilcorp.example") and not p.name_allowed("wiki.internal.evil.com")
    assert p.address_allowed(ip("10.1.2.3")) and p.address_allowed(ip("::ffff:10.1.2.3"))
    assert not p.address_allowed(ip("10.1.2.4")) and not p.address_allowed(ip("127.0.0.1"))
    assert p.address_allowed(ip("192.168.7.7")) and p.address_allowed(ip("fd12::1"))
    assert p.address_allowed(ip("10.9.9.9"), host="wiki.internal")
    assert not p.address_allowed(ip("10.9.9.9"), host="other.internal")


@pytest.mark.parametrize("entry", ["http://wiki", "10.0.0.0/33", "wiki:8080", "", "*.", "a b", "user@host"])
def test_bad_allow_hosts_entries_are_rejected(entry: str) -> None:
    with pytest.raises(ValidationError, match="allow_hosts"):
        WebSettings(allow_hosts=[entry])


async def test_older_api_spellings_still_work(canary: Canary) -> None:
    url = f"http://127.0.0.1:{canary.port}/metrics"
    assert "chital_secret_metric" in await WebFetcher(WebSettings(), allow_private_for_tests=LOOPBACK).fetch(
        url
    )
    assert check_url(url, LOOPBACK) == url
    check_ip("127.0.0.1", "x", LOOPBACK)
    with pytest.raises(UrlRefused, match=r"\(127\.0\.0\.2\)"):
        check_ip("127.0.0.2", "x", LOOPBACK)
    with pytest.raises(UrlRefused):
        check_url(f"http://１２７.０.０.２:{canary.port}/", LOOPBACK)
    assert await GuardedResolver(LOOPBACK).resolve("127.0.0.1", 80)


async def test_environment_proxies_are_ignored(
    canary: Canary, site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = f"http://127.0.0.1:{canary.port}"
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    assert "plain words" in await WebFetcher(ALLOW_LOOPBACK).fetch(f"{site.base}/text")
    assert canary.hits == 0


# ---- the allowed path (allow_hosts lists exactly 127.0.0.1) -------------------------------------
async def test_fetch_returns_markdown_without_scripts(site: Site) -> None:
    text = await WebFetcher(ALLOW_LOOPBACK).fetch(f"{site.base}/page")
    assert text.startswith("# Llama facts")
    assert f"Source: {site.base}/page" in text
    assert "# All about llamas" in text
    assert "Llamas are **social** animals." in text
    assert "- They hum." in text
    assert f"[more facts]({site.base}/more)" in text  # links made absolute
    assert "should-not-appear" not in text and "color: red" not in text and "enable js" not in text


async def test_fetch_plain_text_and_refuses_binary(site: Site) -> None:
    fetcher = WebFetcher(ALLOW_LOOPBACK)
    assert "plain words" in await fetcher.fetch(f"{site.base}/text")
    with pytest.raises(Exception, match="image/png"):
        await fetcher.fetch(f"{site.base}/image")
    with pytest.raises(Exception, match="HTTP 404"):
        await fetcher.fetch(f"{site.base}/missing")


async def test_fetch_size_and_time_limits(site: Site) -> None:
    small = WebFetcher(WebSettings(max_fetch_bytes=1024, allow_hosts=["127.0.0.1"]))
    text = await small.fetch(f"{site.base}/big")
    assert "END-MARKER" not in text and "page truncated" in text
    quick = WebFetcher(WebSettings(fetch_timeout=0.5, allow_hosts=["127.0.0.1"]))
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
    fetcher = WebFetcher(ALLOW_LOOPBACK)
    if "localhost" in target:
        # localhost may resolve to 127.0.0.1 only (then it is the exempt test server): force a
        # name whose every address must pass, via the default policy.
        fetcher = WebFetcher(WebSettings())
    with pytest.raises(UrlRefused):
        await fetcher.fetch(f"{site.base}/redirect?to={target}")


async def test_redirects_are_followed_and_bounded(site: Site) -> None:
    fetcher = WebFetcher(WebSettings(max_redirects=3, allow_hosts=["127.0.0.1"]))
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
    msg = await _search(WebSettings(search_provider="none"), "llamas")
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
        tools = build_web_tools(ALLOW_LOOPBACK)
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
