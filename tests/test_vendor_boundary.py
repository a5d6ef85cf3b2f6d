"""The vendor boundary (docs/design.md, "Vendor boundary", issue 21 item 1).

Private names of third-party packages are used only in the modules compat/versions.py names (one
per package: compat/*.py, a platform SDK's module in its adapter's folder); those modules' verified
releases are pyproject.toml's pins; outside them ``chital check`` and ``chital run`` say so in one
line, and the daemon refuses to start where there is no public path.

The scan is static (the AST of every .py under agent/, channels/ and gateway/). What counts as a
reach: ``from pkg._x import``, ``from pkg import _x``, ``import pkg._x``, an attribute ``._x`` on
anything but ``self``/``cls``/``super()``, ``getattr``/``hasattr``/``setattr``/``delattr`` with a
``"_x"`` literal, an assignment to an attribute of a name imported from a third-party package
(its module globals or classes), and SQL text naming LangGraph's checkpoint tables; and, read
from the imported classes, a subclass of a library class overriding or calling one of its private
members through ``self``/``super()``. Our own private names count as well when used from another
object or module: a private name is its module's.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from compat.versions import VERIFIED, check_all
from tests.daemon import MODEL_SETTINGS, REPO, env_without

ROOTS = ("agent", "channels", "gateway")
OWN = {"agent", "channels", "gateway", "compat", "tests", "bench"}
BOUNDARY = {v.module for v in VERIFIED.values()}
"""The modules allowed to use a package's private names (besides all of compat/)."""

NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
"""Documented public methods of every ``collections.namedtuple`` (underscored to avoid clashes)."""
DOCUMENTED = {"os._exit"}
"""Standard-library names that are public despite the underscore."""

CHECKPOINT_SQL = re.compile(
    r"\b(?:from|into|update|join|table(?:\s+if\s+(?:not\s+)?exists)?)\s+\"?"
    r"(?:checkpoints|writes|checkpoint_writes|checkpoint_blobs|checkpoint_migrations)\b"
    r"|table_info\(\s*(?:checkpoints|writes)\s*\)",
    re.IGNORECASE,
)
CHECKPOINT_TABLE_NAMES = {"checkpoint_writes", "checkpoint_blobs", "checkpoint_migrations"}

STDLIB = {
    # argparse has no public hook for the help listing of subcommands; versioned with the
    # interpreter, and renamed, the listing falls back to argparse's own (see the class).
    ("gateway/cli/common.py", "action._get_subactions"),
    ("gateway/cli/common.py", "argparse._SubParsersAction"),
}
ALLOWED = STDLIB


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top not in OWN and top not in sys.stdlib_module_names


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _vendor_names(tree: ast.AST) -> set[str]:
    """Names a module binds to a third-party module or an object imported from one."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _third_party(alias.name):
                    names.add(alias.asname or alias.name.split(".")[0])
        elif (
            isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _third_party(node.module)
        ):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _strings(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.JoinedStr):
        yield "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )


def reaches(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every reach into a private name in ``source`` (see the module)."""
    tree = ast.parse(source)
    vendor = _vendor_names(tree)
    in_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            # A package's private module (``from ._ws import``) is its own package's to use.
            if node.level == 0 and any(_private(part) for part in module.split(".")):
                found.append((node.lineno, f"from {module} import"))
            found += [(node.lineno, f"from {module} import {a.name}") for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(_private(part) for part in alias.name.split(".")):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.Attribute):
            text = ast.unparse(node)
            if _private(node.attr) and not _is_self(node.value) and node.attr not in NAMEDTUPLE_API:
                if text not in DOCUMENTED:
                    found.append((node.lineno, text))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            fn, args = node.func.id, node.args
            if fn in ("getattr", "hasattr", "setattr", "delattr") and len(args) >= 2:
                name = args[1].value if isinstance(args[1], ast.Constant) else None
                if (
                    isinstance(name, str)
                    and _private(name)
                    and not _is_self(args[0])
                    and name not in NAMEDTUPLE_API
                ):
                    found.append((node.lineno, f"{ast.unparse(args[0])}.{name}"))
                elif fn in ("setattr", "delattr") and _root(args[0]) in vendor:
                    found.append((node.lineno, f"{fn}({ast.unparse(args[0])}, ...)"))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and _root(part) in vendor:
                        found.append((node.lineno, f"{ast.unparse(part)} ="))
                        break
        for text in () if id(node) in in_fstrings else _strings(node):
            if CHECKPOINT_SQL.search(text) or text in CHECKPOINT_TABLE_NAMES:
                found.append((getattr(node, "lineno", 0), f"SQL on a checkpoint table: {text[:60]!r}"))
    return sorted(set(found))


