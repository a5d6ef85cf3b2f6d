"""What keeps the dependency set honest: SDKs whose private parts we use stay pinned to the range the
suite ran against, and no top-level folder shadows an installed package for the type checker."""

from __future__ import annotations

import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
PINNED = {"aiosqlite", "langchain", "langchain-openai", "python-telegram-bot", "discord.py", "lark-oapi"}
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
    ours = {"gateway", "channels", "agent", "tests", "bench", "skills", "docs", "scripts"}
    folders = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert not (folders - ours) & installed, "a folder named like a package hides it from mypy"
    assert (REPO / "sandbox-image" / "Dockerfile").is_file()
