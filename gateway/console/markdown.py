"""The agent's Markdown as the web chat shows it: rendered on the server into a small, fixed set of
HTML, so the page's script never builds markup from text.

Why on the server: one renderer (markdown-it-py, CommonMark) that the tests attack, instead of a
script library in the page; and the page's script only places what this returns. What it lets
through, and why that is safe to set as markup:

- **No HTML of the text's own.** ``html`` is off: a ``<script>``, an ``<img onerror=…>`` or an
  ``<iframe>`` in the model's answer (a prompt injection can put any text there) is shown as text.
- **Links to ``http``, ``https`` and ``mailto`` only**, judged on the address markdown-it decoded
  (entities, percent-encoding), so ``&#106;avascript:`` and ``JaVaScRiPt:`` are plain text; every
  link gets ``rel="noopener noreferrer nofollow"`` and opens in a new tab.
- **No images.** ``![x](https://…)`` would make the admin's browser fetch an address the text
  chose (a read receipt for whoever planted it); it is shown as a link instead. The console's CSP
  (``default-src 'self'``) would block it anyway, and an inline script too, should anything slip.
- **The secrets stay masked.** The text is masked, made visible and cut first
  (:func:`gateway.console.text.shown`), then rendered. Markup can split a secret that masking by
  value cannot see (``ab**cd**ef`` renders as ``abcdef``): when the rendered text, tags dropped,
  holds anything the masker would mask, the message is shown as plain text instead.

Tables and strikethrough are on (models write them often); the rest is CommonMark.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from markdown_it import MarkdownIt

LINK_SCHEMES = frozenset({"http", "https", "mailto"})
_TAG = re.compile(r"<[^>]*>")


def _allowed(url: str) -> bool:
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError:  # a malformed address (an unclosed IPv6 bracket) is no link
        return False
    return scheme in LINK_SCHEMES


def _link_open(self: Any, tokens: Sequence[Any], idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    token.attrs.pop("title", None)  # a tooltip the text chose: the link's own text says enough
    token.attrSet("rel", "noopener noreferrer nofollow")
    token.attrSet("target", "_blank")
    return str(self.renderToken(tokens, idx, options, env))


@functools.cache
def _renderer() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.disable("image")
    md.validateLink = _allowed  # type: ignore[method-assign]
    md.add_render_rule("link_open", _link_open)
    return md


@functools.lru_cache(maxsize=64)
def _render(text: str) -> tuple[str, str]:
    """The HTML of ``text`` and the text it shows. Kept for the last few texts: every page open on a
    chat gets each edit of a streaming answer, and a reload the whole page again."""
    out = _renderer().render(text)
    return out, html.unescape(_TAG.sub("", out))


def rendered(text: str, redact: Callable[[str], str]) -> str | None:
    """The HTML of ``text`` (already masked, made visible and cut), or None when the rendered form
    would show a secret that markup split (the caller shows the plain text then). Safe on any
    thread (the console renders a page's messages on a worker thread)."""
    out, seen = _render(text)
    return None if redact(seen) != seen else out
