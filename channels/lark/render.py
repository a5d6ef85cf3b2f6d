"""Markdown → Lark interactive cards (user messages in: :mod:`.inbound`).

Answers go out as JSON 2.0 cards with one ``markdown`` element (the form the SDK's own channel layer
uses; Feishu/Lark clients >= 7.20 render it). Its Markdown covers what models write: headings, lists,
emphasis, links, code blocks, quotes, tables. What it treats differently is converted:

* ``<tag ...>`` outside code is card markup there (``<at id=all></at>`` would notify a whole group,
  ``<font>``, ``<person>``...). A zero-width space after ``<`` keeps such text literal;
* images must be uploaded ``image_key``s, so ``![alt](https://...)`` becomes a plain link.

A card must stay under 30 KB of JSON (the API refuses larger). Parts are cut at 8,000 characters with
the shared fence-aware splitter (at most ~24 KB of CJK text as UTF-8) and cut again when escaping
pushes one over :data:`MAX_CARD_BYTES`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from channels.base import Rendered
from channels.textsplit import split_markdown, stream_text

MAX_PART_CHARS = 8000
MAX_CARD_BYTES = 28 * 1024

_FENCE = re.compile(r"^\s*(```+|~~~+)")
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!])")
_REMOTE_IMAGE = re.compile(r"!\[([^\]]*)\]\((https?://[^)\s]+)\)")


def card_markdown(markdown: str) -> str:
    """Make Markdown safe for a card's markdown element (see module docstring)."""
    out: list[str] = []
    fence: str | None = None
    for line in markdown.splitlines(keepends=True):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1).startswith(fence):
                fence = None
            out.append(line)
            continue
        if m:
            fence = m.group(1)
            out.append(line)
            continue
        line = _REMOTE_IMAGE.sub(lambda im: f"[{im.group(1) or 'image'}]({im.group(2)})", line)
        out.append(_TAG_OPEN.sub("<\u200b", line))
    return "".join(out)


def card(markdown: str) -> dict[str, Any]:
    """A shared (``update_multi``) card, so it can be PATCHed in place while streaming."""
    return {
        "schema": "2.0",
        "config": {"update_multi": True},
        "body": {"elements": [{"tag": "markdown", "content": card_markdown(markdown) or " "}]},
    }


def card_content(markdown: str) -> str:
    return json.dumps(card(markdown), ensure_ascii=False)


def rendered_card(markdown: str) -> Rendered:
    return Rendered(text=markdown, payload={"msg_type": "interactive", "content": card_content(markdown)})


def render(markdown: str, limit: int = MAX_PART_CHARS) -> list[Rendered]:
    parts: list[Rendered] = []
    for piece in split_markdown(markdown, limit):
        part = rendered_card(piece)
        size = len(part.payload["content"].encode())
        if size > MAX_CARD_BYTES and limit > 500:
            parts.extend(render(piece, max(500, int(limit * MAX_CARD_BYTES / size * 0.9))))
        else:
            parts.append(part)
    return parts


def render_stream(markdown: str, limit: int = MAX_PART_CHARS) -> Rendered:
    """An in-progress snapshot: cut to the limit, an unfinished code block closed so the rest of the
    card does not render as code."""
    return rendered_card(stream_text(markdown, limit) or "…")
