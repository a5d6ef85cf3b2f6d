"""Virtual paths the agent sees, and their mapping onto one thread's host directories.

The agent only ever names virtual paths (``/mnt/user-data/workspace/x.py``). Every host-side file
operation goes through :class:`PathMapper`, which refuses anything that would land outside the
thread's own directories: ``..`` escapes, absolute host paths, and symlinks (planted by sandboxed
code) that resolve elsewhere. Writes to the skills mount are refused.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

USER_DATA = "/mnt/user-data"
WORKSPACE = "/mnt/user-data/workspace"
UPLOADS = "/mnt/user-data/uploads"
OUTPUTS = "/mnt/user-data/outputs"
SKILLS = "/mnt/skills"

# Directories that exist only virtually (parents of the mounts); listing them is allowed.
_SYNTHETIC_DIRS: dict[str, tuple[str, ...]] = {
    "/": ("/mnt",),
    "/mnt": (USER_DATA, SKILLS),
    USER_DATA: (WORKSPACE, UPLOADS, OUTPUTS),
}


class SandboxError(Exception):
    """Base of every error the sandbox layer raises on purpose; its text is safe to show the model."""


class PathRefused(SandboxError):
    """A path points outside the thread's sandbox, or a write targets a read-only mount."""


def safe_thread_id(thread_id: str) -> str:
    """A filesystem- and Docker-name-safe, collision-free form of an arbitrary thread id.

    A readable prefix helps operators; the hash keeps distinct ids distinct after sanitizing.
    """
    if not thread_id:
        raise ValueError("thread id must not be empty")
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", thread_id)[:48].strip("._") or "t"
    digest = hashlib.sha256(thread_id.encode()).hexdigest()[:12]
    return f"{readable}-{digest}"


@dataclass(frozen=True)
class Mount:
    """One virtual mount point and the host directory behind it."""

    virtual: str
    host: Path
    writable: bool


@dataclass(frozen=True)
class ThreadDirs:
    """Host directories of one thread: ``<root>/threads/<safe id>/{workspace,uploads,outputs}``."""

    thread_id: str
    base: Path
    skills: Path | None

    @classmethod
    def for_thread(cls, root: Path | str, thread_id: str, skills: Path | str | None) -> ThreadDirs:
        base = Path(root).resolve() / "threads" / safe_thread_id(thread_id)
        return cls(thread_id, base, Path(skills).resolve() if skills else None)

    @property
    def workspace(self) -> Path:
        return self.base / "workspace"

    @property
    def uploads(self) -> Path:
        return self.base / "uploads"

    @property
    def outputs(self) -> Path:
        return self.base / "outputs"

    def mounts(self) -> list[Mount]:
        mounts = [
            Mount(WORKSPACE, self.workspace, True),
            Mount(UPLOADS, self.uploads, True),
            Mount(OUTPUTS, self.outputs, True),
        ]
        if self.skills is not None:
            mounts.append(Mount(SKILLS, self.skills, False))
        return mounts

    def ensure(self, owner: tuple[int, int] | None = None) -> None:
        """Create the thread's dirs and hand them to the sandbox user so it can write them.

        ``owner`` is the (uid, gid) sandboxed code runs as. As root we chown the thread dir to it
        and keep it private (0700); the root and ``threads/`` get ``shared_dir_mode`` (0711), so
        that user can reach its own dir by name but list nobody else's. Providers check the same
        thing at start-up (search permission, never read, on the root): what this creates is
        what they accept, on every later start too. When the thread dir belongs to someone else
        (another uid setting, another provider, an older layout), its whole tree is handed over
        once. A non-root daemon cannot chown, so the three dirs become world-writable instead
        (their parents stay private to the daemon).
        """
        threads = self.base.parent
        threads.mkdir(parents=True, exist_ok=True)
        as_root = os.geteuid() == 0
        foreign = owner is not None and owner[0] != os.geteuid()
        mode = shared_dir_mode(owner)
        for d in (threads.parent, threads):
            os.chmod(d, mode)
        self.base.mkdir(mode=0o700, exist_ok=True)
        if foreign and as_root:
            assert owner is not None
            st = os.lstat(self.base)
            if (st.st_uid, st.st_gid) != owner:
                _chown_tree(self.base, owner, previous=st.st_uid)
        os.chmod(self.base, 0o700)
        for d in (self.workspace, self.uploads, self.outputs):
            d.mkdir(exist_ok=True)
            if foreign and as_root:
                assert owner is not None
                os.chown(d, *owner, follow_symlinks=False)
            elif foreign:
                os.chmod(d, 0o777)


