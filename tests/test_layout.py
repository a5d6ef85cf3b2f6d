"""The shape of the code, checked: no import circle in ``gateway`` wider than a pair of files, and no
module past ~500 lines without a reason written here (docs/design.md, "Layout and imports").

The layers themselves are import-linter contracts in pyproject.toml, run by scripts/test.sh; this
file checks what a layers contract cannot: circles inside one layer, and size."""

from __future__ import annotations

from pathlib import Path

import grimp

from tests.daemon import REPO

ROOTS = ("gateway", "channels", "agent", "compat")
MAX_LINES = 500
LONGER: dict[str, tuple[int, str]] = {
    "compat/lean_imports.py": (
        520,
        "the import hook and its table of deferred names: one mechanism, "
        "kept in one file on purpose (the only module that runs import internals)",
    ),
    "gateway/daemon/gateway.py": (
        527,
        "the gateway's intake, dispatch and leases; splits along intake (accept, journal, hand-on) "
        "versus the leased work (claim, cut, keep, resume), which share the claimed-task map",
    ),
    "agent/sandbox/docker_provider.py": (
        513,
        "the Docker provider's container lifecycle; splits along container settings and quota "
        "hooks (shared with docker_shared.py) versus acquire/release/reap",
    ),
}
"""Modules allowed past MAX_LINES: their ceiling (a ratchet: they may shrink, not grow) and why.
Not split yet in issue 21; each reason names the seam along which it splits."""


def circles(package: str) -> list[set[str]]:
    """The strongly connected components of ``package``'s import graph (runtime imports: those
    under ``TYPE_CHECKING`` never run, so they cannot make a circle), largest first."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(start: str) -> None:
        # Tarjan's algorithm, iterative (the graph is deep enough to make recursion fragile).
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if not child.startswith(package):
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                found.append(component)

    for module in sorted(graph.modules):
        if module.startswith(package) and module not in index:
            visit(module)
    return sorted(found, key=len, reverse=True)


def test_no_import_circle_in_the_gateway_is_wider_than_a_pair() -> None:
    wide = [sorted(c) for c in circles("gateway") if len(c) > 2]
    assert not wide, f"import circles wider than a pair of files: {wide}"


def test_the_circle_finder_finds_a_circle(tmp_path: Path) -> None:
    """The check above cannot pass by finding nothing: three modules importing in a ring are found."""
    pkg = tmp_path / "ring"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, nxt in (("a", "b"), ("b", "c"), ("c", "a")):
        (pkg / f"{name}.py").write_text(f"from ring import {nxt}\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        assert {"ring.a", "ring.b", "ring.c"} in circles("ring")
    finally:
        sys.path.remove(str(tmp_path))


def test_modules_stay_under_about_500_lines() -> None:
    long = {
        str(path.relative_to(REPO)): n
        for root in ROOTS
        for path in (REPO / root).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    unexplained = {path: n for path, n in long.items() if path not in LONGER}
    assert not unexplained, f"modules past {MAX_LINES} lines with no reason in LONGER: {unexplained}"
    grown = {path: n for path, n in long.items() if path in LONGER and n > LONGER[path][0]}
    assert not grown, f"modules past their ceiling in LONGER: {grown}"
    stale = set(LONGER) - set(long)
    assert not stale, f"LONGER names modules that are short now: {stale}"
