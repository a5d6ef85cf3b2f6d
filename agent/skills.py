"""Markdown skills: ``SKILL.md`` folders the agent loads on demand (progressive disclosure).

A skill is a folder ``<name>/`` holding ``SKILL.md`` (YAML front matter + Markdown instructions) and
any supporting files. Two sources: ``public_dir`` (shipped with Chital) and ``custom_dir`` (the
operator's); a custom skill replaces the public one of the same name. ``enabled``/``disabled`` in
:class:`SkillsSettings` pick which ones the agent sees.

Only names and descriptions reach the system prompt (``agent.skills_prompt.SkillsListing``); the
body is read when a task needs it, with the sandbox's ``read_file`` on ``/mnt/skills/<name>/SKILL.md``
or with the ``load_skill`` tool, which works with no sandbox at all. Why not deepagents'
``SkillsMiddleware``: see docs/skills.md (in short, it caches the listing in each thread's
checkpoint, so a skill disabled in the config stays visible to old threads, and it adds graph nodes).

A malformed SKILL.md is skipped with a warning naming the file and the problem; loading never raises.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from agent.sandbox.paths import SKILLS
from agent.settings import SkillsSettings

if TYPE_CHECKING:
    from langchain.agents.middleware.types import AgentMiddleware
    from langchain_core.tools import BaseTool

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
MAX_SKILL_BYTES = 256 * 1024
"""A SKILL.md larger than this is refused: it would not fit a model's context usefully."""
MAX_NAME = 64
MAX_DESCRIPTION = 1024
"""Agent Skills spec limits; descriptions go into every system prompt, so they are enforced."""
MAX_VIEW_FILE_BYTES = 20 * 1024 * 1024
"""Supporting files larger than this are left out of the sandbox view (with a warning)."""

VIEW_DIR = "skills-view"
VIEW_MARKER = ".chital-skills-view"
"""``skills_dir_for_sandbox`` only ever manages a folder that holds this marker (or is empty)."""

NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
"""The Agent Skills spec's name: ASCII lower case, digits, single hyphens (so no look-alikes)."""
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)(?:\r?\n)?^---[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE)
PROVENANCE_FILE = ".chital-install.json"
"""Who installed a custom skill, from where and when (agent/skill_install.py); never copied into
the sandbox view."""
MAX_PROVENANCE_BYTES = 16 * 1024
_SKIPPED_NAMES = frozenset({"__pycache__", ".git", ".DS_Store", ".ipynb_checkpoints", PROVENANCE_FILE})


class SkillError(ValueError):
    """A SKILL.md that cannot be used; the message says what is wrong (never raised by loading)."""


@dataclass(frozen=True, slots=True)
class Skill:
    """One parsed skill. ``body`` is the Markdown after the front matter."""

    name: str
    description: str
    body: str
    source: str
    """``public`` or ``custom``."""
    dir: Path
    allowed_tools: tuple[str, ...] = ()
    license: str | None = None
    version: str | None = None
    files: tuple[str, ...] = ()
    """Supporting files, relative to ``dir`` (POSIX separators), SKILL.md excluded."""
    installed_by: str | None = None
    """Who installed it (``chital skills install``, an admin in chat, an approved draft): the
    provenance file's ``installed_by``; None for skills copied in by hand."""
    origin: str | None = None
    """Where it came from (a file name, a URL without credentials, ``drafted in <conversation>``)."""
    installed_at: str | None = None
    drafted: bool = False
    """The agent drafted it and an admin approved it (agent/skill_install.py)."""

    @property
    def virtual_dir(self) -> str:
        """The skill's folder as the sandbox shows it."""
        return f"{SKILLS}/{self.name}"

    @property
    def virtual_path(self) -> str:
        return f"{self.virtual_dir}/{SKILL_FILE}"


# ---- parsing -------------------------------------------------------------------------------------


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A one-line description of a YAML error, with the line number in SKILL.md."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return f"{problem} (line {mark.line + 2})"  # +1 for 1-based, +1 for the opening '---'
    return str(problem)


def _text_field(meta: dict[str, Any], key: str) -> str | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SkillError(f"'{key}' must be text, not {type(value).__name__}")
    return str(value).strip() or None


