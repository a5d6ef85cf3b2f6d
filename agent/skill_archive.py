"""Reading a skill archive (zip or tar.gz) into memory, checking every member before anything is
written anywhere.

An archive is untrusted input: it comes from a chat attachment or a URL. Everything below is
decided on the archive's own bytes, in memory, so a refused archive leaves no trace on disk:

- **Size.** The archive itself is at most :data:`MAX_ARCHIVE_BYTES`; what it unpacks to is counted
  while decompressing (never trusting the sizes the headers claim), at most
  :data:`MAX_UNPACKED_BYTES` in all and :data:`MAX_FILE_BYTES` a file, so a zip or gzip bomb stops
  at the cap instead of filling memory. At most :data:`MAX_FILES` entries.
- **Kinds.** Regular files and folders only: symlinks, hard links, devices and FIFOs are refused
  (a link could later expose a host file through the sandbox view or the ``load_skill`` tool).
- **Paths.** Relative, ``/``-separated, no ``..``, no empty or ``.`` components, no backslashes or
  drive letters, no control, bidi or zero-width characters, at most :data:`MAX_DEPTH` deep, and no
  two that are the same after Unicode NFC and case folding (they would collide on macOS volumes,
  or be two files that look like one to a reviewer).
- **Layout.** ``SKILL.md`` at the top, or inside one single top folder (how most people zip a
  folder); that folder is stripped.

What it gives back (:class:`Archive`) is the list of files with their bytes and executable bits;
agent/skill_install.py checks the front matter and writes it out.
"""

from __future__ import annotations

import gzip
import io
import stat
import tarfile
import unicodedata
import zipfile
import zlib
from dataclasses import dataclass
from typing import IO

from agent.skills import SKILL_FILE, SkillError

MAX_ARCHIVE_BYTES = 10 * 1024 * 1024
"""The archive as sent (compressed)."""
MAX_UNPACKED_BYTES = 50 * 1024 * 1024
"""All its files together, unpacked."""
MAX_FILE_BYTES = 20 * 1024 * 1024
"""One file, unpacked (the sandbox view leaves out larger ones anyway)."""
MAX_FILES = 300
"""Entries (files and folders)."""
MAX_DEPTH = 12
MAX_PATH_CHARS = 240

SCRIPT_SUFFIXES = frozenset({".sh", ".bash", ".zsh", ".py", ".js", ".mjs", ".ts", ".rb", ".pl", ".php",
                             ".ps1", ".bat", ".cmd", ".exe", ".bin", ".so", ".dll", ".jar"})  # fmt: skip
"""Files listed for review as scripts even without an executable bit."""

_BAD_CHARS = frozenset('\\:*?"<>|')
_BIDI_AND_INVISIBLE = frozenset(
    "\u061c\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064"
    "\u2066\u2067\u2068\u2069\ufeff\u00ad"
)


class ArchiveError(SkillError):
    """The archive is refused; the message says why in words an admin can act on."""


@dataclass(frozen=True, slots=True)
class Member:
    path: str
    """Relative to the skill's folder, ``/``-separated."""
    data: bytes
    executable: bool

    @property
    def is_script(self) -> bool:
        """Listed for the admin to review: executable, under ``scripts/``, or code by its suffix."""
        suffix = "." + self.path.rsplit(".", 1)[-1].lower() if "." in self.path.rsplit("/", 1)[-1] else ""
        return self.executable or self.path.startswith("scripts/") or suffix in SCRIPT_SUFFIXES


@dataclass(frozen=True, slots=True)
class Archive:
    files: tuple[Member, ...]
    folders: tuple[str, ...]
    top: str | None
    """The single top folder the archive had (stripped), if any."""

    def get(self, path: str) -> Member | None:
        return next((m for m in self.files if m.path == path), None)

    @property
    def scripts(self) -> list[str]:
        return [m.path for m in self.files if m.is_script]

    @property
    def unpacked_bytes(self) -> int:
        return sum(len(m.data) for m in self.files)


def check_path(raw: str) -> str:
    """``raw`` as a safe relative path (folders' trailing ``/`` dropped), or ArchiveError."""
    shown = ascii(raw)[:80]
    if not raw or "\x00" in raw:
        raise ArchiveError(f"an entry has an empty or NUL-containing name ({shown})")
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
        raise ArchiveError(f"{shown} is an absolute path")
    if any(ch in _BAD_CHARS for ch in raw):
        raise ArchiveError(f"{shown} contains a backslash or a character not allowed in file names")
    if any(unicodedata.category(ch) in ("Cc", "Cf") or ch in _BIDI_AND_INVISIBLE for ch in raw):
        raise ArchiveError(f"{shown} contains control, bidi or invisible characters")
    if len(raw) > MAX_PATH_CHARS:
        raise ArchiveError(f"{shown} is longer than {MAX_PATH_CHARS} characters")
    parts = raw.rstrip("/").split("/")
    if any(p == ".." for p in parts):
        raise ArchiveError(f"{shown} leaves the skill's folder ('..')")
    if any(p in ("", ".") for p in parts):
        raise ArchiveError(f"{shown} has an empty or '.' path component")
    if len(parts) > MAX_DEPTH:
        raise ArchiveError(f"{shown} is nested deeper than {MAX_DEPTH} folders")
    return "/".join(parts)