def scanned() -> Iterator[Path]:
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if path.relative_to(REPO).as_posix() not in BOUNDARY:
                yield path


def test_private_names_of_packages_are_used_only_in_their_boundary_module() -> None:
    violations, seen = [], set()
    for path in scanned():
        rel = path.relative_to(REPO).as_posix()
        for line, text in reaches(path.read_text()):
            if (rel, text) in ALLOWED:
                seen.add((rel, text))
            else:
                violations.append(f"{rel}:{line}: {text}")
    assert not violations, (
        "private names used outside the vendor boundary (move the reach into its package's module in"
        " compat/ or the adapter's sdk module, see docs/design.md):\n  " + "\n  ".join(violations)
    )
    stale = sorted(ALLOWED - seen)
    assert not stale, f"no longer found, remove from the allowlist in this file: {stale}"


def _private_members_used(cls_node: ast.ClassDef) -> set[str]:
    """Private names a class body defines or reads through ``self``/``cls``/``super()``."""
    used: set[str] = set()
    for node in ast.walk(cls_node):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _is_self(node.value):
            used.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _private(node.name):
            used.add(node.name)
    return used


def test_no_class_outside_the_boundary_overrides_or_reads_a_library_bases_private_member() -> None:
    """The reach the AST rules cannot see: a subclass of a library class overriding or calling its
    private methods through ``self``/``super()`` (module-level classes, imported to read their MRO)."""
    violations = []
    for path in scanned():
        if path.name == "__main__.py":
            continue
        rel = path.relative_to(REPO)
        module = importlib.import_module(".".join(rel.with_suffix("").parts).removesuffix(".__init__"))
        for node in ast.parse(path.read_text()).body:
            cls = getattr(module, node.name, None) if isinstance(node, ast.ClassDef) else None
            if not isinstance(cls, type) or not isinstance(node, ast.ClassDef):
                continue
            used = _private_members_used(node)
            for base in cls.__mro__[1:]:
                if _third_party(base.__module__) and base.__module__ != "builtins":
                    violations += [
                        f"{rel.as_posix()}: {node.name}.{name} ({base.__module__}.{base.__qualname__})"
                        for name in sorted(used & set(vars(base)))
                    ]
    assert not violations, "a library base's private member used outside the vendor boundary:\n  " + (
        "\n  ".join(violations)
    )


def test_the_scan_finds_each_kind_of_reach() -> None:
    """The rules above fire (a scan that finds nothing would pass any code)."""
    source = """
import openai._base_client
import langchain_openai.chat_models.base as base
from langchain_core.tracers._streaming import Handler
from langchain.agents.factory import _chain_model_call_handlers
from discord import VoiceClient
def f(bot, client, conn, self):
    bot._post("getUpdates", {})
    getattr(exc, "_retry_after", None)
    base.convert_to_openai_tool = None
    VoiceClient.warn_nacl = False
    setattr(base, "x", 1)
    conn.execute("SELECT task_id FROM writes WHERE thread_id = ?")
    conn.execute(f"INSERT OR IGNORE INTO checkpoint_blobs VALUES ({x})")
    self._fine, super()._fine, getattr(self, "_fine"), row._replace(a=1), os._exit(0)
"""
    texts = sorted(text for _, text in reaches(source))
    assert texts == sorted(
        [
            "import openai._base_client",
            "from langchain_core.tracers._streaming import",
            "from langchain.agents.factory import _chain_model_call_handlers",
            "bot._post",
            "exc._retry_after",
            "base.convert_to_openai_tool =",
            "VoiceClient.warn_nacl =",
            "setattr(base, ...)",
            "SQL on a checkpoint table: 'SELECT task_id FROM writes WHERE thread_id = ?'",
            "SQL on a checkpoint table: 'INSERT OR IGNORE INTO checkpoint_blobs VALUES ()'",
        ]
    ), texts


