"""The agent's Markdown as the web chat shows it: rendered on the server into a small, fixed set of
HTML, so the page's script never builds markup from text.

Why on the server: one renderer (markdown-it-py, CommonMark) that the tests attack, instead of a
script library in the page; and the page's script only places what this returns. What it lets
through, and why that is safe to set as markup:

- **No HTML of the text's own.** ``html`` is off: a ``<script>``, an ``<img onerror=…>`` or an
  ``<iframe>`` in the model's answer (a prompt injection can put any text there) is shown as text.
- **Links to ``http(s)://host…`` and ``mailto:`` only**, judged on the address markdown-it decoded
  (entities, backslash escapes), so ``&#106;avascript:``, ``JaVaScRiPt:``, ``//host`` and
  ``http:/console/…`` (which a browser resolves against the console) are refused; a refused or
  empty address leaves its text as text, not a link. Every link gets
  ``rel="noopener noreferrer nofollow"``, opens in a new tab and has no ``title``. Addresses over
  :data:`LINK_CHARS` are refused (each use of a reference repeats it in the HTML).
- **No images.** ``![x](https://…)`` would make the admin's browser fetch an address the text
  chose (a read receipt for whoever planted it); it is shown as a link instead.
- **No inline styles.** A table's column alignment is a class (``align-right``): the console's CSP
  refuses ``style`` attributes.
- **The secrets stay masked.** The text is masked, made visible and cut first
  (:func:`gateway.console.text.shown`), then rendered. Markup and entities can join a secret that
  masking by value cannot see (``ab**cd**ef`` renders as ``abcdef``, ``ab&#99;def`` as ``abcdef``,
  in the text or in a link's address): when the HTML, its entities decoded (and percent-decoded
  too), holds anything the masker would mask, the message is shown as plain text instead. The mask
  itself (``***``) stays three stars, never a rule or emphasis. Characters an entity decodes to
  that ``shown`` makes visible (bidi overrides, zero-width and soft hyphens) are made visible again.
- **Bounded.** An answer is at most 8,000 characters, but a reference used a thousand times, or a
  table of 500 columns, renders to megabytes and takes a second: a table wider than
  :data:`TABLE_COLUMNS` is not rendered as one, and HTML over :data:`HTML_CHARS` falls back to
  the plain text. Rendering runs on one worker thread of its own (:func:`new_pool`, one per
  console, shut down with it), never on the loop nor in the default pool the store and the
  sandbox use.

Tables and strikethrough are on (models write them often); the rest is CommonMark.
"""

from __future__ import annotations

import concurrent.futures
import functools
import html
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt

from agent.redact import MASK
from gateway.console.text import made_visible

LINK_SCHEMES = frozenset({"http", "https", "mailto"})
LINK_CHARS = 2048
TABLE_COLUMNS = 32
"""A table with more columns is shown as its text: markdown-it fills every row to the header's
width, so 500 columns of a few characters each cost a second and megabytes."""
HTML_CHARS = 128 * 1024
"""Longest HTML one message renders to; over it the message is shown as plain text."""

_TAG = re.compile(r"<[^>]*>")
_WIDE_ROW = re.compile(rf"^(?:[^|\n]*\|){{{TABLE_COLUMNS}}}", re.M)
_STARS = "\ue000"  # a private-use character: plain text to Markdown, wherever it stands


def new_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The thread a console renders its pages' messages on (gateway/console/chat.py ``as_events``)."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="console-markdown")


def _allowed(url: str) -> bool:
    if len(url) > LINK_CHARS:
        return False
    try:
        parts = urlsplit(url)
    except ValueError:  # a malformed address (an unclosed IPv6 bracket) is no link
        return False
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        return bool(parts.netloc) and url[len(scheme) :].startswith("://")
    return scheme == "mailto" and bool(parts.path)


def _link_open(self: Any, tokens: Sequence[Any], idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    env["dropped"] = not _allowed(str(token.attrGet("href") or ""))
    if env["dropped"]:
        return ""  # its text is shown as text
    token.attrs.pop("title", None)  # a tooltip the text chose: the link's own text says enough
    token.attrSet("rel", "noopener noreferrer nofollow")
    token.attrSet("target", "_blank")
    return str(self.renderToken(tokens, idx, options, env))


def _link_close(self: Any, tokens: Sequence[Any], idx: int, options: Any, env: Any) -> str:
    return "" if env.pop("dropped", False) else str(self.renderToken(tokens, idx, options, env))


def _cell(self: Any, tokens: Sequence[Any], idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    style = str(token.attrs.pop("style", "") or "")
    if style.startswith("text-align:"):
        token.attrSet("class", "align-" + style.removeprefix("text-align:"))
    return str(self.renderToken(tokens, idx, options, env))


@functools.cache
def _renderer(tables: bool) -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"] if tables else ["strikethrough"])
    md.disable("image")
    md.validateLink = _allowed  # type: ignore[method-assign]
    md.add_render_rule("link_open", _link_open)
    md.add_render_rule("link_close", _link_close)
    md.add_render_rule("th_open", _cell)
    md.add_render_rule("td_open", _cell)
    md.render("warm")  # its rule chains are compiled on first use: not by two threads at once
    return md


@functools.lru_cache(maxsize=32)
def _render(text: str) -> str:
    """The HTML of ``text`` ("" when it is too large). Kept for the last few texts (at most
    32 x :data:`HTML_CHARS`): every page open on a chat gets each edit of a streaming answer, and a
    reload the whole page again."""
    md = _renderer(not _WIDE_ROW.search(text))
    out = md.render(text.replace(MASK, _STARS)).replace(_STARS, MASK)
    return made_visible(out) if len(out) <= HTML_CHARS else ""


def rendered(text: str, redact: Callable[[str], str]) -> str | None:
    """The HTML of ``text`` (already masked, made visible and cut), or None when the text is shown
    as it is: its rendered form would show a secret that markup split, or is too large. Safe on
    any thread.

    Where a secret could show: the HTML's text, its whole HTML with the entities decoded (the
    links' addresses, a fence's language), and that percent-decoded (what a browser and the site
    a click reaches read)."""
    out = _render(text)
    if not out:
        return None
    decoded = html.unescape(out)
    for seen in (html.unescape(_TAG.sub("", out)), decoded, unquote(decoded)):
        if redact(seen) != seen:
            return None
    return out
