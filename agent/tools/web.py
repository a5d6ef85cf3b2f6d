"""``web_fetch`` (URL → Markdown) and ``web_search`` (a configured provider) for the agent.

``web_fetch`` runs on the daemon's host, so a URL the model picks must never reach the host's own
network: loopback, private, link-local (cloud metadata at 169.254.169.254), shared, multicast,
reserved and unspecified addresses are refused, in every spelling, unless the operator lists the
host in ``web.allow_hosts``. The guard lives in :mod:`agent.tools.web_guard`:

- :func:`~agent.tools.web_guard.check_target` parses the URL into the very ``yarl.URL`` object
  handed to aiohttp and refuses a host that reads as a non-public address (fullwidth or circled
  digits, ideographic dots, legacy IPv4 forms, IPv4-in-IPv6...), with a clear message for the model;
- :class:`~agent.tools.web_guard.GuardedConnector` checks the address of *every* socket before it
  connects (and the peer address after), whether the host was a name or an IP literal; names go
  through a resolver that refuses them if any address is not public, and the socket connects only
  to the addresses that resolver returned (no second resolution).

Redirects are followed by hand (``allow_redirects=False``) so each hop gets the same checks, and
proxies from the environment are ignored (``trust_env=False``): a proxy would make the connect
address invisible to the check.

``web_search`` (agent/tools/search.py) goes through the same guard for its provider requests; the
result URLs it returns are fetched only when the model calls ``web_fetch``, guarded like any other.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Collection
from urllib.parse import urljoin

import aiohttp
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field
from yarl import URL

from agent.settings import WebSettings
from agent.tools.search import WebSearch
from agent.tools.web_guard import (
    AddressPolicy,
    GuardedConnector,
    GuardedResolver,
    UrlRefused,
    check_ip,
    check_target,
    check_url,
    ip_allowed,
    parse_ip,
)

__all__ = [
    "GuardedResolver",
    "UrlRefused",
    "WebFetcher",
    "WebSearch",
    "WebSettings",
    "build_web_tools",
    "check_ip",
    "check_target",
    "check_url",
    "html_to_markdown",
    "ip_allowed",
    "parse_ip",
]

log = logging.getLogger(__name__)

_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {"application/json", "application/xml", "application/javascript", "application/x-yaml"}
)
_DROP_TAGS = ("script", "style", "noscript", "template", "svg", "iframe", "object", "embed", "head")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


def html_to_markdown(html: bytes | str, base_url: str = "") -> tuple[str, str]:
    """(title, Markdown) of an HTML page, without scripts, styles and other non-content; links
    are made absolute so the model can fetch them."""
    from bs4 import BeautifulSoup  # imported on first use: the daemon starts lighter without it
    from markdownify import MarkdownConverter

    soup = BeautifulSoup(html, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup(_DROP_TAGS):
        tag.decompose()
    if base_url:
        for name, attr in (("a", "href"), ("img", "src")):
            for el in soup.find_all(name, attrs={attr: True}):
                el[attr] = urljoin(base_url, str(el[attr]))
    text = MarkdownConverter(heading_style="ATX", bullets="-", escape_misc=False).convert_soup(soup)
    text = re.sub(r"[ \t]+\n", "\n", text)
    return title, re.sub(r"\n{3,}", "\n\n", text).strip()


class WebFetcher:
    """Fetches one URL as Markdown within the size, time and address limits of ``WebSettings``.

    ``settings.allow_hosts`` opens internal hosts (names, IPs, networks) to the fetch.
    ``allow_private_for_tests`` is the older, test-only spelling of the same thing: its entries
    are added to ``allow_hosts``.
    """

    def __init__(self, settings: WebSettings, *, allow_private_for_tests: Collection[str] = ()) -> None:
        self.settings = settings
        self.policy = AddressPolicy([*settings.allow_hosts, *allow_private_for_tests])

    async def fetch(self, url: str) -> str:
        connector = GuardedConnector(self.policy)
        try:
            async with asyncio.timeout(self.settings.fetch_timeout):
                return await self._fetch(url, connector)
        except TimeoutError:
            raise ToolException(f"timed out after {self.settings.fetch_timeout:g}s fetching {url}") from None
        except aiohttp.ClientError as exc:
            if connector.refusals:  # the socket guard said no: say so, not "could not connect"
                raise UrlRefused(connector.refusals[0]) from None
            # The class name tells the model enough (DNS failure, refused connection, TLS...).
            raise ToolException(f"could not fetch {url}: {type(exc).__name__}") from None
        finally:
            await connector.close()

    async def _fetch(self, url: str, connector: GuardedConnector) -> str:
        s = self.settings
        headers = {
            "User-Agent": s.user_agent,
            "Accept": "text/html,application/xhtml+xml,text/*;q=0.9,*/*;q=0.5",
        }
        current: str | URL = url
        async with aiohttp.ClientSession(
            connector=connector, connector_owner=False, trust_env=False, headers=headers
        ) as session:
            for _ in range(s.max_redirects + 1):
                # The checked URL object itself goes to aiohttp: what was judged is what it connects.
                target = check_target(current, self.policy)
                async with session.get(target, allow_redirects=False) as resp:
                    if resp.status in _REDIRECTS and "Location" in resp.headers:
                        location = resp.headers["Location"]
                        try:
                            current = resp.url.join(URL(location))
                        except (ValueError, UnicodeError):
                            raise UrlRefused(f"refused: malformed redirect target {location!r}") from None
                        continue
                    if resp.status >= 400:
                        raise ToolException(f"HTTP {resp.status} from {resp.url}")
                    return await self._render(resp, str(resp.url))
        raise ToolException(f"too many redirects (more than {s.max_redirects}) starting from the given URL")

    async def _render(self, resp: aiohttp.ClientResponse, url: str) -> str:
        ctype = resp.content_type.lower()
        is_html = ctype in _HTML_TYPES
        if not (
            is_html or ctype.startswith("text/") or ctype in _TEXT_TYPES or ctype.endswith(("+json", "+xml"))
        ):
            raise ToolException(f"{url} is {ctype or 'of unknown type'}, not a web page or text; not fetched")
        body, cut = await _read_capped(resp, self.settings.max_fetch_bytes)
        if is_html:
            title, text = html_to_markdown(body, url)
        else:
            title, text = "", _decode(body, resp.charset)
        notes = (
            [f"[page truncated: only the first {self.settings.max_fetch_bytes} bytes were read]"]
            if cut
            else []
        )
        if len(text) > self.settings.max_chars:
            text = text[: self.settings.max_chars]
            notes.append(f"[text truncated at {self.settings.max_chars} characters]")
        head = f"# {title}\n\n" if title else ""
        return "\n\n".join([f"{head}Source: {url}", text, *notes]).strip()


def _decode(body: bytes, charset: str | None) -> str:
    try:
        return body.decode(charset or "utf-8", "replace")
    except LookupError:  # an unknown charset name
        return body.decode("utf-8", "replace")


async def _read_capped(resp: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the body, and whether more was left unread."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], True
    return b"".join(chunks), False


# ---- the tools ----------------------------------------------------------------------------------
class _FetchArgs(BaseModel):
    url: str = Field(description="The http(s) URL to read.")


class _SearchArgs(BaseModel):
    query: str = Field(description="What to search for, as you would type it into a search engine.")


def build_web_tools(
    settings: WebSettings, *, allow_private_for_tests: Collection[str] = ()
) -> list[BaseTool]:
    """``web_fetch`` and ``web_search``. Their failures come back as error ToolMessages
    (``handle_tool_error``): the text is ours, safe to show, and the model can try another way.
    One ``WebSearch`` (and so one search cache) per call: the runtime builds them once and hands
    the same tools to the lead and its sub-agents."""
    fetcher = WebFetcher(settings, allow_private_for_tests=allow_private_for_tests)
    searcher = WebSearch(settings)
    fetch = StructuredTool.from_function(
        coroutine=fetcher.fetch,
        name="web_fetch",
        description=(
            "Read a public web page and get its text as Markdown. Use it for URLs the user gives or "
            "that a search returned. Private and local network addresses are refused."
        ),
        args_schema=_FetchArgs,
        handle_tool_error=True,
    )
    search = StructuredTool.from_function(
        coroutine=searcher.search,
        name="web_search",
        description=(
            "Search the web; returns numbered results with titles, URLs and snippets. Read a result "
            "with web_fetch. Cite the sources you use in your answer as Markdown links to their URLs."
        ),
        args_schema=_SearchArgs,
        handle_tool_error=True,
    )
    return [fetch, search]