def test_each_verified_set_is_the_pin_and_its_module_exists() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [d for group in project.get("optional-dependencies", {}).values() for d in group]
    pins = {
        Requirement(d).name.lower(): Requirement(d).specifier for d in [*project["dependencies"], *extras]
    }
    for name, verified in VERIFIED.items():
        assert (REPO / verified.module).is_file(), verified.module
        assert pins[name.lower()] == SpecifierSet(verified.specifier), f"{name}: {pins[name.lower()]}"


def test_the_suite_runs_inside_every_verified_set() -> None:
    assert [p.line() for p in check_all()] == []


def test_a_release_outside_the_verified_set_is_named_in_one_line() -> None:
    faked = {"openai": "3.58.1", "lark-oapi": "1.8.0"}

    def version_of(name: str) -> str:
        if name == "discord.py":
            raise importlib.metadata.PackageNotFoundError(name)  # not installed: nothing to check
        return faked.get(name) or importlib.metadata.version(name)

    problems = check_all(version_of=version_of)
    assert [(p.verified.distribution, p.installed, p.fatal) for p in problems] == [
        ("openai", "3.58.1", False),
        ("lark-oapi", "1.8.0", True),
    ]
    assert problems[0].line() == (
        "vendor internals: openai 3.58.1 is outside the verified >=3.57,<3.58 (compat/openai_client.py);"
        " using the public path: streamed chunks are parsed into the SDK's typed objects (slower)"
    )
    assert problems[1].line() == (
        "vendor internals: lark-oapi 1.8.0 is outside the verified >=1.7.5,<1.8 (channels/lark/_ws.py);"
        " no public fallback, refusing to start"
    )


def _chital(
    tmp_path: Path, *args: str, shadow: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``chital ARGS`` in ``tmp_path``; ``shadow`` installs distribution metadata of other releases
    in front of the real ones (a dist-info directory first on the path: what
    ``importlib.metadata`` then reports, while the code imported stays the installed one)."""
    paths = [str(REPO)]
    if shadow:
        site = tmp_path / "shadow"
        for name, release in shadow.items():
            info = site / f"{re.sub(r'[-_.]+', '_', name)}-{release}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {release}\n")
        paths.insert(0, str(site))
    environ = env_without(*MODEL_SETTINGS, PYTHONPATH=os.pathsep.join(paths))
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_chital_check_says_the_vendor_internals_are_verified(tmp_path: Path) -> None:
    out = _chital(tmp_path, "check").stdout
    assert "vendor internals: verified\n" in out


def test_chital_check_names_a_library_outside_its_verified_releases(tmp_path: Path) -> None:
    out = _chital(tmp_path, "check", shadow={"openai": "3.99.0"}).stdout
    lines = [line for line in out.splitlines() if line.startswith("vendor internals")]
    assert lines == [
        "vendor internals: openai 3.99.0 is outside the verified >=3.57,<3.58 (compat/openai_client.py);"
        " using the public path: streamed chunks are parsed into the SDK's typed objects (slower)"
    ]


def test_a_fallback_is_taken_and_the_daemon_goes_on(tmp_path: Path) -> None:
    """openai outside its verified releases: one warning line in the log, and start-up goes on
    (here to the next thing that stops it, the missing storage directory's parent being a file)."""
    (tmp_path / "blocker").write_text("")
    (tmp_path / "config.yaml").write_text("storage:\n  path: blocker/data\n")
    done = _chital(tmp_path, "run", shadow={"openai": "3.99.0"})
    assert "vendor internals: openai 3.99.0 is outside the verified" in done.stderr
    assert "refusing to start" not in done.stderr


@pytest.mark.parametrize("name", [n for n, v in VERIFIED.items() if v.fallback is None])
def test_the_daemon_refuses_to_start_on_internals_nobody_verified(tmp_path: Path, name: str) -> None:
    done = _chital(tmp_path, "run", shadow={name: "99.0.0"})
    assert done.returncode == 1
    assert f"chital: vendor internals: {name} 99.0.0 is outside the verified" in done.stderr
    assert done.stderr.rstrip().endswith("no public fallback, refusing to start")
