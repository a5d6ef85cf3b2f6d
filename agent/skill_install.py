"""Installing, removing and drafting custom skills: the one place that writes into ``skills/custom``.

Three ways in, one gate each:

- **An archive** (``chital skills install PATH|URL``, an admin's ``/skills install`` with a file):
  :func:`check_archive` reads and checks it entirely in memory (agent/skill_archive.py: sizes,
  counts, links, paths) and parses its ``SKILL.md`` (front matter, name, description); only then
  does :func:`install_archive` write, into a temporary folder inside ``custom_dir`` (the same
  filesystem) renamed into place, so a reader never sees half a skill and a crash leaves only a
  hidden ``.install-*`` folder the catalog ignores.
- **A draft** by the agent (:func:`draft_skill`): written under ``custom_dir/.drafts/``, which the
  catalog never reads, so no user can load it until an admin approves it (:func:`approve_draft`
  moves it into place). A draft's text may come from a web page the model read: nothing the model
  writes becomes a skill without an admin.
- **Removal** (:func:`remove_skill`): custom skills and drafts only; shipped skills are disabled in
  the config instead.

Each installed skill carries its provenance (who, from where, when, the archive's SHA-256, the
scripts listed for review) in ``.chital-install.json`` inside its folder; the catalog reads it for
``/skills`` and ``chital skills list`` and never copies it into the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from agent.settings import SkillsSettings
from agent.skill_archive import Archive, ArchiveError, Member, read_archive
from agent.skills import (
    MAX_NAME,
    MAX_SKILL_BYTES,
    NAME_RE,
    PROVENANCE_FILE,
    SKILL_FILE,
    Skill,
    SkillError,
    parse_skill,
    scan_skills,
)

DRAFTS = ".drafts"
MAX_PENDING_DRAFTS = 20
"""Drafts that may wait at once: the model cannot fill the disk with them."""
"""Drafted skills wait here (hidden: the catalog skips it) for an admin's approval."""


@dataclass(frozen=True, slots=True)
class Installed:
    """What an install did, for the admin's reply."""

    name: str
    description: str
    files: int
    unpacked_bytes: int
    scripts: list[str]
    """Files to review before relying on the skill: executables, ``scripts/``, code by suffix."""
    replaced: bool = False


@dataclass(frozen=True, slots=True)
class Listed:
    """One skill as ``/skills`` and ``chital skills list`` show it."""

    name: str
    description: str
    source: str
    """``public``, ``custom`` or ``drafted``."""
    state: str
    """``active``, ``awaiting approval``, ``disabled`` (by the config) or ``replaced`` (a public
    skill a custom one of the same name overrides)."""
    installed_by: str | None = None
    origin: str | None = None
    installed_at: str | None = None
    scripts: list[str] = field(default_factory=list)


def clean_origin(origin: str) -> str:
    """``origin`` as recorded: a URL loses its user, password, query and fragment (a signed
    download link's token must not land in a file everyone can list)."""
    origin = origin.strip()
    if "://" in origin:
        with contextlib.suppress(ValueError):
            parts = urlsplit(origin)
            host = parts.hostname or ""
            netloc = f"{host}:{parts.port}" if parts.port else host
            return urlunsplit((parts.scheme, netloc, parts.path, "", ""))[:300]
    return origin[:300]


def check_name(name: str, settings: SkillsSettings, reserved: Collection[str] = ()) -> None:
    """A new custom skill's name: the spec's form (ASCII lower case, digits, single hyphens; so no
    look-alike letters), not a shipped skill's, not a reserved word (the chat commands)."""
    if len(name) > MAX_NAME or not NAME_RE.match(name):
        raise SkillError(
            f"name {ascii(name)[:80]} is not valid: use at most {MAX_NAME} lowercase ASCII letters, "
            "digits and single hyphens"
        )
    if name in scan_skills(settings.public(), "public"):
        raise SkillError(f"{name!r} is the name of a shipped skill; choose another name")
    if name in reserved or name.replace("-", "_") in reserved:
        raise SkillError(f"{name!r} is the name of a chat command; choose another name")


