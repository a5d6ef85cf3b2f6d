"""Resident memory each package adds when the daemon's modules are imported, in a fresh interpreter.

    python bench/import_rss.py                    # what `chital run` with Telegram imports
    python bench/import_rss.py --raw              # without compat/lean_imports.py (the "before")
    python bench/import_rss.py --modules gateway.daemon.app channels.slack.channel --top 20
    python bench/import_rss.py --why cryptography # who imports it (the first import chain)

An import hook wraps every module's execution and reads VmRSS before and after it; a module's
*self* cost is its growth minus that of the modules it imported in turn, summed per top-level
package. RSS grows in pages and allocator arenas, so single small modules are noisy; package sums
are what to read (docs/performance.md, "Memory").
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parent.parent)
DAEMON = [
    "gateway.cli.main",
    "gateway.daemon.app",
    "agent.harness",
    "agent.runtime",
    "channels.telegram.channel",
]


def rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4


class Recorder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.stack: list[list[Any]] = []  # [name, rss at start, children's growth]
        self.self_kb: collections.Counter[str] = collections.Counter()
        self.count: collections.Counter[str] = collections.Counter()
        self.parent: dict[str, str | None] = {}
        self.busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if self.busy:
            return None
        self.busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec: importlib.machinery.ModuleSpec | None = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Timed(spec.loader, self)
                    return spec
        finally:
            self.busy = False
        return None


class _Timed(importlib.abc.Loader):
    def __init__(self, inner: Any, rec: Recorder) -> None:
        self.inner, self.rec = inner, rec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        module: types.ModuleType | None = self.inner.create_module(spec)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        rec, name = self.rec, module.__name__
        rec.parent[name] = rec.stack[-1][0] if rec.stack else None
        rec.stack.append([name, rss_kb(), 0])
        try:
            self.inner.exec_module(module)
        finally:
            _, start, children = rec.stack.pop()
            grew = rss_kb() - start
            top = name.partition(".")[0]
            rec.self_kb[top] += grew - children
            rec.count[top] += 1
            if rec.stack:
                rec.stack[-1][2] += grew

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modules", nargs="*", default=DAEMON)
    ap.add_argument("--raw", action="store_true", help="without compat/lean_imports.py")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--why", nargs="*", default=[], help="print the import chain of these modules")
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    rec = Recorder()
    sys.meta_path.insert(0, rec)
    if not args.raw:
        from compat import lean_imports

        lean_imports.install()  # as gateway.cli.main does first
    base = rss_kb()
    for name in args.modules:
        importlib.import_module(name)
    total = rss_kb()
    print(f"interpreter {base / 1024:.1f} MB; after import {total / 1024:.1f} MB; {len(sys.modules)} modules")
    print(f"{'package':<28} {'self MB':>8} {'modules':>8}")
    for top, kb in rec.self_kb.most_common(args.top):
        print(f"{top:<28} {kb / 1024:8.1f} {rec.count[top]:8d}")
    for name in args.why:
        chain = [name]
        while rec.parent.get(chain[-1]):
            chain.append(str(rec.parent[chain[-1]]))
        print(" <- ".join(chain) if name in rec.parent else f"{name}: not imported")


if __name__ == "__main__":
    main()
