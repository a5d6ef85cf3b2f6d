"""Markdown -> WeCom message parts, on the shared fence-aware splitter.

WeCom's stream reply and its proactive ``markdown`` message both take Markdown as it is, so the
model's Markdown is passed through; what is changed is what would act in the bot's voice: a
``<@userid>`` mention (WeCom's Markdown mention syntax) gets a zero-width space after its ``<``, so
an echoed id pings nobody.

Size: a stream's ``content`` is at most 20,480 bytes of UTF-8. A part is at most :data:`MAX_LEN`
characters *and* :data:`MAX_PART_BYTES` bytes (6,000 CJK characters are 18 kB; 6,000 emoji would
be 24 kB, so such a part is split again).

Which part is final: the stream protocol needs ``finish: true`` on the last update of a stream,
and the adapter contract has no "last" flag. The final answer comes through :func:`render` and
a snapshot through :func:`render_stream`, so each part says which it is (``payload["final"]``).
"""

from __future__ import annotations

import re

from channels.base import Rendered
from channels.textsplit import split_markdown, stream_text

MAX_LEN = 6000
MAX_PART_BYTES = 20_000
"""Under the 20,480 bytes WeCom takes in one stream ``content``, with room for the JSON escaping
of nothing (the content is counted before escaping)."""
FINAL = "final"
_MENTION = re.compile(r"<(?=@)")


def defang(text: str) -> str:
    """``text`` with every ``<@`` mention broken (a zero-width space after the ``<``)."""
    return _MENTION.sub("<\u200b", text)


def _fits(text: str) -> bool:
    return len(text.encode()) <= MAX_PART_BYTES


def render(markdown: str, limit: int = MAX_LEN) -> list[Rendered]:
    parts = split_markdown(markdown, limit) or ([markdown.strip()[:limit]] if markdown.strip() else [])
    out: list[Rendered] = []
    for part in parts:
        text = defang(part)
        if not _fits(text) and limit > 200:
            out.extend(render(part, limit // 2))
        else:
            out.append(Rendered(text=text, payload={FINAL: True}))
    return out


def render_stream(markdown: str, limit: int = MAX_LEN) -> Rendered:
    text = defang(stream_text(markdown, limit) or "…")
    while not _fits(text) and limit > 200:
        limit //= 2
        text = defang(stream_text(markdown, limit))
    return Rendered(text=text)


def is_final(part: Rendered) -> bool:
    return bool(part.payload.get(FINAL))
