#!/usr/bin/env python3
"""Check a Markdown report for the defects that slip through most often (standard library only).

    python3 check_report.py /mnt/user-data/outputs/q3-churn-analysis.md

Errors (exit status 1): placeholders left in (TODO, TBD, <…> from the template), ``[n]``
citations without a matching entry under a "Sources"/"References" heading, links or images to
local files that do not exist, unbalanced code fences, no ``#`` title.
Warnings (exit status 0): skipped heading levels, empty sections, sources never cited, table rows
with the wrong number of cells, links to missing #anchors.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_PLACEHOLDER_WORDS = re.compile(r"\b(TODO|TBD|FIXME|XXX)\b|lorem ipsum|\[insert\b", re.IGNORECASE)
_ANGLE = re.compile(r"<(?!https?://|mailto:|!--|\s)(/?)([^<>\n=]+?)/?>")
_OPEN_ANGLE = re.compile(r"^\s*<(?![a-z/!]|https?:)(?=\S)")
_HTML_TAGS = frozenset(
    "a abbr b br code del details div em hr i img kbd li mark ol p pre s small span strong sub "
    "summary sup table tbody td th thead tr u ul h1 h2 h3 h4 h5 h6 figure figcaption caption".split()
)
_CITATION = re.compile(r"\[(\d+(?:\s*[,–-]\s*\d+)*)\](?![(:])")
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
_SOURCES = re.compile(r"^(sources?|references?|bibliography|citations|works cited|notes and sources)$", re.I)
_SOURCE_ENTRY = re.compile(r"^\s*(?:[-*+]\s+)?(?:\[(\d+)\]|(\d+)[.)])\s+\S")


@dataclass
class Report:
    errors: list[tuple[int, str]] = field(default_factory=list)
    warnings: list[tuple[int, str]] = field(default_factory=list)
    words: int = 0
    sections: int = 0
    sources: int = 0


def slug(text: str) -> str:
    text = re.sub(r"[^\w\s-]", "", text.lower()).strip()
    return re.sub(r"\s+", "-", text)


def _cited_numbers(spec: str) -> list[int]:
    numbers: list[int] = []
    for part in re.split(r"\s*,\s*", spec):
        bounds = re.split(r"\s*[–-]\s*", part)
        if len(bounds) == 2 and bounds[0].isdigit() and bounds[1].isdigit():
            lo, hi = int(bounds[0]), int(bounds[1])
            numbers.extend(range(lo, hi + 1) if 0 < hi - lo < 100 else (lo, hi))
        elif part.isdigit():
            numbers.append(int(part))
    return numbers


def _table_cells(line: str) -> int:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return len(re.split(r"(?<!\\)\|", inner))


def _placeholders(report: Report, number: int, line: str) -> None:
    for p in _PLACEHOLDER_WORDS.finditer(line):
        report.errors.append((number, f"placeholder left in: {p.group(0)!r}"))
    for a in _ANGLE.finditer(line):
        name = a.group(2).strip().split()[0].lower() if a.group(2).strip() else ""
        if name not in _HTML_TAGS:
            report.errors.append((number, f"placeholder left in: {a.group(0)!r}"))
    opened = _OPEN_ANGLE.search(line)
    if opened and ">" not in line[opened.start() :]:
        report.errors.append((number, f"placeholder left in: {line[opened.start() :].strip()[:60]!r}…"))


def check(text: str, base: Path) -> Report:
    report = Report()
    lines = text.splitlines()
    fence: str | None = None
    fence_line = 0
    headings: list[tuple[int, int, str]] = []  # (line, level, text)
    content_after: dict[int, bool] = {}  # heading line -> any content before the next heading
    in_sources = False
    sources: set[int] = set()
    citations: dict[int, int] = {}  # number -> first line
    links: list[tuple[int, str, bool]] = []
    table: list[tuple[int, str]] = []

    def flush_table() -> None:
        if len(table) >= 2:
            width = _table_cells(table[0][1])
            if not re.match(r"^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$", table[1][1]):
                report.warnings.append((table[1][0], "table has no '|---|' line under its header row"))
            for number, row in table[2:]:
                if _table_cells(row) != width:
                    report.warnings.append(
                        (number, f"table row has {_table_cells(row)} cells; the header has {width}")
                    )
        table.clear()

    for number, raw in enumerate(lines, 1):
        m = _FENCE.match(raw)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            if headings:
                content_after[headings[-1][0]] = True
            continue
        if m:
            fence, fence_line = m.group(1), number
            if headings:
                content_after[headings[-1][0]] = True
            continue
        line = _CODE_SPAN.sub(lambda s: " " * len(s.group(0)), raw)
        if line.lstrip().startswith("|"):
            table.append((number, line))
        else:
            flush_table()
        _placeholders(report, number, line)
        h = _HEADING.match(line)
        if h:
            level, title = len(h.group(1)), h.group(2)
            headings.append((number, level, title))
            content_after[number] = False
            in_sources = level > 1 and bool(_SOURCES.match(title.strip(" :*")))
            continue
        if line.strip() and headings:
            content_after[headings[-1][0]] = True
        report.words += len(re.findall(r"\w+", line))

        for link in _LINK.finditer(line):
            links.append((number, link.group(3), link.group(1) == "!"))
        if in_sources:
            entry = _SOURCE_ENTRY.match(line)
            if entry:
                sources.add(int(entry.group(1) or entry.group(2)))
                continue
        for c in _CITATION.finditer(line):
            for n in _cited_numbers(c.group(1)):
                citations.setdefault(n, number)
    flush_table()

    if fence is not None:
        report.errors.append((fence_line, "code fence opened here is never closed"))
    titles = [h for h in headings if h[1] == 1]
    if not titles:
        report.errors.append((1, "no '# Title' heading"))
    elif len(titles) > 1:
        report.warnings.append((titles[1][0], "more than one '#' title; use '##' for sections"))
    previous = 0
    for i, (number, level, title) in enumerate(headings):
        if previous and level > previous + 1:
            report.warnings.append((number, f"heading level jumps from {previous} to {level}: {title!r}"))
        previous = level
        following = headings[i + 1][1] if i + 1 < len(headings) else 0
        if not content_after.get(number) and (following == 0 or following <= level) and level > 1:
            report.warnings.append((number, f"section {title!r} is empty"))
    report.sections = sum(1 for h in headings if h[1] == 2)
    report.sources = len(sources)

    for n, number in sorted(citations.items()):
        if n not in sources:
            where = "the Sources list" if sources else "a '## Sources' section (none found)"
            report.errors.append((number, f"citation [{n}] has no entry in {where}"))
    for n in sorted(sources - citations.keys()):
        report.warnings.append((0, f"source [{n}] is listed but never cited"))

    anchors = {slug(t) for _, _, t in headings}
    for number, target, image in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # http:, https:, mailto:, data:
        if target.startswith("#"):
            if slug(target[1:].replace("-", " ")) not in anchors and target[1:] not in anchors:
                report.warnings.append((number, f"link to {target} matches no heading"))
            continue
        path = Path(target.split("#", 1)[0])
        if not path.is_absolute():
            path = base / path
        if not path.exists():
            kind = "image" if image else "link"
            report.errors.append((number, f"{kind} target does not exist: {target}"))
    return report


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    path = Path(args[0])
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"check_report.py: cannot read {path}: {exc}", file=sys.stderr)
        return 2
    report = check(text, path.parent)
    minutes = max(1, round(report.words / 230))
    print(
        f"{path.name}: {report.words} words (~{minutes} min read), {report.sections} sections, "
        f"{report.sources} sources"
    )
    for number, message in sorted(report.errors):
        print(f"ERROR   line {number}: {message}")
    for number, message in sorted(report.warnings):
        print(f"WARNING {'line ' + str(number) if number else 'sources'}: {message}")
    if not report.errors and not report.warnings:
        print("OK: no problems found")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
