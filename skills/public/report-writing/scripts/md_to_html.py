#!/usr/bin/env python3
"""Turn a Markdown report into one self-contained, print-friendly HTML file.

    python3 md_to_html.py /mnt/user-data/outputs/q3-churn.md            # writes q3-churn.html
    python3 md_to_html.py report.md -o /mnt/user-data/outputs/report.html --title "Q3 churn"

Uses markdown-it-py or Python-Markdown when installed; otherwise a built-in converter for the
Markdown reports use (headings, paragraphs, emphasis, links, images, lists, tables, block quotes,
code, rules). Local images are embedded as data: URIs so the file works on its own when
forwarded. Raw HTML in the Markdown is escaped by the built-in converter.
"""

from __future__ import annotations

import argparse
import base64
import html
import mimetypes
import re
import sys
from pathlib import Path

CSS = """
body { font: 16px/1.6 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: #1f2328;
       max-width: 46rem; margin: 2.5rem auto; padding: 0 1.25rem; }
h1 { font-size: 1.9rem; line-height: 1.25; margin: 0 0 .5rem; }
h2 { font-size: 1.4rem; margin-top: 2.2rem; padding-bottom: .3rem; border-bottom: 1px solid #d8dee4; }
h3 { font-size: 1.15rem; margin-top: 1.6rem; }
a { color: #0969da; }
img { max-width: 100%; height: auto; display: block; margin: 1rem auto; }
table { border-collapse: collapse; margin: 1rem 0; width: auto; font-size: .95rem; }
th, td { border: 1px solid #d0d7de; padding: .35rem .7rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
tr:nth-child(even) td { background: #fbfcfd; }
code { font: .9em ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f6f8fa;
       padding: .1em .3em; border-radius: 4px; }
pre { background: #f6f8fa; padding: .8rem 1rem; border-radius: 6px; overflow-x: auto; }
pre code { background: none; padding: 0; }
blockquote { margin: 1rem 0; padding: .2rem 1rem; color: #57606a; border-left: 4px solid #d0d7de; }
hr { border: 0; border-top: 1px solid #d8dee4; margin: 2rem 0; }
@media print { body { margin: 0; max-width: none; font-size: 11pt; } a { color: inherit; }
               h2 { break-after: avoid; } table, img, pre { break-inside: avoid; } }
"""


# ---- built-in converter --------------------------------------------------------------------------


def slug(text: str) -> str:
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\s-]", "", html.unescape(text).lower()).strip()
    return re.sub(r"\s+", "-", text)


def inline(text: str) -> str:
    """Inline Markdown → HTML: code spans first (their content is literal), then the rest."""
    parts = re.split(r"(`+)(.+?)\1", text)
    out: list[str] = []
    # re.split with two groups yields: text, ticks, code, text, ticks, code, ...
    for i in range(0, len(parts), 3):
        out.append(_inline_text(parts[i]))
        if i + 2 < len(parts):
            out.append(f"<code>{html.escape(parts[i + 2].strip())}</code>")
    return "".join(out)


