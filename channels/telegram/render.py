"""Markdown → Telegram message parts (text + entities), split at the 4096 UTF-16 unit limit.

We send ``entities`` instead of a parse mode: an entity list cannot fail on an unescaped character the
way MarkdownV2/HTML can. telegramify-markdown converts and splits (clipping an entity that spans a cut
into both parts, so a code block cut in two stays a code block in each); we only tidy the cut edges and
drop links Telegram would refuse.
"""

from __future__ import annotations

import logging

import telegramify_markdown
from telegramify_markdown import MessageEntity, split_entities, utf16_len

from channels.base import Rendered
from channels.textsplit import split_markdown

log = logging.getLogger(__name__)

MAX_MESSAGE_UTF16 = 4096
MAX_CAPTION_UTF16 = 1024
# Telegram rejects a text_link whose URL it cannot open ("wrong HTTP URL"); a relative link in an
# answer would otherwise make the whole message fail.
_LINK_SCHEMES = ("http://", "https://", "tg://", "ton://")


def render_markdown(markdown: str, limit: int = MAX_MESSAGE_UTF16) -> list[Rendered]:
    """The answer as Telegram parts of at most ``limit`` UTF-16 units, each with its entities.

    Falls back to plain Markdown text split by :func:`split_markdown` if conversion fails, and never
    returns an empty list for non-blank input."""
    try:
        text, entities = telegramify_markdown.convert(markdown)
        parts = [_part(t, es) for t, es in split_entities(text, entities, limit)]
        parts = [p for p in parts if p.text]
        if parts:
            return parts
    except Exception:  # a converter bug must not cost the user the answer
        log.warning("telegramify-markdown failed; sending the answer as plain text", exc_info=True)
    return plain_parts(markdown, limit)


def plain_parts(text: str, limit: int = MAX_MESSAGE_UTF16) -> list[Rendered]:
    """Plain text split at ``limit`` UTF-16 units (code fences kept balanced per part)."""
    # split_markdown counts code points; with characters outside the BMP each may take two units.
    room = limit if utf16_len(text) == len(text) else limit // 2
    parts = [Rendered(p) for p in split_markdown(text, room) if p.strip()]
    return parts or [Rendered(truncate(text, limit).strip() or "…")]


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-16 units, with an ellipsis when cut."""
    if utf16_len(text) <= limit:
        return text
    raw = text.encode("utf-16-le")[: 2 * (limit - 1)]
    return raw.decode("utf-16-le", "ignore") + "…"


def _part(text: str, entities: list[MessageEntity]) -> Rendered:
    """Trim the blank lines a cut leaves at a part's edges and re-base the entities on the result."""
    body = text.lstrip("\r\n")
    lead = utf16_len(text) - utf16_len(body)
    body = body.rstrip()
    size = utf16_len(body)
    out: list[dict[str, object]] = []
    for ent in entities:
        if ent.type == "text_link" and not (ent.url or "").startswith(_LINK_SCHEMES):
            continue
        start, end = max(ent.offset - lead, 0), min(ent.offset + ent.length - lead, size)
        if end > start:
            out.append({**ent.to_dict(), "offset": start, "length": end - start})
    return Rendered(body, {"entities": out})
