"""A snippet run in a fresh interpreter, for what only a new process shows: which modules an import
loads, what a deferred module does on its first use."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_python(code: str, *, timeout: float, env: Mapping[str, str] | None = None, cwd: Path = REPO) -> str:
    """``code`` (dedented) under ``python -c`` in ``cwd``; fails the test with the snippet's stderr
    when it exits non-zero, else returns its stripped stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
