"""Markdown → Discord message parts (2,000 characters each), on the shared fence-aware splitter.

Discord renders most Markdown natively (bold, italics, code, fences, lists, quotes, links, # to ###).
It lacks tables, setext and level 4-6 headings, rules and inline images: those are rewritten here,
located with markdown-it's block map so that code blocks are never touched.
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

from channels.base import Rendered
from channels.textsplit import split_markdown, stream_text

MAX_LEN = 2000


def render(markdown: str) -> list[Rendered]:
    parts = split_markdown(to_discord_markdown(markdown), MAX_LEN)
    if not parts:
        return [Rendered(text="…")]
    # Only the first part is a visible reply; the rest follow it without repeating the quote.
    return [Rendered(text=p, payload={"part": i}) for i, p in enumerate(parts)]


def render_stream(markdown: str) -> Rendered:
    return Rendered(text=stream_text(to_discord_markdown(markdown), MAX_LEN))


_MD = MarkdownIt("commonmark").enable("table")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CELL_MARKUP = re.compile(r"\*\*|__|`")
_CODE_SPAN = re.compile(r"(`+[^`]*`+)")


def to_discord_markdown(markdown: str) -> str:
    """Rewrite what Discord cannot show: tables → aligned code blocks, h4-h6 and setext headings →
    bold or ``#`` headings, ``---`` rules → a line, images → links."""
    text = markdown.replace("\r\n", "\n")
    lines = text.split("\n")
    tokens = _MD.parse(text)
    replace: dict[int, tuple[int, list[str]]] = {}  # start line -> (end line, new lines)
    code: set[int] = set()
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.map is None:
            i += 1
            continue
        start, end = tok.map
        if tok.type in ("fence", "code_block"):
            code.update(range(start, end))
        elif tok.level > 0:
            pass  # inside a list or quote: rewriting would lose the prefix; Discord shows it as text
        elif tok.type == "table_open":
            rows: list[list[str]] = []
            while tokens[i].type != "table_close":
                t = tokens[i]
                if t.type == "tr_open":
                    rows.append([])
                elif t.type == "inline" and rows:
                    rows[-1].append(_CELL_MARKUP.sub("", t.content).strip())
                i += 1
            replace[start] = (end, _table_block(rows))
        elif tok.type == "heading_open":
            title, level = tokens[i + 1].content, int(tok.tag[1])
            if level > 3 or not tok.markup.startswith("#"):  # Discord knows only ATX # to ###
                replace[start] = (end, [f"{'#' * level} {title}" if level <= 3 else f"**{title}**"])
        elif tok.type == "hr":
            replace[start] = (end, ["──────────"])
        i += 1
    out: list[str] = []
    n = 0
    while n < len(lines):
        if n in replace:
            end, new = replace[n]
            out.extend(new)
            n = max(end, n + 1)
            continue
        out.append(lines[n] if n in code else _images_to_links(lines[n]))
        n += 1
    return "\n".join(out)


def _images_to_links(line: str) -> str:
    """Discord shows no inline images: keep them as links (outside inline code spans)."""
    pieces = _CODE_SPAN.split(line)
    for k in range(0, len(pieces), 2):
        pieces[k] = _IMAGE.sub(lambda m: f"[{m[1].strip()}]({m[2]})" if m[1].strip() else m[2], pieces[k])
    return "".join(pieces)


def _table_block(rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    cols = max(len(r) for r in rows)
    rows = [r + [""] * (cols - len(r)) for r in rows]
    widths = [max(len(r[c]) for r in rows) for c in range(cols)]

    def fmt(row: list[str]) -> str:
        return " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()

    body = [fmt(rows[0]), "-+-".join("-" * w for w in widths)] + [fmt(r) for r in rows[1:]]
    return ["```", *body, "```"]
