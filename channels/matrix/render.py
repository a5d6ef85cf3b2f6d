"""Markdown -> Matrix message content (``body`` plus ``org.matrix.custom.html``), on the shared
fence-aware splitter.

Every event the bot sends carries an empty ``m.mentions``: since spec v1.7 a client that sees
``m.mentions`` notifies only whom it lists, so an ``@room`` or a user id the model echoed (from a
web page, a quoted message) pings nobody. Links to ``matrix.to`` (pills: they render as a person's
name) are shown as their text instead, so nobody is mentioned or impersonated in the bot's voice.
Raw HTML in the model's Markdown is escaped (markdown-it with ``html`` off).

Matrix caps an event at 65,536 bytes of JSON; the body and its HTML twice make a part of
:data:`MAX_LEN` characters safe even for multi-byte text.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from markdown_it import MarkdownIt

from channels.base import Rendered, ReplyTarget
from channels.textsplit import split_markdown, stream_text

MAX_LEN = 8000
_MD = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(["table", "strikethrough"])
_PILL = re.compile(r'<a href="https?://matrix\.to/[^"]*">(.*?)</a>', re.DOTALL)


def to_html(markdown: str) -> str:
    """The HTML Matrix clients show for ``markdown``: no raw HTML, no pills."""
    return _PILL.sub(r"\1", _MD.render(markdown)).strip()


def content(text: str) -> dict[str, Any]:
    """An ``m.text`` content for a part of Markdown ``text``."""
    return {
        "msgtype": "m.text",
        "body": text,
        "format": "org.matrix.custom.html",
        "formatted_body": to_html(text),
        "m.mentions": {},
    }


def render(markdown: str, limit: int = MAX_LEN) -> list[Rendered]:
    parts = split_markdown(markdown, limit) or ([markdown.strip()[:limit]] if markdown.strip() else [])
    return [Rendered(text=p, payload=content(p)) for p in parts]


def render_stream(markdown: str, limit: int = MAX_LEN) -> Rendered:
    text = stream_text(markdown, limit) or "…"
    return Rendered(text=text, payload=content(text))


def txn(key: str) -> str:
    """A transaction id stable for a reply part across restarts (the homeserver's dedupe key)."""
    return "chital-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def relates(target: ReplyTarget) -> dict[str, Any]:
    """A reply (``m.in_reply_to``) to the user's event; inside a thread, a thread event with the
    reply fallback, so the answer stays in the thread."""
    reply = {"event_id": target.reply_to} if target.reply_to else None
    if target.thread_id:
        rel: dict[str, Any] = {"rel_type": "m.thread", "event_id": target.thread_id}
        if reply:
            rel.update({"is_falling_back": False, "m.in_reply_to": reply})
        return {"m.relates_to": rel}
    return {"m.relates_to": {"m.in_reply_to": reply}} if reply else {}
