"""Cut Markdown-ish text at a length limit without breaking code blocks: whole answers into parts
(:func:`split_markdown`), streamed snapshots into one message (:func:`stream_text`).

Shared by the adapters whose platforms take Markdown-like text (Discord, Slack mrkdwn, Lark cards).
Telegram uses telegramify-markdown's entity-aware splitter instead. No maintained library splits
fenced Markdown at an arbitrary limit while re-opening the fence in the next part, hence this module.
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"^\s*(```+|~~~+)(.*)$")


def split_markdown(text: str, limit: int) -> list[str]:
    """Cut ``text`` into parts of at most ``limit`` characters.

    Prefers paragraph, then line, then word boundaries. A code block cut in two is closed at the end
    of one part and re-opened (same fence and language) at the start of the next, so every part
    renders on its own. Returns ``[]`` only for blank input.
    """
    if limit < 16:
        raise ValueError("limit too small to split Markdown safely")
    if not text.strip():
        return []
    if len(text) <= limit:
        return [text]

    parts: list[str] = []
    current: list[str] = []
    size = 0
    fence: str | None = None  # the opening fence line of the code block we are inside

    def flush() -> None:
        nonlocal current, size
        body = "".join(current).rstrip("\n")
        if fence is not None:
            body += "\n" + _fence_marker(fence)
        if body.strip():
            parts.append(body)
        current = [fence + "\n"] if fence is not None else []
        size = len(current[0]) if current else 0

    for line in _lines_within(text, limit):
        m = _FENCE.match(line)
        closing_cost = len(_fence_marker(fence)) + 1 if fence is not None else 0
        if m and fence is None:
            # Opening a block: make sure at least the fence and a bit of content fit here.
            if size + len(line) + 8 > limit:
                flush()
        elif size + len(line) + closing_cost > limit:
            flush()
        current.append(line)
        size += len(line)
        if m:
            if fence is None:
                fence = line.rstrip("\n").strip()
            elif m.group(1).startswith(_fence_marker(fence)) and not m.group(2).strip():
                fence = None
    if fence is not None:
        fence = None  # an unterminated block is left as the author wrote it
    flush()
    return parts


def stream_text(text: str, limit: int) -> str:
    """An answer still being written, as one message of at most ``limit`` characters: cut with "…"
    when longer, and a code block it leaves open closed, so that the rest of the message does not
    render as code until the closing fence arrives."""
    room = limit
    while True:
        snapshot = text if len(text) <= room else text[: max(room - 1, 0)] + "…"
        fence = open_fence(snapshot)
        closing = f"\n{fence}" if fence else ""
        if len(snapshot) + len(closing) <= limit or room <= 1:
            return snapshot + closing
        room = limit - len(closing)


def open_fence(text: str) -> str | None:
    """The fence (```` ``` ````, ``~~~`` ...) of the code block ``text`` leaves open, or None."""
    fence: str | None = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if m is None:
            continue
        if fence is None:
            fence = m.group(1)
        elif m.group(1).startswith(fence) and not m.group(2).strip():
            fence = None
    return fence


def _fence_marker(fence: str | None) -> str:
    if not fence:
        return "```"
    m = _FENCE.match(fence)
    return m.group(1) if m else "```"


def _lines_within(text: str, limit: int) -> list[str]:
    """The text's lines (with their newlines), any line longer than the usable room cut at word
    boundaries (or hard, for a run without spaces)."""
    room = max(limit - 16, 8)  # leave space for a re-opened fence
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        while len(line) > room:
            cut = line.rfind(" ", 0, room)
            if cut <= room // 2:
                cut = room
            out.append(line[:cut] + "\n" if not line[:cut].endswith("\n") else line[:cut])
            line = line[cut:].lstrip(" ")
        if line:
            out.append(line)
    return out