def _allowed_tools(value: Any) -> tuple[str, ...]:
    """``allowed-tools``: a space/comma separated string (the spec's form) or a YAML list."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(t for t in re.split(r"[\s,]+", value) if t)
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return tuple(t.strip() for t in value if t.strip())
    raise SkillError("'allowed-tools' must be a space-separated string or a list of tool names")


def _supporting_files(skill_dir: Path) -> tuple[str, ...]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(skill_dir):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_NAMES and not d.startswith("."))
        for name in sorted(filenames):
            if name in _SKIPPED_NAMES or name.startswith("."):
                continue
            rel = Path(dirpath, name).relative_to(skill_dir).as_posix()
            if rel != SKILL_FILE:
                found.append(rel)
    return tuple(found)


def parse_skill(
    skill_md: Path, source: str, *, raw: bytes | None = None, files: tuple[str, ...] | None = None
) -> Skill:
    """Parse one ``<dir>/SKILL.md``; raises :class:`SkillError` saying what is wrong.

    ``raw`` and ``files``: the file's bytes and the supporting files when they are not on disk yet
    (an archive being checked before it is installed, agent/skill_install.py); the folder-name
    rule is then not checked (the install names the folder after the skill)."""
    on_disk = raw is None
    if raw is None:
        try:
            raw = skill_md.read_bytes()
        except OSError as exc:
            raise SkillError(f"cannot read it ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > MAX_SKILL_BYTES:
        raise SkillError(f"the file is {len(raw)} bytes; the limit is {MAX_SKILL_BYTES}")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SkillError("the file is not UTF-8 text") from None
    match = _FRONT_MATTER.match(text)
    if match is None:
        raise SkillError(
            "no YAML front matter (the file must start with a '---' line and close it with another '---')"
        )
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise SkillError(f"invalid YAML front matter: {_yaml_problem(exc)}") from None
    if not isinstance(meta, dict):
        raise SkillError("the front matter is not a mapping of 'key: value' lines")

    name = _text_field(meta, "name")
    if not name:
        raise SkillError("the front matter has no 'name'")
    if len(name) > MAX_NAME or not NAME_RE.match(name):
        raise SkillError(
            f"name {name!r} is not valid: use at most {MAX_NAME} lowercase letters, digits and single hyphens"
        )
    folder = skill_md.parent.name
    if on_disk and name != folder:
        raise SkillError(f"name {name!r} does not match its folder name {folder!r}")
    description = " ".join((_text_field(meta, "description") or "").split())
    if not description:
        raise SkillError("the front matter has no 'description'")
    if len(description) > MAX_DESCRIPTION:
        raise SkillError(f"description is {len(description)} characters; the limit is {MAX_DESCRIPTION}")
    tools = _allowed_tools(meta.get("allowed-tools", meta.get("allowed_tools")))
    license_ = _text_field(meta, "license")
    version = _text_field(meta, "version")
    extra = meta.get("metadata")
    if version is None and isinstance(extra, dict) and extra.get("version") is not None:
        version = str(extra["version"]).strip() or None
    body = text[match.end() :].strip()
    if not body:
        raise SkillError("no instructions after the front matter")
    return Skill(
        name=name,
        description=description,
        body=body,
        source=source,
        dir=skill_md.parent,
        allowed_tools=tools,
        license=license_,
        version=version,
        files=files if files is not None else _supporting_files(skill_md.parent),
        **(_provenance(skill_md.parent) if on_disk and source == "custom" else {}),
    )


def _provenance(skill_dir: Path) -> dict[str, Any]:
    """The provenance file's fields for :class:`Skill`; a missing or unreadable one is nothing
    (a skill copied in by hand), never an error."""
    path = skill_dir / PROVENANCE_FILE
    try:
        if path.is_symlink() or not path.is_file():
            return {}
        with path.open("rb") as fh:
            meta = json.loads(fh.read(MAX_PROVENANCE_BYTES + 1)[:MAX_PROVENANCE_BYTES])
    except (OSError, ValueError):
        return {}
    if not isinstance(meta, dict):
        return {}
    out: dict[str, Any] = {
        key: str(meta[key])[:300] for key in ("installed_by", "origin", "installed_at") if meta.get(key)
    }
    out["drafted"] = meta.get("how") == "drafted"
    return out


def scan_skills(root: Path, source: str, *, expected: bool = False) -> dict[str, Skill]:
    """Every valid skill folder directly under ``root``; each problem is logged, never raised.
    A missing ``root`` is a warning when ``expected`` (the shipped skills, or a folder the config
    names: the agent would silently go without them), else a note (the optional custom folder)."""
    found: dict[str, Skill] = {}
    if not root.exists():
        if expected:
            log.warning("skills: the %s skills folder %s does not exist; no %s skills", source, root, source)
        else:
            log.info("skills: no %s skills folder at %s", source, root)
        return found
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        log.warning("skills: cannot list %s (%s); no %s skills loaded", root, exc.strerror, source)
        return found
    for entry in entries:
        if entry.name.startswith(".") or entry.name in _SKIPPED_NAMES or not entry.is_dir():
            continue
        skill_md = entry / SKILL_FILE
        if not skill_md.is_file():
            log.warning("skills: %s has no %s; skipped", entry, SKILL_FILE)
            continue
        try:
            skill = parse_skill(skill_md, source)
        except SkillError as exc:
            log.warning("skills: skipped %s: %s", skill_md, exc)
            continue
        except Exception as exc:  # e.g. YAML that builds pathological objects: still never fatal
            log.warning("skills: skipped %s: cannot parse it (%s)", skill_md, type(exc).__name__)
            continue
        found[skill.name] = skill
    return found


# ---- the catalog ---------------------------------------------------------------------------------


class SkillCatalog:
    """The skills the agent may use, after override and enable/disable. Rebuilt by ``reload()``."""

    def __init__(self, settings: SkillsSettings) -> None:
        self.settings = settings
        self._skills: dict[str, Skill] = {}
        self._views: set[Path] = set()
        self.generation = 0
        """Bumped by every ``reload()``; the prompt middleware re-renders when it changes."""
        self._signature: tuple[tuple[str, int, int], ...] = ()
        self._checked = 0.0
        self.reload()

    def _stamp(self) -> tuple[tuple[str, int, int], ...]:
        """What changes when a skill is added, removed, replaced or its SKILL.md edited: the
        modification times of both folders, of each skill folder and of each SKILL.md. A few
        dozen ``stat`` calls, no reads (an edit to a supporting file alone is seen at the next
        change of its folder or SKILL.md, or at ``reload()``)."""
        out: list[tuple[str, int, int]] = []
        for root in (self.settings.public(), Path(self.settings.custom_dir)):
            try:
                st = root.stat()
                out.append((str(root), st.st_mtime_ns, 0))
                with os.scandir(root) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                out.append((str(root), -1, 0))
                continue
            for entry in entries:
                if entry.name.startswith(".") and entry.name != ".drafts":
                    continue
                for path in (entry.path, os.path.join(entry.path, SKILL_FILE)):
                    try:
                        st = os.stat(path, follow_symlinks=False)
                        out.append((path, st.st_mtime_ns, st.st_size))
                    except OSError:
                        out.append((path, -1, 0))
        return tuple(out)

    def refresh(self) -> bool:
        """Reload when the folders changed since the last look (``reload_seconds`` apart at most):
        skills installed, removed or edited are picked up without a restart. True when it did."""
        now = time.monotonic()
        if self._checked and now - self._checked < self.settings.reload_seconds:
            return False
        self._checked = now
        if self._stamp() == self._signature:
            return False
        log.info("skills: the skill folders changed; reloading")
        self.reload()
        return True

    def reload(self) -> None:
        """Re-read both folders (and refresh any sandbox view built before)."""
        self._signature = self._stamp()
        public = scan_skills(self.settings.public(), "public", expected=True)
        configured = "custom_dir" in self.settings.model_fields_set
        custom = scan_skills(Path(self.settings.custom_dir), "custom", expected=configured)
        for name in sorted(public.keys() & custom.keys()):
            log.info("skills: custom skill %r replaces the public one", name)
        merged = {**public, **custom}
        self._warn_unknown("enabled", self.settings.enabled or (), merged)
        self._warn_unknown("disabled", self.settings.disabled, merged)
        wanted = set(merged) if self.settings.enabled is None else set(self.settings.enabled)
        wanted -= set(self.settings.disabled)
        self._skills = {name: merged[name] for name in sorted(merged) if name in wanted}
        self.generation += 1
        log.info("skills: %d offered: %s", len(self._skills), ", ".join(self._skills) or "(none)")
        for view in self._views:
            self._sync_view(view)

    @staticmethod
    def _warn_unknown(key: str, names: Iterable[str], merged: dict[str, Skill]) -> None:
        unknown = sorted(set(names) - merged.keys())
        if unknown:
            log.warning("skills: skills.%s names %s, but no such skill was loaded", key, ", ".join(unknown))

    @property
    def skills(self) -> list[Skill]:
        """The offered skills, sorted by name."""
        return list(self._skills.values())

    @property
    def names(self) -> list[str]:
        return list(self._skills)

    def get(self, name: str) -> Skill | None:
        return self._skills.get(name)

    def __len__(self) -> int:
        return len(self._skills)

    def read_file(self, name: str, relative: str, limit: int = MAX_SKILL_BYTES) -> str:
        """A supporting text file of an offered skill (for ``load_skill``); raises SkillError.

        The path must stay inside the skill's folder after symlinks are resolved.
        """
        skill = self._skills.get(name)
        if skill is None:
            raise SkillError(f"no skill named {name!r}")
        base = skill.dir.resolve()
        target = (base / relative.lstrip("/")).resolve()
        if not target.is_relative_to(base):
            raise SkillError(f"{relative!r} is outside the skill's folder")
        if target.is_dir():
            prefix = "" if target == base else target.relative_to(base).as_posix() + "/"
            inside = [f for f in (SKILL_FILE, *skill.files) if f.startswith(prefix)]
            return "\n".join(f"- {f}" for f in inside) if inside else "(no files)"
        if not target.is_file():
            files = ", ".join(skill.files) or "none"
            raise SkillError(f"skill {name!r} has no file {relative!r}; its files: {files}")
        with target.open("rb") as fh:
            data = fh.read(limit + 1)
        try:
            text = data[:limit].decode("utf-8")
        except UnicodeDecodeError:
            raise SkillError(f"{relative!r} is not a text file; use it from the sandbox instead") from None
        if len(data) > limit:
            text += f"\n[... truncated at {limit} bytes ...]"
        return text

    # ---- the sandbox view ----------------------------------------------------------------------

    def skills_dir_for_sandbox(self, root: Path | str) -> Path:
        """A folder holding exactly the offered skills (custom over public) under their names, to be
        mounted read-only at /mnt/skills (``SandboxSettings.skills_dir``).

        Copies, not symlinks: the sandbox's path checks refuse symlinks that resolve outside the
        mount, and bubblewrap/Docker could not follow host paths anyway. The folder itself stays
        the same inode across ``reload()`` (each skill is swapped inside it), so a running Docker
        container's bind mount sees the refreshed content. ``root`` must be reachable by the
        sandbox's uid.
        """
        view = (Path(root) / VIEW_DIR).resolve()
        for source in (self.settings.public(), self.settings.custom_dir):
            src = Path(source).resolve()
            if view == src or view.is_relative_to(src) or src.is_relative_to(view):
                raise ValueError(f"the skills view {view} must not overlap the skills folder {src}")
        marker = view / VIEW_MARKER
        if view.is_dir() and any(view.iterdir()) and not marker.exists():
            # We delete whatever is not an offered skill: never do that to a folder we did not make.
            raise ValueError(f"{view} exists and was not made by Chital; choose another cache root")
        view.mkdir(parents=True, exist_ok=True)
        os.chmod(view, 0o755)
        marker.touch()
        self._views.add(view)
        self._sync_view(view)
        return view

    def _sync_view(self, view: Path) -> None:
        for entry in view.iterdir():
            if entry.name not in self._skills and entry.name != VIEW_MARKER:
                _remove(entry)
        for skill in self._skills.values():
            staging = view / f".{skill.name}.{uuid.uuid4().hex[:8]}"
            try:
                _copy_tree(skill.dir, staging)
            except OSError as exc:
                log.warning("skills: cannot copy %s into the sandbox view (%s)", skill.dir, exc)
                _remove(staging)
                continue
            target = view / skill.name
            old = view / f".{skill.name}.old-{uuid.uuid4().hex[:8]}"
            if target.exists() or target.is_symlink():
                target.rename(old)
            staging.rename(target)
            _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy regular files and folders only, world-readable; symlinks are skipped (they could point
    at host files the sandbox must not see)."""
    dst.mkdir(mode=0o755)
    os.chmod(dst, 0o755)
    for entry in sorted(src.iterdir()):
        if entry.name in _SKIPPED_NAMES:
            continue
        if entry.is_symlink():
            log.warning("skills: %s is a symlink; left out of the sandbox view", entry)
        elif entry.is_dir():
            _copy_tree(entry, dst / entry.name)
        elif entry.is_file():
            size = entry.stat().st_size
            if size > MAX_VIEW_FILE_BYTES:
                log.warning("skills: %s is %d bytes; left out of the sandbox view", entry, size)
                continue
            shutil.copyfile(entry, dst / entry.name)
            executable = os.access(entry, os.X_OK)
            os.chmod(dst / entry.name, 0o755 if executable else 0o644)


# ---- wiring --------------------------------------------------------------------------------------


def build_skills(
    settings: SkillsSettings,
) -> tuple[list[BaseTool], list[AgentMiddleware[Any, Any, Any]], SkillCatalog]:
    """``(tools, middleware, catalog)`` for the harness: the ``load_skill`` tool, the listing
    middleware, and the catalog (for ``skills_dir_for_sandbox`` and ``reload``)."""
    from agent.skills_prompt import SkillsListing, make_load_skill_tool

    catalog = SkillCatalog(settings)
    return [make_load_skill_tool(catalog)], [SkillsListing(catalog)], catalog