def check_archive(
    data: bytes, settings: SkillsSettings, *, reserved: Collection[str] = (), replace: bool = False
) -> tuple[Archive, Skill]:
    """Everything about ``data`` that decides whether it may be installed, before any write."""
    archive = read_archive(data)
    skill_md = archive.get(SKILL_FILE)
    assert skill_md is not None  # read_archive guarantees it
    if len(skill_md.data) > MAX_SKILL_BYTES:
        raise ArchiveError(f"{SKILL_FILE} is {len(skill_md.data):,} bytes; the limit is {MAX_SKILL_BYTES:,}")
    others = tuple(m.path for m in archive.files if m.path != SKILL_FILE)
    try:
        skill = parse_skill(Path(SKILL_FILE), "custom", raw=skill_md.data, files=others)
    except SkillError as exc:
        raise ArchiveError(f"{SKILL_FILE}: {exc}") from None
    check_name(skill.name, settings, reserved)
    if archive.top is not None and archive.top != skill.name:
        raise ArchiveError(
            f"the archive's folder {ascii(archive.top)[:80]} does not match the skill's name {skill.name!r}"
        )
    target = Path(settings.custom_dir) / skill.name
    if (target.exists() or target.is_symlink()) and not replace:
        raise ArchiveError(f"a custom skill named {skill.name!r} is installed already; remove it first")
    return archive, skill


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write(path: Path, data: bytes, mode: int) -> None:
    """A new file, never through a link (the temporary folder is ours, but be exact anyway)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)


def _provenance(name: str, how: str, by: str, origin: str, scripts: list[str], sha256: str) -> bytes:
    meta = {
        "name": name,
        "how": how,
        "installed_by": by[:200],
        "origin": clean_origin(origin),
        "installed_at": _now(),
        "sha256": sha256,
        "scripts": scripts,
    }
    return json.dumps(meta, indent=2, ensure_ascii=False).encode()


def _stage(root: Path, files: tuple[Member, ...], folders: tuple[str, ...], provenance: bytes) -> Path:
    """The skill's files in a new hidden folder of ``root`` (same filesystem: renamed in one step)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".install-{uuid.uuid4().hex[:12]}"
    tmp.mkdir(mode=0o755)
    try:
        for folder in folders:
            (tmp / folder).mkdir(mode=0o755, parents=True, exist_ok=True)
        for member in files:
            target = tmp / member.path
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            _write(target, member.data, 0o755 if member.executable else 0o644)
        _write(tmp / PROVENANCE_FILE, provenance, 0o644)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _swap_in(tmp: Path, target: Path, *, replace: bool) -> bool:
    """Rename ``tmp`` to ``target``; an existing one is set aside first only when ``replace``."""
    old: Path | None = None
    try:
        if target.exists() or target.is_symlink():
            if not replace:
                raise ArchiveError(f"a custom skill named {target.name!r} is installed already")
            old = target.with_name(f".old-{target.name}-{uuid.uuid4().hex[:8]}")
            target.rename(old)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not target.exists():
            old.rename(target)
        raise
    if old is not None:
        _remove(old)
    return old is not None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def install_archive(
    data: bytes,
    settings: SkillsSettings,
    *,
    installed_by: str,
    origin: str,
    reserved: Collection[str] = (),
    replace: bool = False,
) -> Installed:
    """Check ``data`` and install it into ``custom_dir``; ArchiveError/SkillError say why not."""
    archive, skill = check_archive(data, settings, reserved=reserved, replace=replace)
    scripts = archive.scripts
    meta = _provenance(
        skill.name, "installed", installed_by, origin, scripts, hashlib.sha256(data).hexdigest()
    )
    root = Path(settings.custom_dir)
    tmp = _stage(root, archive.files, archive.folders, meta)
    replaced = _swap_in(tmp, root / skill.name, replace=replace)
    return Installed(
        skill.name, skill.description, len(archive.files), archive.unpacked_bytes, scripts, replaced
    )


def remove_skill(settings: SkillsSettings, name: str) -> str:
    """Remove the custom skill (or the draft) ``name``; returns what was removed, raises
    SkillError when there is no such custom skill (a shipped one is disabled in the config)."""
    if not NAME_RE.match(name) or len(name) > MAX_NAME:
        raise SkillError(f"there is no custom skill named {ascii(name)[:80]}")
    root = Path(settings.custom_dir)
    for folder, what in ((root / name, "custom skill"), (root / DRAFTS / name, "draft")):
        if folder.is_dir() and not folder.is_symlink():
            # Renamed away first: the catalog never sees a half-deleted folder.
            gone = folder.with_name(f".removed-{name}-{uuid.uuid4().hex[:8]}")
            folder.rename(gone)
            _remove(gone)
            return what
    if name in scan_skills(settings.public(), "public"):
        raise SkillError(
            f"{name!r} is a shipped skill; it cannot be removed: "
            "add it to skills.disabled in the config instead"
        )
    raise SkillError(f"there is no custom skill named {name!r}")


