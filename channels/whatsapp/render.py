"""Markdown -> WhatsApp's own formatting, split at its 4,096-character limit.

WhatsApp reads ``*bold*``, ``_italic_``, ``~strike~``, ```` ```monospace``` ```` and `` `code` ``,
``> quote`` and ``- `` / ``1. `` lists; it has no links with text, no headings, no tables. So
``**x**`` becomes ``*x*``, a single ``*x*`` becomes ``_x_``, ``~~x~~`` ``~x~``, a heading a bold
line and ``[text](url)`` ``text (url)``. Code (fenced or inline) is left exactly as written.
WhatsApp has no mentions a business message could misuse and renders no HTML, so nothing else
needs escaping.
"""

from __future__ import annotations

import re

from channels.base import Rendered
from channels.textsplit import split_markdown, stream_text

MAX_LEN = 4096
"""Characters of a text message's body (Cloud API ``text.body``)."""
_CODE = re.compile(r"(```.*?(?:```|\Z)|`[^`\n]*`)", re.DOTALL)
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![\*\w])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\*\w])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_LINK = re.compile(r"!?\[([^\]\n]*)\]\((\S+?)\)")
_BOLD_MARK = "\x00B\x00"


def _prose(text: str) -> str:
    text = _LINK.sub(lambda m: f"{m[1]} ({m[2]})" if m[1] and m[1] != m[2] else m[2], text)
    text = _HEADING.sub(lambda m: f"{_BOLD_MARK}{m[1]}{_BOLD_MARK}", text)
    text = _BOLD.sub(lambda m: f"{_BOLD_MARK}{m[1] or m[2]}{_BOLD_MARK}", text)
    text = _ITALIC.sub(r"_\1_", text)
    text = _STRIKE.sub(r"~\1~", text)
    return text.replace(_BOLD_MARK, "*")


def to_whatsapp(markdown: str) -> str:
    """``markdown`` in WhatsApp's formatting; code spans and blocks untouched."""
    pieces = _CODE.split(markdown.replace("\x00", ""))
    return "".join(p if i % 2 else _prose(p) for i, p in enumerate(pieces)).strip()


def render(markdown: str, limit: int = MAX_LEN) -> list[Rendered]:
    text = to_whatsapp(markdown)
    parts = split_markdown(text, limit) or ([text[:limit]] if text else [])
    if not parts and markdown.strip():
        parts = [markdown.strip()[:limit]]
    return [Rendered(text=p) for p in parts]


def render_stream(markdown: str, limit: int = MAX_LEN) -> Rendered:
    return Rendered(text=stream_text(to_whatsapp(markdown), limit) or "…")
