"""Summarise py-spy collapsed stacks (``--format raw``): where the samples fall, by function and by
package, self and inclusive. ``python bench/spy_top.py FILE [--n 30] [--grep TEXT]``."""

from __future__ import annotations

import argparse
import collections
import re


def package(frame: str) -> str:
    m = re.search(r"\((?:.*/site-packages/|.*/lib/python3\.\d+/|/work/main/)?([^/)]+)", frame)
    return m.group(1).split(".")[0] if m else "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--grep", default="")
    args = ap.parse_args()
    selfc: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    pkg_self: collections.Counter[str] = collections.Counter()
    total = 0
    for line in open(args.file):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if args.grep and not any(args.grep in f for f in frames):
            continue
        total += n
        selfc[frames[-1]] += n
        pkg_self[package(frames[-1])] += n
        for f in set(frames):
            incl[f] += n
    print(f"{total} samples")
    print("-- self, by package")
    for k, v in pkg_self.most_common(15):
        print(f"{v / total * 100:5.1f}%  {k}")
    print("-- self, by function")
    for k, v in selfc.most_common(args.n):
        print(f"{v / total * 100:5.1f}%  {k[:160]}")
    print("-- inclusive")
    for k, v in incl.most_common(args.n):
        print(f"{v / total * 100:5.1f}%  {k[:160]}")


if __name__ == "__main__":
    main()