# -- drafts --------------------------------------------------------------------------------------------
def draft_skill(
    settings: SkillsSettings,
    name: str,
    description: str,
    body: str,
    *,
    drafted_by: str,
    origin: str,
    reserved: Collection[str] = (),
) -> Skill:
    """Write a draft (``custom_dir/.drafts/<name>/SKILL.md``) that waits for an admin; never offered
    to anyone before :func:`approve_draft`. A pending draft is never replaced: what an admin read
    must be what they approve (and :func:`approve_draft` checks its fingerprint too)."""
    check_name(name, settings, reserved)
    if (Path(settings.custom_dir) / name).exists():
        raise SkillError(f"a custom skill named {name!r} is installed already; choose another name")
    pending = pending_drafts(settings)
    if name in pending or (Path(settings.custom_dir) / DRAFTS / name).exists():
        raise SkillError(f"a draft named {name!r} already waits for an admin; choose another name")
    if len(pending) >= MAX_PENDING_DRAFTS:
        raise SkillError(
            f"{len(pending)} drafts already wait for an admin: ask one to approve or reject them"
        )
    front = json.dumps({"name": name, "description": " ".join(description.split())}, ensure_ascii=False)
    text = f"---\n{front}\n---\n\n{body.strip()}\n".encode()
    skill = parse_skill(Path(name) / SKILL_FILE, "custom", raw=text, files=())  # the same rules as any skill
    meta = _provenance(name, "drafted", drafted_by, origin, [], hashlib.sha256(text).hexdigest())
    drafts = Path(settings.custom_dir) / DRAFTS
    tmp = _stage(drafts, (Member(SKILL_FILE, text, False),), (), meta)
    _swap_in(tmp, drafts / name, replace=True)
    return skill


def pending_drafts(settings: SkillsSettings) -> dict[str, Skill]:
    """The drafts waiting for an admin (parsed like skills, provenance included)."""
    return scan_skills(Path(settings.custom_dir) / DRAFTS, "custom")


def draft_fingerprint(settings: SkillsSettings, name: str) -> str | None:
    """The first 8 hex digits of the SHA-256 of a pending draft's SKILL.md: shown with the draft,
    carried by its Approve button and the approve command, so an approval names the text read."""
    draft = pending_drafts(settings).get(name)
    return None if draft is None else _fingerprint(draft)