def shared_dir_mode(owner: tuple[int, int] | None) -> int:
    """Mode of the sandbox root and ``threads/``: searchable (not listable) by a sandbox user of
    another uid when we are root and can give each thread dir to it; else private."""
    foreign = owner is not None and owner[0] != os.geteuid()
    return 0o711 if foreign and os.geteuid() == 0 else 0o700


def _chown_tree(base: Path, owner: tuple[int, int], previous: int) -> None:
    """Give ``base`` and everything below it to ``owner``, never following a symlink.

    The tree is the sandbox's own, so it may hold anything sandboxed code made; a regular file
    with several links is only taken over when it belonged to the previous owner (a link to a
    file of someone else must not change hands). Other filesystems below ``base`` are skipped.
    """
    import stat

    dev = os.lstat(base).st_dev
    os.chown(base, *owner, follow_symlinks=False)
    for _, dirnames, filenames, dfd in os.fwalk(base, follow_symlinks=False):
        for name in dirnames + filenames:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if st.st_dev != dev:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and st.st_uid != previous:
                    continue
                os.chown(name, *owner, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue


@dataclass(frozen=True)
class Resolved:
    """A checked path: its mount, its symlink-free host path and the parts below the mount root."""

    virtual: str
    mount: Mount
    root: Path
    parts: tuple[str, ...]

    @property
    def host(self) -> Path:
        return self.root.joinpath(*self.parts)


class PathMapper:
    """Maps virtual paths to host paths of one thread, refusing every escape."""

    def __init__(self, dirs: ThreadDirs) -> None:
        self.dirs = dirs
        self.mounts = sorted(dirs.mounts(), key=lambda m: len(m.virtual), reverse=True)

    @staticmethod
    def normalize(path: str) -> str:
        """Absolute, normalized virtual path; relative paths are taken from the workspace."""
        if not isinstance(path, str) or not path or "\x00" in path:
            raise PathRefused(f"invalid path {path!r}")
        if not path.startswith("/"):
            path = f"{WORKSPACE}/{path}"
        # normpath keeps a leading "//"; collapse it so "//etc" cannot dodge the prefix checks.
        norm = posixpath.normpath(path)
        return "/" + norm.lstrip("/")

    def synthetic_children(self, path: str) -> tuple[str, ...] | None:
        """Children of a purely virtual parent dir ("/", "/mnt", "/mnt/user-data"), else None."""
        children = _SYNTHETIC_DIRS.get(self.normalize(path))
        if children is None:
            return None
        present = {m.virtual for m in self.mounts}
        return tuple(c for c in children if c in present or c in _SYNTHETIC_DIRS)

    def resolve(self, path: str, *, write: bool = False) -> Resolved:
        """Check ``path`` and return where it lives on the host.

        The host path is resolved (symlinks followed) and must stay inside the mount's own host
        dir; the returned parts are symlink-free, so callers can open them component by
        component with ``O_NOFOLLOW`` and catch a symlink swapped in after this check.
        """
        virtual = self.normalize(path)
        for mount in self.mounts:
            if virtual == mount.virtual or virtual.startswith(mount.virtual + "/"):
                break
        else:
            raise PathRefused(f"{path!r} is outside the sandbox; use paths under {USER_DATA}/ or {SKILLS}/")
        if write and not mount.writable:
            raise PathRefused(f"{mount.virtual} is read-only")
        rel = virtual[len(mount.virtual) :].lstrip("/")
        root = Path(os.path.realpath(mount.host))
        real = Path(os.path.realpath(root / rel)) if rel else root
        if real != root and root not in real.parents:
            raise PathRefused(f"{path!r} resolves outside {mount.virtual} (symlink escape refused)")
        parts = real.relative_to(root).parts
        return Resolved(virtual, mount, root, parts)

    def to_virtual(self, mount: Mount, parts: tuple[str, ...] | list[str]) -> str:
        return posixpath.join(mount.virtual, *parts) if parts else mount.virtual
