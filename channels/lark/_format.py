"""Lark message formats: answers out as interactive cards, user messages in as plain text.

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

from channels.base import Attachment, Rendered
from channels.textsplit import split_markdown

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
    text = markdown if len(markdown) <= limit else markdown[: limit - 1] + "…"
    fence: str | None = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if m and (fence is None or m.group(1).startswith(fence)):
            fence = None if fence is not None else m.group(1)
    if fence is not None:
        text += "\n" + fence
    return rendered_card(text or "…")


# -- inbound -------------------------------------------------------------------------------------


def attachment_id(message_id: str, kind: str, key: str) -> str:
    """The handle :meth:`LarkChannel.download` needs: resources are fetched per (message, key)."""
    return f"{message_id}|{kind}|{key}"


def parse_attachment_id(file_id: str) -> tuple[str, str, str]:
    message_id, kind, key = file_id.split("|", 2)
    return message_id, kind, key


def message_text(msg_type: str, content: str, message_id: str) -> tuple[str, list[Attachment]]:
    """Plain text and attachments of a received message (``content`` is the event's JSON string)."""
    try:
        data = json.loads(content or "{}")
    except ValueError:
        return content or "", []
    if not isinstance(data, dict):
        return str(data), []
    if msg_type == "text":
        return str(data.get("text", "")), []
    if msg_type == "post":
        return _post_text(data, message_id)
    if msg_type == "image" and data.get("image_key"):
        key = str(data["image_key"])
        return "", [Attachment(attachment_id(message_id, "image", key), "image.png", "image/png")]
    if msg_type in ("file", "audio", "media") and data.get("file_key"):
        key = str(data["file_key"])
        default = {"audio": "audio.opus", "media": "video.mp4"}.get(msg_type, "file")
        name = str(data.get("file_name") or default)
        return "", [Attachment(attachment_id(message_id, "file", key), name)]
    return f"[{msg_type} message]", []


def _post_text(data: dict[str, Any], message_id: str) -> tuple[str, list[Attachment]]:
    # A received post is {"title", "content": [[element, ...], ...]}; a sent one nests it per locale.
    if "content" not in data:
        data = next((v for v in data.values() if isinstance(v, dict) and "content" in v), {})
    lines: list[str] = [str(data["title"])] if data.get("title") else []
    attachments: list[Attachment] = []
    for paragraph in data.get("content") or []:
        chunks: list[str] = []
        for el in paragraph or []:
            if not isinstance(el, dict):
                continue
            tag = el.get("tag")
            if tag in ("text", "md"):
                chunks.append(str(el.get("text", "")))
            elif tag == "a":
                label, href = str(el.get("text") or ""), str(el.get("href") or "")
                chunks.append(f"{label} ({href})" if label and label != href else href)
            elif tag == "at":
                chunks.append(str(el.get("user_id") or el.get("user_name") or ""))
            elif tag == "code_block":
                lang = str(el.get("language") or "").lower()
                chunks.append(f"```{lang}\n{el.get('text', '')}\n```")
            elif tag == "img" and el.get("image_key"):
                key = str(el["image_key"])
                attachments.append(
                    Attachment(attachment_id(message_id, "image", key), "image.png", "image/png"))
            elif tag == "media" and el.get("file_key"):
                key = str(el["file_key"])
                attachments.append(Attachment(attachment_id(message_id, "file", key), "video.mp4"))
        line = "".join(chunks).strip()
        if line:
            lines.append(line)
    return "\n".join(lines), attachments


def resolve_mentions(text: str, mentions: list[tuple[str, str, str]], bot_open_id: str) -> str:
    """Replace ``@_user_N`` placeholders: the bot's are removed (with one adjacent space), others
    become ``@Name``. Other whitespace is left alone (users paste indented code)."""
    for key, name, open_id in sorted(mentions, key=lambda m: -len(m[0])):  # @_user_10 before @_user_1
        if not key:
            continue
        if open_id == bot_open_id:
            text = re.sub(re.escape(key) + r"(?![0-9])[ \t]?", "", text)
        else:
            text = re.sub(re.escape(key) + r"(?![0-9])", lambda _m, n=name or open_id: f"@{n}", text)
    return text.strip()