def _fingerprint(draft: Skill) -> str:
    with (draft.dir / SKILL_FILE).open("rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()[:8]


def approve_draft(
    settings: SkillsSettings, name: str, approved_by: str, fingerprint: str | None = None
) -> Skill:
    """Move the draft ``name`` into ``custom_dir``: from now on it is offered like any skill. With
    ``fingerprint`` (chat approvals), only if the draft is still the text that fingerprint names."""
    drafts = pending_drafts(settings)
    draft = drafts.get(name)
    if draft is None:
        raise SkillError(f"there is no draft named {ascii(name)[:80]} waiting for approval")
    if fingerprint is not None and _fingerprint(draft) != fingerprint.lower():
        raise SkillError(
            f"the draft {name!r} is not the text that was shown; read it again with /skills show"
        )
    target = Path(settings.custom_dir) / name
    if target.exists():
        raise SkillError(f"a custom skill named {name!r} is installed already")
    meta_path = draft.dir / PROVENANCE_FILE
    with contextlib.suppress(OSError, ValueError):
        meta = json.loads(meta_path.read_text())
        meta["approved_by"] = approved_by[:200]
        meta["approved_at"] = _now()
        meta_path.write_text(json.dumps(meta, indent=2, ensure_ascii=False))
    draft.dir.rename(target)
    return draft


def reject_draft(settings: SkillsSettings, name: str) -> bool:
    folder = Path(settings.custom_dir) / DRAFTS / name
    if not NAME_RE.match(name) or not folder.is_dir() or folder.is_symlink():
        return False
    _remove(folder)
    return True


# -- listing -------------------------------------------------------------------------------------------
def list_skills(settings: SkillsSettings) -> list[Listed]:
    """Every skill on disk with its source and state: what the catalog offers, what the config
    disables, public skills a custom one replaces, and drafts awaiting approval."""
    public = scan_skills(settings.public(), "public")
    custom = scan_skills(Path(settings.custom_dir), "custom")
    wanted = set(public) | set(custom) if settings.enabled is None else set(settings.enabled)
    wanted -= set(settings.disabled)
    out: list[Listed] = []
    for name, skill in sorted(public.items()):
        state = "replaced" if name in custom else ("active" if name in wanted else "disabled")
        out.append(Listed(name, skill.description, "public", state))
    for name, skill in sorted(custom.items()):
        out.append(
            Listed(
                name,
                skill.description,
                "drafted" if skill.drafted else "custom",
                "active" if name in wanted else "disabled",
                skill.installed_by,
                skill.origin,
                skill.installed_at,
                _scripts_of(skill),
            )
        )
    for name, skill in sorted(pending_drafts(settings).items()):
        out.append(
            Listed(
                name, skill.description, "drafted", "awaiting approval",
                skill.installed_by, skill.origin, skill.installed_at,
            )
        )  # fmt: skip
    return out


def _scripts_of(skill: Skill) -> list[str]:
    with contextlib.suppress(OSError, ValueError):
        meta = json.loads((skill.dir / PROVENANCE_FILE).read_text())
        scripts = meta.get("scripts")
        if isinstance(scripts, list):
            return [str(s) for s in scripts][:100]
    return []


__all__ = [
    "DRAFTS",
    "MAX_PENDING_DRAFTS",
    "ArchiveError",
    "Installed",
    "Listed",
    "approve_draft",
    "check_archive",
    "clean_origin",
    "download_archive",
    "draft_fingerprint",
    "draft_skill",
    "install_archive",
    "list_skills",
    "pending_drafts",
    "reject_draft",
    "remove_skill",
]


# -- from a URL ----------------------------------------------------------------------------------------
DOWNLOAD_SECONDS = 60.0
MAX_REDIRECTS = 5


async def download_archive(url: str, allow_hosts: Collection[str] = ()) -> bytes:
    """The archive at ``url`` (http/https), through the same address guard as ``web_fetch``
    (agent/tools/web_guard.py: no internal address, at any redirect or socket, unless
    ``allow_hosts`` opens it), at most ``MAX_ARCHIVE_BYTES`` (more is refused, not cut) and
    ``DOWNLOAD_SECONDS``. Errors are SkillError with the URL's credentials left out."""
    import aiohttp
    from yarl import URL

    from agent.skill_archive import MAX_ARCHIVE_BYTES
    from agent.tools.web_guard import AddressPolicy, GuardedConnector, UrlRefused, check_target

    shown = clean_origin(url)
    policy = AddressPolicy(allow_hosts)
    connector = GuardedConnector(policy)
    current: str | URL = url
    try:
        async with (
            asyncio.timeout(DOWNLOAD_SECONDS),
            aiohttp.ClientSession(connector=connector, connector_owner=False, trust_env=False) as session,
        ):
            for _ in range(MAX_REDIRECTS + 1):
                target = check_target(current, policy)
                async with session.get(target, allow_redirects=False) as resp:
                    if resp.status in (301, 302, 303, 307, 308) and "Location" in resp.headers:
                        current = resp.url.join(URL(resp.headers["Location"]))
                        continue
                    if resp.status >= 400:
                        raise SkillError(f"HTTP {resp.status} from {shown}")
                    if (resp.content_length or 0) > MAX_ARCHIVE_BYTES:
                        raise ArchiveError(f"the archive is larger than {MAX_ARCHIVE_BYTES:,} bytes")
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in resp.content.iter_chunked(64 * 1024):
                        size += len(chunk)
                        if size > MAX_ARCHIVE_BYTES:
                            raise ArchiveError(f"the archive is larger than {MAX_ARCHIVE_BYTES:,} bytes")
                        chunks.append(chunk)
                    return b"".join(chunks)
            raise SkillError(f"too many redirects from {shown}")
    except SkillError:  # our own refusals (a ValueError too): as they are
        raise
    except TimeoutError:
        raise SkillError(f"downloading {shown} took longer than {DOWNLOAD_SECONDS:g} s") from None
    except UrlRefused as exc:
        raise SkillError(str(exc)) from None
    except (aiohttp.ClientError, ValueError, UnicodeError) as exc:
        if connector.refusals:
            raise SkillError(connector.refusals[0]) from None
        raise SkillError(f"could not download {shown}: {type(exc).__name__}") from None
    finally:
        await connector.close()
