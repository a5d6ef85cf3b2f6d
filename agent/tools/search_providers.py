"""The search providers ``web_search`` can use: how each is asked, and how its answer is read.

Each provider is a request builder and a parser, with no I/O of its own: the HTTP exchange (the
address guard, the size cap, the time limit, the status codes) is one code path in
:mod:`agent.tools.search` for all of them, so a limit or a check cannot be forgotten in one.

- ``duckduckgo``: no key. ``POST {base}/html/`` with the form field ``q``, the page DuckDuckGo
  serves to browsers without JavaScript, read with BeautifulSoup. Why not the ``ddgs`` package:
  it hardcodes DuckDuckGo's real addresses (and several other engines'), so it cannot be pointed at
  a local fake in the tests, and it brings its own HTTP client (no address guard, no size cap).
- ``brave``: ``GET {base}/res/v1/web/search?q=&count=`` with ``X-Subscription-Token``; results in
  ``web.results[].{title,url,description}`` (descriptions carry ``<strong>`` highlights).
- ``searxng``: ``GET {base}/search?q=&format=json``; ``results[].{title,url,content}``.
- ``exa``: ``POST {base}/search`` with ``x-api-key`` and ``{query, numResults, contents}``;
  ``results[].{title,url,text|highlights}``.
- ``tavily``: ``POST {base}/search`` with ``Authorization: Bearer`` and ``{query, max_results}``;
  ``results[].{title,url,content}``.
- ``jina``: ``GET {base}/?q=`` with ``Authorization: Bearer``, ``Accept: application/json`` and
  ``X-Respond-With: no-content`` (titles, URLs and descriptions, not whole pages);
  ``data[].{title,url,description}``.

Keys go in headers only, never in the URL: a URL ends up in logs, exceptions and proxies.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from langchain_core.tools import ToolException

__all__ = ["PROVIDERS", "Hit", "Provider", "ProviderRequest"]


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result as a provider gave it (raw: :mod:`agent.tools.search` cleans it)."""

    title: str
    url: str
    snippet: str = ""


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] | None = None
    form: Mapping[str, str] | None = None
    json_body: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Provider:
    name: str
    label: str
    """How a message names it: "DuckDuckGo", "Brave"..."""
    default_base: str | None
    """Its public address; None: the operator must give ``base_url`` (SearXNG)."""
    needs_key: bool
    build: Callable[[str, str, int, str | None], ProviderRequest]
    """(base URL, query, result count, key) -> the request."""
    parse: Callable[[bytes], list[Hit]]
    html: bool = False
    """The answer is an HTML page, not JSON."""


_TAGS = re.compile(r"<[^>]*>")


def strip_markup(text: object) -> str:
    """A provider's text without HTML tags and entities (Brave's ``<strong>`` highlights)."""
    if not isinstance(text, str):
        return ""
    return html.unescape(_TAGS.sub("", text))


