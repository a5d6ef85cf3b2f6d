"""Skill archives for the tests, good and malicious, built byte by byte with the standard library
(zipfile, tarfile), so a test can state exactly which header lies (a symlink's mode bits, a
``..`` name, a member that inflates past the caps)."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass


def skill_md(
    name: str = "house-style", description: str = "Write in the house style.", body: str = "Do X."
) -> bytes:
    return f"---\nname: {name}\ndescription: {description}\n---\n\n{body}\n".encode()


@dataclass(frozen=True)
class Entry:
    """One archive member: a file (``data``), a folder (``kind='dir'``), or a link/device (``kind``
    ``symlink``, ``hardlink``, ``chr``, ``fifo`` with ``target``)."""

    path: str
    data: bytes = b""
    kind: str = "file"
    mode: int = 0o644
    target: str = ""


def good_entries(name: str = "house-style", top: str | None = "house-style") -> list[Entry]:
    prefix = f"{top}/" if top else ""
    return [
        Entry(f"{prefix}SKILL.md", skill_md(name)),
        Entry(f"{prefix}reference.md", b"REFERENCE\n"),
        Entry(f"{prefix}scripts/run.sh", b"#!/bin/sh\necho ran\n", mode=0o755),
        Entry(f"{prefix}tool.bin", b"\x7fELF", mode=0o755),
    ]


def make_zip(entries: Iterable[Entry], *, level: int = 6) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=level) as zf:
        for e in entries:
            info = zipfile.ZipInfo(e.path + ("/" if e.kind == "dir" and not e.path.endswith("/") else ""))
            info.compress_type = zipfile.ZIP_DEFLATED
            kind = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK, "chr": stat.S_IFCHR,
                    "fifo": stat.S_IFIFO}[e.kind]  # fmt: skip
            info.external_attr = (kind | e.mode) << 16
            zf.writestr(info, e.target.encode() if e.kind == "symlink" else e.data)
    return buf.getvalue()


def make_tar_gz(entries: Iterable[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for e in entries:
            info = tarfile.TarInfo(e.path)
            info.mode = e.mode
            if e.kind == "file":
                info.size = len(e.data)
                tf.addfile(info, io.BytesIO(e.data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
                         "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[e.kind]  # fmt: skip
            info.linkname = e.target
            tf.addfile(info)
    return buf.getvalue()
