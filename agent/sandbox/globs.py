"""Glob patterns matched without backtracking: the ``glob`` tool's and grep's ``glob=`` filter.

Why not wcmatch's compiled regex (as before): each ``**`` in a pattern is a nested ``.*`` group
and each ``*`` a lazy run, so a plausible pattern (``**/src/**/test/**/*.py``) against the deep
tree sandboxed code can make (``src/test/src/test/…``, 900 levels) took minutes of backtracking
per path, in the daemon's process, holding the GIL: every conversation's event loop stalled, not
just the one that asked. Here a pattern is split into ``/`` segments; a segment is matched by the
two-pointer wildcard algorithm (O(len(segment) x len(pattern segment)) at worst) and ``**`` by
one pass over the path's segments, so a match costs O(path x pattern) whatever the pattern.

The dialect is the one wcmatch's ``glob.compile(p, flags=BRACE | GLOBSTAR)`` gave (a test checks
the two agree on generated patterns): ``*`` and ``?`` within a segment, ``[...]``/``[!...]``
classes with ranges, ``\\`` escapes, ``{a,b}`` and ``{1..3}`` braces (bracex, wcmatch's own, at
most 1,000 expansions), ``**`` as a whole segment for any number of segments, and a segment that
starts with ``.`` matched only by a pattern segment that starts with a literal ``.`` (``**`` never
enters one).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

import bracex

from .paths import PathRefused

MAX_EXPANSIONS = 1000

_STAR = ("*",)
Token = tuple[object, ...]
"""``("lit", c)``, ``("?",)``, ``("*",)`` or ``("[", negated, frozenset of chars, ranges)``."""


def _class(seg: str, at: int) -> tuple[Token, int] | None:
    """The class starting at ``seg[at] == "["`` and the index after it, or None (no closing ``]``:
    the ``[`` is a literal)."""
    i = at + 1
    negated = i < len(seg) and seg[i] in "!^"
    if negated:
        i += 1
    chars: set[str] = set()
    ranges: list[tuple[str, str]] = []
    first = True
    while i < len(seg):
        c = seg[i]
        if c == "]" and not first:
            return ("[", negated, frozenset(chars), tuple(ranges)), i + 1
        if c == "\\" and i + 1 < len(seg):
            i += 1
            c = seg[i]
        if i + 2 < len(seg) and seg[i + 1] == "-" and seg[i + 2] != "]":
            ranges.append((c, seg[i + 2]))
            i += 3
        else:
            chars.add(c)
            i += 1
        first = False
    return None


def _segment_tokens(seg: str) -> list[Token]:
    out: list[Token] = []
    i = 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            if not out or out[-1] != _STAR:  # ``**`` inside a segment is one star
                out.append(_STAR)
            i += 1
        elif c == "?":
            out.append(("?",))
            i += 1
        elif c == "[" and (found := _class(seg, i)) is not None:
            out.append(found[0])
            i = found[1]
        elif c == "\\" and i + 1 < len(seg):
            out.append(("lit", seg[i + 1]))
            i += 2
        else:
            out.append(("lit", c))
            i += 1
    return out


def _one(tok: Token, c: str) -> bool:
    kind = tok[0]
    if kind == "lit":
        return tok[1] == c
    if kind == "?":
        return True
    negated, chars, ranges = tok[1], tok[2], tok[3]
    assert isinstance(chars, frozenset) and isinstance(ranges, tuple)
    inside = c in chars or any(lo <= c <= hi for lo, hi in ranges)
    return inside != negated


def segment_matches(toks: list[Token], name: str) -> bool:
    """Whether one path segment matches one pattern segment (no ``/`` in either)."""
    if name.startswith(".") and not (toks and toks[0] == ("lit", ".")):
        return False  # hidden: only a literal leading dot matches it
    i = j = 0
    star, mark = -1, 0
    while j < len(name):
        if i < len(toks) and toks[i] == _STAR:
            star, mark = i, j
            i += 1
        elif i < len(toks) and _one(toks[i], name[j]):
            i += 1
            j += 1
        elif star >= 0:  # let the last star take one more character
            i, mark = star + 1, mark + 1
            j = mark
        else:
            return False
    while i < len(toks) and toks[i] == _STAR:
        i += 1
    return i == len(toks)


def _path_matcher(pattern: str) -> Callable[[list[str]], bool]:
    """A matcher of a path's segments against one brace-free pattern with ``/``."""
    parts: list[list[Token] | None] = []  # None: ``**``
    segments = pattern.split("/")
    for i, seg in enumerate(segments):
        if not seg and 0 < i < len(segments) - 1:
            continue  # "a//b" is "a/b" (a brace like ``{,x}`` can leave one)
        if seg == "**":
            if not parts or parts[-1] is not None:
                parts.append(None)
        else:
            parts.append(_segment_tokens(seg))

    def match(names: list[str]) -> bool:
        # reach[j]: the pattern's parts so far can end just before names[j]
        reach = [True] + [False] * len(names)
        for k, part in enumerate(parts):
            nxt = [False] * (len(names) + 1)
            if part is None:  # a run of segments, none hidden (at the end: at least one)
                run = [False] * (len(names) + 1)  # a run of zero or more ends before names[j]
                for j in range(len(names) + 1):
                    run[j] = reach[j] or (j > 0 and run[j - 1] and not names[j - 1].startswith("."))
                if k == len(parts) - 1 and k > 0:
                    nxt = [
                        j > 0 and run[j - 1] and not names[j - 1].startswith(".")
                        for j in range(len(names) + 1)
                    ]
                else:
                    nxt = run
            else:
                for j in range(len(names)):
                    if reach[j] and segment_matches(part, names[j]):
                        nxt[j + 1] = True
            reach = nxt
            if not any(reach):
                return False
        return reach[len(names)]

    return match


def compile_glob(pattern: str) -> Callable[[str], bool]:
    """ripgrep-like include globs (as deepagents documents them): no ``/`` → match the basename at
    any depth; with ``/`` → match the path relative to the search root, ``**`` spans dirs."""
    if ".." in pattern.split("/"):
        raise PathRefused("'..' is not allowed in glob patterns")
    try:
        expanded = bracex.expand(pattern.lstrip("/"), keep_escapes=True, limit=MAX_EXPANSIONS)
    except bracex.ExpansionLimitException:
        raise PathRefused(f"the glob pattern expands to more than {MAX_EXPANSIONS} patterns") from None
    if "/" in pattern:
        matchers = [_path_matcher(p) for p in dict.fromkeys(expanded)]
        return lambda rel: any(m(rel.split("/")) for m in matchers)
    names = [_segment_tokens(p) for p in dict.fromkeys(expanded)]
    return lambda rel: any(segment_matches(t, PurePosixPath(rel).name) for t in names)