def _inline_text(text: str) -> str:
    s = html.escape(text, quote=False)
    s = re.sub(r"\\([\\`*_{}\[\]()#+\-.!|~>])", lambda m: f"&#{ord(m.group(1))};", s)
    s = re.sub(
        r"!\[([^\]]*)\]\(\s*([^)\s]+)(?:\s+&quot;([^&]*)&quot;|\s+\"([^\"]*)\")?\s*\)",
        lambda m: (
            f'<img src="{_attr(m.group(2))}" alt="{_attr(m.group(1))}"'
            + (f' title="{_attr(m.group(3) or m.group(4))}"' if (m.group(3) or m.group(4)) else "")
            + ">"
        ),
        s,
    )
    s = re.sub(
        r"\[([^\]]+)\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)",
        lambda m: f'<a href="{_attr(m.group(2))}">{m.group(1)}</a>',
        s,
    )
    s = re.sub(r"&lt;(https?://[^\s&]+)&gt;", lambda m: f'<a href="{_attr(m.group(1))}">{m.group(1)}</a>', s)
    s = re.sub(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1", r"<strong>\2</strong>", s)
    s = re.sub(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?!\*)", r"<em>\1</em>", s)
    s = re.sub(r"(?<![\w_])_(?=\S)(.+?)(?<=\S)_(?![\w_])", r"<em>\1</em>", s)
    s = re.sub(r"~~(?=\S)(.+?)(?<=\S)~~", r"<del>\1</del>", s)
    return re.sub(r" {2,}$", "<br>", s)


def _attr(value: str) -> str:
    return html.escape(html.unescape(value), quote=True)


_LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)])\s+(.*)$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def _cells(line: str) -> list[str]:
    inner = line.strip()
    if inner.startswith("|"):
        inner = inner[1:]
    if inner.endswith("|") and not inner.endswith("\\|"):
        inner = inner[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def _list_html(items: list[tuple[int, bool, str]]) -> str:
    """Nested lists from (indent, ordered, text) items."""
    out: list[str] = []
    stack: list[tuple[int, str]] = []
    for indent, ordered, text in items:
        tag = "ol" if ordered else "ul"
        while stack and indent < stack[-1][0]:
            out.append(f"</li></{stack.pop()[1]}>")
        if not stack or indent > stack[-1][0]:
            stack.append((indent, tag))
            out.append(f"<{tag}><li>")
        else:
            out.append("</li><li>")
        out.append(inline(text))
    while stack:
        out.append(f"</li></{stack.pop()[1]}>")
    return "".join(out)


def convert_builtin(text: str) -> str:
    lines = text.splitlines()
    out: list[str] = []
    para: list[str] = []
    i = 0

    def flush() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(p.strip() for p in para))}</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        fence = re.match(r"^\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)", line)
        if fence:
            flush()
            marker, lang = fence.group(1), fence.group(2)
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                body.append(lines[i])
                i += 1
            cls = f' class="language-{lang}"' if lang else ""
            out.append(f"<pre><code{cls}>{html.escape(chr(10).join(body))}</code></pre>")
            i += 1
            continue
        heading = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if heading:
            flush()
            level, content = len(heading.group(1)), inline(heading.group(2))
            out.append(f'<h{level} id="{slug(content)}">{content}</h{level}>')
        elif not stripped:
            flush()
        elif re.match(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$", line):
            flush()
            out.append("<hr>")
        elif stripped.startswith(">"):
            flush()
            quote: list[str] = []
            while i < len(lines) and lines[i].strip().startswith(">"):
                quote.append(re.sub(r"^\s*>\s?", "", lines[i]))
                i += 1
            out.append(f"<blockquote>{convert_builtin(chr(10).join(quote))}</blockquote>")
            continue
        elif (
            "|" in stripped and i + 1 < len(lines) and _TABLE_SEP.match(lines[i + 1]) and "-" in lines[i + 1]
        ):
            flush()
            aligns = []
            for cell in _cells(lines[i + 1]):
                left, right = cell.startswith(":"), cell.endswith(":")
                aligns.append("center" if left and right else "right" if right else "left" if left else "")
            header = _cells(line)
            rows_html = ["<thead><tr>"]
            for j, cell in enumerate(header):
                style = f' style="text-align:{aligns[j]}"' if j < len(aligns) and aligns[j] else ""
                rows_html.append(f"<th{style}>{inline(cell)}</th>")
            rows_html.append("</tr></thead><tbody>")
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                cells = _cells(lines[i])
                cells = (cells + [""] * len(header))[: len(header)]
                rows_html.append("<tr>")
                for j, cell in enumerate(cells):
                    style = f' style="text-align:{aligns[j]}"' if j < len(aligns) and aligns[j] else ""
                    rows_html.append(f"<td{style}>{inline(cell)}</td>")
                rows_html.append("</tr>")
                i += 1
            out.append("<table>" + "".join(rows_html) + "</tbody></table>")
            continue
        elif _LIST_ITEM.match(line) and not para:
            items: list[tuple[int, bool, str]] = []
            while i < len(lines):
                m = _LIST_ITEM.match(lines[i])
                if m:
                    items.append((len(m.group(1).expandtabs(4)), m.group(2)[0].isdigit(), m.group(3)))
                elif lines[i].strip() and items and lines[i].startswith((" ", "\t")):
                    indent, ordered, prev = items[-1]
                    items[-1] = (indent, ordered, f"{prev} {lines[i].strip()}")
                else:
                    break
                i += 1
            out.append(_list_html(items))
            continue
        else:
            para.append(line)
        i += 1
    flush()
    return "\n".join(out)


# ---- the document --------------------------------------------------------------------------------


def convert(text: str, *, builtin: bool = False) -> str:
    """Markdown → HTML body, with the best converter available."""
    if not builtin:
        try:
            from markdown_it import MarkdownIt

            return (
                MarkdownIt("commonmark", {"html": False}).enable("table").enable("strikethrough").render(text)
            )
        except ImportError:
            pass
        try:
            import markdown

            return markdown.markdown(text, extensions=["tables", "fenced_code", "sane_lists"])
        except ImportError:
            pass
    return convert_builtin(text)


def embed_images(body: str, base: Path) -> tuple[str, list[str]]:
    """Replace local ``<img src>`` files with data: URIs; returns the body and the missing files."""
    missing: list[str] = []

    def replace(m: re.Match[str]) -> str:
        src = html.unescape(m.group(2))
        if re.match(r"^[a-z][a-z0-9+.-]*:", src, re.I):
            return m.group(0)
        path = Path(src) if Path(src).is_absolute() else base / src
        if not path.is_file():
            missing.append(src)
            return m.group(0)
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix.lower() == ".svg":
            mime = "image/svg+xml"
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'{m.group(1)}"data:{mime};base64,{data}"'

    return re.sub(r'(<img\b[^>]*?\bsrc=)"([^"]+)"', replace, body), missing


def document(
    markdown_text: str, base: Path, *, title: str | None = None, builtin: bool = False
) -> tuple[str, list[str]]:
    body, missing = embed_images(convert(markdown_text, builtin=builtin), base)
    if title is None:
        h1 = re.search(r"^#\s+(.+?)\s*#*\s*$", markdown_text, re.M)
        title = re.sub(r"[*_`]", "", h1.group(1)) if h1 else base.name
    page = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
    return page, missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Markdown report → self-contained HTML.")
    parser.add_argument("markdown")
    parser.add_argument("-o", "--output", help="output .html (default: next to the input)")
    parser.add_argument("--title", help="page title (default: the first '# ' heading)")
    parser.add_argument("--builtin", action="store_true", help="use the built-in converter")
    args = parser.parse_args(argv)
    source = Path(args.markdown)
    try:
        text = source.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"md_to_html.py: cannot read {source}: {exc}", file=sys.stderr)
        return 2
    page, missing = document(text, source.parent, title=args.title, builtin=args.builtin)
    target = Path(args.output) if args.output else source.with_suffix(".html")
    target.write_text(page, encoding="utf-8")
    print(f"Wrote {target} ({len(page.encode()) // 1024 + 1} KB)")
    for src in missing:
        print(f"warning: image not found, left as a link: {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
