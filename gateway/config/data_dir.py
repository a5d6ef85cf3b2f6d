"""The data directory is private: 0700, every file in it 0600, whatever the umask.

Why: with the usual umask 022 a host install left conversations world-readable (the directory
0755, the databases 0644) while the image, ``.env``, the logs and the status socket were private.
SQLite gives a database's ``-wal`` and ``-shm`` files the mode of the database itself, so
creating each database 0600 before SQLite first opens it keeps those private too; files an older
version left readable are fixed at start, with one log line saying what changed.

One exception, as root: sandboxed code runs as an unprivileged uid that must *pass through* the
data directory to reach its thread directories when the sandbox root lies inside it (the default
``data/sandboxes``). The directory is then 0711: search without listing, and every file in it is
still 0600 (docs/operations.md, "Permissions of the data directory").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gateway.config.schema import Config

FILE_MODE = 0o600
DIR_MODE = 0o700
PASS_THROUGH_MODE = 0o711


def sandbox_inside(cfg: Config) -> Path | None:
    """The sandbox root when it lies inside the data directory and, the daemon being root,
    another uid must pass through to reach it; else None."""
    if os.geteuid() != 0 or not cfg.agent.tools:
        return None
    root = cfg.agent.sandbox.root
    data = cfg.storage.path.resolve()
    root = (root if root.is_absolute() else data / root).resolve()
    return root if root.is_relative_to(data) and root != data else None


def databases(cfg: Config) -> list[Path]:
    """The SQLite files the daemon opens under the data directory (none with PostgreSQL)."""
    if cfg.storage.database_url:
        return []
    data = cfg.storage.path
    names = [data / "gateway.sqlite", data / "checkpoints.sqlite"]
    if cfg.agent.memory.enabled and cfg.agent.memory.db_path is None:
        names.append(data / "memory.sqlite")
    return names


def create_private(path: Path) -> None:
    """Create ``path`` empty and 0600 unless it exists (an empty file is a valid SQLite database)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return
    os.fchmod(fd, FILE_MODE)
    os.close(fd)


def make_private_dir(path: Path) -> None:
    """``mkdir -p`` whose last directory is created 0700 regardless of the umask."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=DIR_MODE)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)


def secure(cfg: Config) -> str | None:
    """Make the data directory and what it holds private (see the module docstring) and create
    its databases 0600. Returns the one line to log when something had to be changed."""
    data = cfg.storage.path
    make_private_dir(data)
    sandbox = sandbox_inside(cfg)
    want = PASS_THROUGH_MODE if sandbox is not None else DIR_MODE
    changed: list[str] = []
    mode = stat.S_IMODE(os.lstat(data).st_mode)
    if mode != want:
        os.chmod(data, want)
        if mode & ~want:  # others could do more than ``want`` allows: a privacy fix, said once
            changed.append(f"the directory {mode:04o} → {want:04o}")
        # else 0700 → 0711 as root: the documented pass-through the sandbox needs, made on every
        # first start (the directory is created 0700); not a fix, so nothing to warn about.
    files: list[str] = []
    with os.scandir(data) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
                continue
            if stat.S_ISDIR(st.st_mode):
                if sandbox is not None and Path(entry.path).resolve() == sandbox:
                    continue  # the sandbox provider keeps its root's own mode (docs/sandbox.md)
                os.chmod(entry.path, DIR_MODE)
            elif stat.S_ISREG(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                os.chmod(entry.path, FILE_MODE)
            else:
                continue
            files.append(entry.name)
    if files:
        shown = ", ".join(sorted(files)[:8]) + (", …" if len(files) > 8 else "")
        noun = "entry" if len(files) == 1 else "entries"
        changed.append(f"{len(files)} {noun} others could read → 0600/0700: {shown}")
    for db in databases(cfg):
        create_private(db)
    if not changed:
        return None
    return f"data directory {data}: made private: {'; '.join(changed)}"
