"""What keeps the dependency set honest: SDKs whose private parts we use stay pinned to the range the
suite ran against, and no top-level folder shadows an installed package for the type checker."""

from __future__ import annotations

import tomllib
from importlib.metadata import packages_distributions, version

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.daemon import REPO

PINNED = {
    "aiohttp", "aiosqlite", "langchain", "langchain-core", "langchain-openai", "langgraph", "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite", "deepagents", "openai", "python-telegram-bot", "discord.py", "lark-oapi",
}  # fmt: skip
"""Held to one minor release (see the comments in pyproject.toml)."""


def requirements() -> dict[str, Requirement]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return {Requirement(d).name.lower(): Requirement(d) for d in deps}


def test_sdks_we_reach_into_are_pinned_to_one_minor_release() -> None:
    reqs = requirements()
    for name in PINNED:
        spec = reqs[name].specifier
        upper = [s for s in spec if s.operator == "<"]
        assert upper, f"{name} needs an upper bound"
        low = next(s for s in spec if s.operator == ">=").version.split(".")[:2]
        major, minor = (int(x) for x in low)
        assert upper[0].version == f"{major}.{minor + 1}", f"{name}: {spec} spans more than one minor"


def test_the_installed_versions_are_the_pinned_ones() -> None:
    for name, req in requirements().items():
        assert req.specifier.contains(version(name), prereleases=True), f"{name} {version(name)} vs {req}"


def test_no_top_level_folder_shadows_an_installed_package() -> None:
    installed = set(packages_distributions())
    ours = {"gateway", "channels", "agent", "compat", "tests", "bench", "skills", "docs", "scripts"}
    folders = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert not (folders - ours) & installed, "a folder named like a package hides it from mypy"
    assert (REPO / "sandbox-image" / "Dockerfile").is_file()


def locked(name: str) -> dict[str, str]:
    """``{package: version}`` of a lock file's entries that apply to this interpreter."""
    found: dict[str, str] = {}
    for line in (REPO / name).read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate():
                found[canonicalize_name(req.name)] = str(req.specifier).removeprefix("==")
    return found


def test_the_locks_hold_pyprojects_ranges_and_each_other() -> None:
    """requirements.lock (setup.sh, the image) and requirements-test.lock (test.sh, CI) pin the same
    version of every runtime package, each inside pyproject.toml's range."""
    runtime, test = locked("requirements.lock"), locked("requirements-test.lock")
    for name, req in requirements().items():
        assert req.specifier.contains(runtime[canonicalize_name(name)], prereleases=True), name
    assert {n: v for n, v in test.items() if n in runtime} == runtime


def test_the_suite_runs_on_the_locked_versions() -> None:
    """scripts/test.sh installs requirements-test.lock: what the suite passes on is what the lock says."""
    wrong = {n: (v, version(n)) for n, v in locked("requirements-test.lock").items() if version(n) != v}
    assert not wrong, f"installed versions differ from requirements-test.lock: {wrong}"