class _Budget:
    """Counts unpacked bytes across members while reading, whatever the headers claim."""

    def __init__(self) -> None:
        self.total = 0

    def read(self, stream: IO[bytes] | gzip.GzipFile | None, name: str) -> bytes:
        if stream is None:
            raise ArchiveError(f"cannot read {ascii(name)[:80]} from the archive")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = stream.read(64 * 1024)
            if not chunk:
                break
            size += len(chunk)
            self.total += len(chunk)
            if size > MAX_FILE_BYTES:
                raise ArchiveError(f"{ascii(name)[:80]} unpacks to more than {MAX_FILE_BYTES // 2**20} MB")
            if self.total > MAX_UNPACKED_BYTES:
                raise ArchiveError(f"the archive unpacks to more than {MAX_UNPACKED_BYTES // 2**20} MB")
            chunks.append(chunk)
        return b"".join(chunks)


def _from_zip(data: bytes) -> list[tuple[str, bytes | None, bool]]:
    out: list[tuple[str, bytes | None, bool]] = []
    budget = _Budget()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_FILES:
                raise ArchiveError(f"the archive has {len(infos)} entries; the limit is {MAX_FILES}")
            for info in infos:
                mode = info.external_attr >> 16
                kind = stat.S_IFMT(mode)
                if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
                    what = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
                    raise ArchiveError(
                        f"{ascii(info.filename)[:80]} is {what}; only regular files and folders are allowed"
                    )
                if info.flag_bits & 0x1:
                    raise ArchiveError("the archive is encrypted")
                if info.is_dir():
                    out.append((info.filename, None, False))
                    continue
                check_path(info.filename)  # before reading a byte of it
                with zf.open(info) as fh:
                    body = budget.read(fh, info.filename)
                out.append((info.filename, body, bool(mode & 0o111)))
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        raise ArchiveError(f"the zip archive is damaged or unsupported ({type(exc).__name__})") from None
    return out


def _from_tar_gz(data: bytes) -> list[tuple[str, bytes | None, bool]]:
    # Decompress first, capped: iterating a tar.gz would otherwise inflate a bomb to find members.
    budget = _Budget()
    try:
        raw = budget.read(gzip.GzipFile(fileobj=io.BytesIO(data)), "the tar stream")
    except (OSError, EOFError, zlib.error) as exc:
        raise ArchiveError(f"the gzip stream is damaged ({type(exc).__name__})") from None
    out: list[tuple[str, bytes | None, bool]] = []
    members = _Budget()
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
            count = 0
            for info in tf:
                count += 1
                if count > MAX_FILES:
                    raise ArchiveError(f"the archive has more than {MAX_FILES} entries")
                if info.isdir():
                    out.append((info.name, None, False))
                    continue
                if not info.isreg():
                    what = "a link" if info.issym() or info.islnk() else "a device, FIFO or special entry"
                    raise ArchiveError(
                        f"{ascii(info.name)[:80]} is {what}; only regular files and folders are allowed"
                    )
                check_path(info.name)
                if info.issparse():  # a few stored bytes that expand to gigabytes when read
                    raise ArchiveError(f"{ascii(info.name)[:80]} is a sparse file: not allowed")
                if info.size > MAX_FILE_BYTES:
                    raise ArchiveError(f"{ascii(info.name)[:80]} is larger than {MAX_FILE_BYTES // 2**20} MB")
                # Counted as read, like a zip's members, whatever the header says.
                body = members.read(tf.extractfile(info), info.name)
                out.append((info.name, body, bool(info.mode & 0o111)))
    except tarfile.TarError as exc:
        raise ArchiveError(f"the tar archive is damaged ({type(exc).__name__})") from None
    return out


def read_archive(data: bytes) -> Archive:
    """Check ``data`` (a zip or a tar.gz) and return its files; ArchiveError says what is wrong."""
    if len(data) > MAX_ARCHIVE_BYTES:
        raise ArchiveError(f"the archive is {len(data):,} bytes; the limit is {MAX_ARCHIVE_BYTES:,}")
    if data[:4] == b"PK\x03\x04" or data[:4] == b"PK\x05\x06":
        entries = _from_zip(data)
    elif data[:2] == b"\x1f\x8b":
        entries = _from_tar_gz(data)
    else:
        raise ArchiveError("not a zip or tar.gz archive")
    seen: dict[str, str] = {}
    files: dict[str, Member] = {}
    folders: set[str] = set()
    for raw, body, executable in entries:
        path = check_path(raw)
        key = unicodedata.normalize("NFC", path).casefold()
        if key in seen:
            raise ArchiveError(f"{ascii(path)[:80]} appears twice (or differs only in case or Unicode form)")
        seen[key] = path
        if body is None:
            folders.add(path)
        else:
            files[path] = Member(path, body, executable)
    for path in files:  # a file and a folder under the same name, or a file used as a folder
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in files:
                raise ArchiveError(f"{ascii(path)[:80]} is inside a file")
            folders.add("/".join(parts[:i]))
    if not files:
        raise ArchiveError("the archive is empty")
    top: str | None = None
    if SKILL_FILE not in files:
        tops = {p.split("/", 1)[0] for p in [*files, *folders]}
        if len(tops) == 1 and f"{next(iter(tops))}/{SKILL_FILE}" in files:
            top = next(iter(tops))
        else:
            raise ArchiveError(f"no {SKILL_FILE} at the top of the archive (or inside its single top folder)")
    if top is not None:
        cut = len(top) + 1
        files = {p[cut:]: Member(p[cut:], m.data, m.executable) for p, m in files.items()}
        folders = {f[cut:] for f in folders if f != top}
    return Archive(tuple(files[p] for p in sorted(files)), tuple(sorted(folders)), top)