def _json(body: bytes, label: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ToolException(f"the {label} search returned something that is not JSON") from None


def _items(data: Any, path: Iterable[str], label: str) -> list[dict[str, Any]]:
    """The result objects at ``path`` in a JSON answer; a clear error when the shape is not one."""
    node = data
    where = ""
    for key in path:
        where = f"{where}.{key}" if where else key
        if not isinstance(node, dict):
            raise ToolException(f"the {label} search returned an unexpected answer (no {where!r})")
        node = node.get(key)
        if node is None:  # an absent list is an empty answer (Brave leaves out "web" for none)
            return []
    if not isinstance(node, list):
        raise ToolException(f"the {label} search returned an unexpected answer ({where!r} is not a list)")
    return [item for item in node if isinstance(item, dict)]


def _hits(items: Iterable[dict[str, Any]], snippet_keys: tuple[str, ...]) -> list[Hit]:
    out = []
    for item in items:
        url = item.get("url")
        if not isinstance(url, str) or not url:
            continue
        snippet = ""
        for key in snippet_keys:
            value = item.get(key)
            if isinstance(value, list):  # Exa's highlights
                value = " … ".join(v for v in value if isinstance(v, str))
            if isinstance(value, str) and value.strip():
                snippet = value
                break
        out.append(Hit(strip_markup(item.get("title")), url, strip_markup(snippet)))
    return out


# ---- DuckDuckGo (HTML) ---------------------------------------------------------------------------
def _ddg_build(base: str, query: str, count: int, key: str | None) -> ProviderRequest:
    return ProviderRequest(
        "POST",
        base.rstrip("/") + "/html/",
        headers={"Accept": "text/html", "Referer": base.rstrip("/") + "/"},
        form={"q": query, "b": "", "kl": ""},
    )


def _ddg_target(href: str) -> str | None:
    """The result's own URL: DuckDuckGo wraps it as ``//duckduckgo.com/l/?uddg=<url>``; ads go
    through ``/y.js`` and are left out."""
    parts = urlsplit(href)
    if parts.path.endswith("/y.js"):
        return None
    if parts.path.endswith("/l/"):
        target = parse_qs(parts.query).get("uddg")
        return target[0] if target else None
    return href if parts.scheme in ("http", "https") else None


def _ddg_parse(body: bytes) -> list[Hit]:
    from bs4 import BeautifulSoup  # imported on first use, as web_fetch does

    soup = BeautifulSoup(body, "html.parser")
    if soup.select_one(".anomaly-modal, #challenge-form, .challenge-form"):
        raise ToolException(
            "DuckDuckGo asked for a bot check instead of answering (too many queries from this "
            "server); try again later, or ask the admin to configure another search provider"
        )
    items = soup.select("div.result")
    if not items:
        if soup.select_one(".no-results, #links, div.results, .serp__results"):
            return []
        raise ToolException(
            "the DuckDuckGo search returned a page without a results list (its layout may have "
            "changed); ask the admin to configure another search provider"
        )
    hits = []
    for item in items:
        if "result--ad" in (item.get("class") or []):
            continue
        link = item.select_one("a.result__a")
        href = link.get("href") if link is not None else None
        url = _ddg_target(str(href)) if href else None
        if link is None or not url:
            continue
        snippet = item.select_one(".result__snippet")
        hits.append(
            Hit(
                link.get_text(" ", strip=True),
                url,
                snippet.get_text(" ", strip=True) if snippet is not None else "",
            )
        )
    return hits


# ---- keyed JSON providers ------------------------------------------------------------------------
def _brave_build(base: str, query: str, count: int, key: str | None) -> ProviderRequest:
    return ProviderRequest(
        "GET",
        base.rstrip("/") + "/res/v1/web/search",
        headers={"Accept": "application/json", "X-Subscription-Token": key or ""},
        params={"q": query, "count": str(count)},
    )


def _searxng_build(base: str, query: str, count: int, key: str | None) -> ProviderRequest:
    return ProviderRequest(
        "GET",
        base.rstrip("/") + "/search",
        headers={"Accept": "application/json"},
        params={"q": query, "format": "json"},
    )


def _exa_build(base: str, query: str, count: int, key: str | None) -> ProviderRequest:
    return ProviderRequest(
        "POST",
        base.rstrip("/") + "/search",
        headers={"Accept": "application/json", "x-api-key": key or ""},
        json_body={
            "query": query,
            "numResults": count,
            "type": "auto",
            "contents": {"text": {"maxCharacters": 500}},
        },
    )


def _tavily_build(base: str, query: str, count: int, key: str | None) -> ProviderRequest:
    return ProviderRequest(
        "POST",
        base.rstrip("/") + "/search",
        headers={"Accept": "application/json", "Authorization": f"Bearer {key or ''}"},
        json_body={"query": query, "max_results": count, "search_depth": "basic"},
    )


def _jina_build(base: str, query: str, count: int, key: str | None) -> ProviderRequest:
    return ProviderRequest(
        "GET",
        base.rstrip("/") + "/",
        headers={
            "Accept": "application/json",
            "Authorization": f"Bearer {key or ''}",
            "X-Respond-With": "no-content",
        },
        params={"q": query},
    )


def _json_parser(
    label: str, path: tuple[str, ...], snippets: tuple[str, ...]
) -> Callable[[bytes], list[Hit]]:
    def parse(body: bytes) -> list[Hit]:
        data = _json(body, label)
        if not isinstance(data, dict):
            raise ToolException(f"the {label} search returned an unexpected answer (not a JSON object)")
        return _hits(_items(data, path, label), snippets)

    return parse


PROVIDERS: dict[str, Provider] = {
    p.name: p
    for p in (
        Provider(
            "duckduckgo", "DuckDuckGo", "https://html.duckduckgo.com", False, _ddg_build, _ddg_parse, True
        ),
        Provider(
            "brave",
            "Brave",
            "https://api.search.brave.com",
            True,
            _brave_build,
            _json_parser("Brave", ("web", "results"), ("description",)),
        ),
        Provider(
            "searxng",
            "SearXNG",
            None,
            False,
            _searxng_build,
            _json_parser("SearXNG", ("results",), ("content",)),
        ),
        Provider(
            "exa",
            "Exa",
            "https://api.exa.ai",
            True,
            _exa_build,
            _json_parser("Exa", ("results",), ("text", "highlights", "summary")),
        ),
        Provider(
            "tavily",
            "Tavily",
            "https://api.tavily.com",
            True,
            _tavily_build,
            _json_parser("Tavily", ("results",), ("content",)),
        ),
        Provider(
            "jina",
            "Jina",
            "https://s.jina.ai",
            True,
            _jina_build,
            _json_parser("Jina", ("data",), ("description", "content")),
        ),
    )
}
"""Every provider by its ``search_provider`` name ("none" is not one: the tool says it is off)."""
