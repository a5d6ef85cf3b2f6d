"""Disks for the full-disk tests: filling one to the last byte (the tmpfs comes from the
``tmpfs`` fixture in tests/conftest.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path


def fill(disk: Path) -> Path:
    """Write into ``disk`` until the filesystem refuses another byte; return the file written."""
    filler = disk / "runaway.log"
    chunk = b"x" * (1 << 20)
    with filler.open("wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"x" * 4096)
    return filler
