"""Markdown -> Matrix message content (``body`` plus ``org.matrix.custom.html``), on the shared
fence-aware splitter.

Every event the bot sends carries an empty ``m.mentions``: since spec v1.7 a client that sees
``m.mentions`` notifies only whom it lists, so an ``@room`` or a user id the model echoed (from a
web page, a quoted message) pings nobody. Links to ``matrix.to`` (pills: they render as a person's
name) are shown as their text instead, so nobody is mentioned or impersonated in the bot's voice.
Raw HTML in the model's Markdown is escaped (markdown-it with ``html`` off).

Size: a homeserver refuses an event over 65,536 bytes of JSON (``M_TOO_LARGE``), and an edit
carries its text twice more (the ``* `` fallback and ``m.new_content``). So a part is at most
:data:`MAX_LEN` characters *and* its body plus HTML at most :data:`MAX_PART_BYTES` of UTF-8
(4,000 emoji are 16 kB; 4,000 ``<`` are 16 kB of ``&lt;``); a part over the bytes is split again.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from markdown_it import MarkdownIt

from channels.base import Rendered, ReplyTarget
from channels.textsplit import split_markdown, stream_text

MAX_LEN = 4000
MAX_PART_BYTES = 30_000
"""Body plus formatted body of one part, in UTF-8 bytes: an edit event (about 1.5 times this)
stays well under the 65,536-byte event limit."""
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


def size(payload: dict[str, Any]) -> int:
    """UTF-8 bytes of a content's body and formatted body."""
    return len(payload["body"].encode()) + len(payload.get("formatted_body", "").encode())


def render(markdown: str, limit: int = MAX_LEN) -> list[Rendered]:
    parts = split_markdown(markdown, limit) or ([markdown.strip()[:limit]] if markdown.strip() else [])
    out: list[Rendered] = []
    for part in parts:
        payload = content(part)
        if size(payload) > MAX_PART_BYTES and limit > 200:
            out.extend(render(part, limit // 2))  # multi-byte text or heavy markup: smaller parts
        else:
            out.append(Rendered(text=part, payload=payload))
    return out


def render_stream(markdown: str, limit: int = MAX_LEN) -> Rendered:
    text = stream_text(markdown, limit) or "…"
    payload = content(text)
    while size(payload) > MAX_PART_BYTES and len(text) > 200:
        text = stream_text(markdown, len(text) // 2)
        payload = content(text)
    return Rendered(text=text, payload=payload)


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
