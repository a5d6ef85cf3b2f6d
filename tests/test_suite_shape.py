"""The suite's shape: no test module imports from another test module.

A test module importing another drags that module's tests and fixtures into a second place (pytest
collects imported fixtures where they land, and the imported module's import-time work runs twice
over), and ties helpers to a file named for something else. What tests share lives in
tests/conftest.py, tests/fakes/ and the support modules (tests/*_daemon.py, tests/*_support.py). The
scan reads every import statement, at module level or inside a function, absolute or relative, and
the ``from tests.test_x import`` lines of scripts a test hands to a fresh interpreter.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.name  # "tests"
SCRIPT_IMPORT = re.compile(r"^\s*(?:from\s+(\S+)\s+import\s+(.+)|import\s+(\S+))", re.MULTILINE)


def _is_test_module(parts: list[str]) -> bool:
    """``parts`` name a test module (or something inside one) of this package."""
    if parts and parts[0] == PACKAGE:
        parts = parts[1:]
    elif not (parts and (TESTS / f"{parts[0]}.py").exists()):
        return False  # another package's test_* (aiohttp.test_utils) is no concern here
    return bool(parts) and parts[0].startswith("test_")


def _named(parts: list[str]) -> str:
    """The dotted name of a test module, however the import spelled it (``test_x``, ``tests.test_x``)."""
    return ".".join(parts if parts[0] == PACKAGE else [PACKAGE, *parts])


def _from_targets(module: str | None, level: int, names: list[str]) -> list[str]:
    """The test modules a ``from ... import ...`` reaches, as dotted names."""
    base = [PACKAGE] if level else []  # a relative import in tests/ starts from the tests package
    parts = base + (module.split(".") if module else [])
    hits = []
    if _is_test_module(parts):
        hits.append(_named(parts))
    elif parts in ([PACKAGE], []) or (not module and level):
        hits += [f"{PACKAGE}.{n}" for n in names if n.startswith("test_")]
    return hits


def imports_of_test_modules(source: str) -> list[str]:
    """Every test module ``source`` imports from (its import statements, and the import lines of
    string literals: the scripts handed to a fresh interpreter)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [_named(a.name.split(".")) for a in node.names if _is_test_module(a.name.split("."))]
        elif isinstance(node, ast.ImportFrom):
            found += _from_targets(node.module, node.level, [a.name for a in node.names])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for module, names, plain in SCRIPT_IMPORT.findall(node.value):
                if plain:
                    found += [_named(plain.split("."))] if _is_test_module(plain.split(".")) else []
                else:
                    dots = len(module) - len(module.lstrip("."))
                    imported = [n.strip().split(" ")[0] for n in names.split(",")]
                    found += _from_targets(module.lstrip(".") or None, dots, imported)
    return found


def test_no_test_module_imports_another() -> None:
    modules = sorted(TESTS.glob("test_*.py"))
    assert len(modules) > 50, "the scan must see the suite"
    offenders = {
        path.name: imports
        for path in modules
        if (imports := imports_of_test_modules(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, "move shared helpers to conftest.py, tests/fakes/ or a support module"


def test_the_scan_flags_every_spelling() -> None:
    """The self-check: each way of importing a test module is seen, and other imports are not."""
    pkg, other = PACKAGE, "test_approvals"  # built here so the guard's own source imports nothing
    flagged = [
        f"from {pkg}.{other} import config",
        f"import {pkg}.{other}",
        f"import {pkg}.{other} as approvals",
        f"from {pkg} import {other}",
        f"from .{other} import config",
        f"from . import {other}",
        f"from {other} import config",
        f"def helper():\n    from {pkg}.{other} import config\n    return config",
        f"async def test_x():\n    if True:\n        import {pkg}.{other}",
        f"SCRIPT = '''\nimport asyncio\nfrom {pkg}.{other} import config\n'''",
    ]
    for snippet in flagged:
        assert imports_of_test_modules(snippet) == [f"{pkg}.{other}"], snippet
    clean = [
        "from aiohttp.test_utils import TestClient",
        f"from {pkg}.daemon import DaemonProcess",
        f"from {pkg}.fakes.openai_server import FakeOpenAI",
        f"from {pkg} import daemon",
        "from . import conftest",
        "import pytest",
        "TEXT = 'see tests/test_approvals.py for the rest'",
    ]
    for snippet in clean:
        assert imports_of_test_modules(snippet) == [], snippet
