"""The agent's file tools (ls, read, write, edit, glob, grep, delete) acting on one thread's host dirs.

Why not plain ``open(host_path)``: sandboxed code shares these directories and may plant or swap
symlinks at any moment. Every operation first checks the path with :class:`PathMapper`, then opens
the already-resolved, symlink-free path one component at a time relative to a directory fd with
``O_NOFOLLOW`` (and walks trees with ``os.fwalk``), so a symlink swapped in after the check makes the
call fail instead of reaching outside the thread's dirs.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import posixpath
import re
import shutil
import stat
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from . import bounded
from .creds import can_switch, fs_identity
from .globs import compile_glob
from .nofollow import DIR_FLAGS, FILE_FLAGS, exists_at, is_link_at, numbered_names
from .paths import Mount, PathMapper, PathRefused, Resolved, SandboxError

_F = TypeVar("_F", bound=Callable[..., Any])


def _as_owner(method: _F) -> _F:
    """Run a :class:`HostFiles` operation with the sandbox user's filesystem rights (creds.py)."""

    @functools.wraps(method)
    def wrapper(self: HostFiles, *args: Any, **kwargs: Any) -> Any:
        with fs_identity(self.owner if self.switch else None):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


_MAX_READ_BYTES = 64 * 1024 * 1024  # read_bytes without a cap of its own (downloads)
_WALK_LIMIT = 50_000  # files visited per glob/grep call, so a huge tree cannot hang a tool call
EDIT_LOCKS = [threading.Lock() for _ in range(64)]  # striped: bounded memory, per-file exclusion


@dataclass(frozen=True)
class Entry:
    path: str
    is_dir: bool
    size: int
    modified: float


@dataclass(frozen=True)
class TextWindow:
    """A window of lines; ``start_line``/``end_line`` are 1-based and inclusive (0/0 when empty)."""

    text: str
    start_line: int
    end_line: int
    total_lines: int | None
    """None when the read stopped before the end of the file (bounded.py's budgets)."""


@dataclass(frozen=True)
class GrepMatch:
    path: str
    line: int
    text: str


class HostFiles:
    """File operations of one thread. Synchronous (callers run them in a worker thread)."""

    def __init__(self, mapper: PathMapper, owner: tuple[int, int] | None = None) -> None:
        self.mapper = mapper
        self.owner = owner
        self.switch = owner is not None and owner[0] not in (0, os.geteuid()) and can_switch()
        """Root working for an unprivileged sandbox user: act with that user's rights (creds.py),
        so new files are its own and nothing root alone may read is reachable."""

    # --- low-level, symlink-safe opening ---------------------------------------------------------

    def _give(self, name: str, dir_fd: int, is_dir: bool) -> None:
        """Make a file we created usable by the sandbox user (see ThreadDirs.ensure)."""
        if self.owner is None or self.owner[0] == os.geteuid() or self.switch:
            return  # ours already, or created under the owner's fs identity
        if os.geteuid() == 0:
            os.chown(name, *self.owner, dir_fd=dir_fd, follow_symlinks=False)
        else:
            os.chmod(name, 0o777 if is_dir else 0o666, dir_fd=dir_fd, follow_symlinks=False)

    def _open_dir(self, r: Resolved, parts: tuple[str, ...], *, create: bool = False) -> int:
        fd = os.open(r.root, DIR_FLAGS)
        try:
            for part in parts:
                try:
                    nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    self._give(part, fd, True)
                    nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR) and is_link_at(part, fd):
                        raise PathRefused(f"{r.virtual}: a symlink appeared in the path; refused") from e
                    raise
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_file(self, r: Resolved, flags: int, *, create_parents: bool = False) -> int:
        if not r.parts:
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        dfd = self._open_dir(r, r.parts[:-1], create=create_parents)
        try:
            name = r.parts[-1]
            existed = flags & os.O_CREAT and exists_at(name, dfd)
            try:
                fd = os.open(name, flags | FILE_FLAGS, 0o644, dir_fd=dfd)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise PathRefused(f"{r.virtual}: a symlink appeared in the path; refused") from e
                raise
            if flags & os.O_CREAT and not existed:
                self._give(name, dfd, False)
            return fd
        finally:
            os.close(dfd)

    @contextlib.contextmanager
    def _errors(self, virtual: str) -> Iterator[None]:
        """Turn OS errors into messages that name the virtual path, never the host path."""
        try:
            yield
        except SandboxError:
            raise
        except FileNotFoundError:
            raise SandboxError(f"{virtual}: no such file or directory") from None
        except IsADirectoryError:
            raise SandboxError(f"{virtual}: is a directory") from None
        except NotADirectoryError:
            raise SandboxError(f"{virtual}: not a directory") from None
        except UnicodeDecodeError:
            raise SandboxError(f"{virtual}: not a UTF-8 text file") from None
        except OSError as e:
            raise SandboxError(f"{virtual}: {e.strerror or e}") from None

    # --- operations ---------------------------------------------------------------------------

    def room(self, incoming: int) -> None:
        """Raise ``QuotaExceeded`` unless the thread can take ``incoming`` more bytes."""
        from .quota import check_room

        check_room(self.mapper.dirs, incoming)

    @_as_owner
    def ls(self, path: str) -> list[Entry]:
        synthetic = self.mapper.synthetic_children(path)
        if synthetic is not None:
            return [Entry(c, True, 0, 0.0) for c in synthetic]
        r = self.mapper.resolve(path)
        out: list[Entry] = []
        with self._errors(r.virtual):
            fd = self._open_dir(r, r.parts)
            looked = 0
            try:
                with os.scandir(fd) as it:
                    for de in it:
                        looked += 1  # what is left out (a dangling link) counts too
                        if len(out) >= bounded.MAX_LS_ENTRIES or looked > bounded.MAX_LS_LOOKED:
                            note = f"[listing cut at {bounded.MAX_LS_ENTRIES} entries; use glob or execute]"
                            where = self.mapper.to_virtual(r.mount, (*r.parts, note))
                            out.append(Entry(where, False, 0, 0.0))
                            break
                        virtual = self.mapper.to_virtual(r.mount, (*r.parts, de.name))
                        try:
                            st = de.stat(follow_symlinks=False)
                            if stat.S_ISLNK(st.st_mode):
                                # Show a link only when it stays inside the sandbox.
                                st = os.stat(self.mapper.resolve(virtual).host)
                        except (OSError, PathRefused):
                            continue
                        is_dir = stat.S_ISDIR(st.st_mode)
                        out.append(Entry(virtual, is_dir, 0 if is_dir else st.st_size, st.st_mtime))
            finally:
                os.close(fd)
        return sorted(out, key=lambda e: e.path)

    @_as_owner
    def stat(self, path: str) -> Entry | None:
        """The entry at ``path``, or None when nothing is there."""
        if self.mapper.synthetic_children(path) is not None:
            return Entry(self.mapper.normalize(path), True, 0, 0.0)
        r = self.mapper.resolve(path)
        with self._errors(r.virtual):
            try:
                st = os.stat(r.host, follow_symlinks=False)
            except FileNotFoundError:
                return None
        is_dir = stat.S_ISDIR(st.st_mode)
        return Entry(r.virtual, is_dir, 0 if is_dir else st.st_size, st.st_mtime)

    @_as_owner
    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        r = self.mapper.resolve(path)
        with self._errors(r.virtual):
            fd = self._open_file(r, os.O_RDONLY)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise SandboxError(f"{r.virtual}: not a regular file")
                cap = _MAX_READ_BYTES if max_bytes is None else max_bytes
                data = f.read(cap + 1) if st.st_size <= cap else b""
        if st.st_size > cap or len(data) > cap:  # the size can grow while it is read
            raise SandboxError(f"{r.virtual}: larger than {cap} bytes")
        return data

    @_as_owner
    def regular_size(self, path: str) -> int:
        """Size of the regular file at ``path``, checked on the opened descriptor (a link, FIFO,
        device or directory is refused, whatever the path looked like a moment ago)."""
        r = self.mapper.resolve(path)
        with self._errors(r.virtual):
            fd = self._open_file(r, os.O_RDONLY)
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if not stat.S_ISREG(st.st_mode):
                raise SandboxError(f"{r.virtual}: not a regular file")
            return st.st_size

    @_as_owner
    def create_unique(self, folder: str, name: str, data: bytes) -> str:
        """Write ``data`` as a NEW file in ``folder`` named ``name`` (or ``stem-2.ext``...) and
        return its virtual path.

        ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to the folder's fd: an existing entry of that
        name (a file, or a link planted by sandboxed code, dangling or not) is never opened or
        followed; the next free name is taken instead. A failed write leaves no partial file.
        """
        if not name or "/" in name or name in (".", ".."):
            raise PathRefused(f"invalid file name {name!r}")
        r = self.mapper.resolve(folder, write=True)
        with self._errors(r.virtual):
            dfd = self._open_dir(r, r.parts, create=True)
            try:
                for candidate in numbered_names(name):
                    try:
                        fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o644,
                                     dir_fd=dfd)  # fmt: skip
                    except FileExistsError:
                        continue
                    try:
                        with os.fdopen(fd, "wb") as f:
                            f.write(data)
                    except BaseException:
                        with contextlib.suppress(OSError):
                            os.unlink(candidate, dir_fd=dfd)
                        raise
                    self._give(candidate, dfd, False)
                    return self.mapper.to_virtual(r.mount, (*r.parts, candidate))
            finally:
                os.close(dfd)
        raise SandboxError(f"{r.virtual}: too many files named like {name}")

    @_as_owner
    def read_text(self, path: str, offset: int = 0, limit: int = 2000) -> TextWindow:
        """Lines ``offset`` (0-based) .. ``offset+limit`` of a UTF-8 file, keeping line endings."""
        offset, limit = max(int(offset), 0), max(int(limit), 0)
        r = self.mapper.resolve(path)
        with self._errors(r.virtual):
            fd = self._open_file(r, os.O_RDONLY)
            with os.fdopen(fd, "rb") as raw:
                if not stat.S_ISREG(os.fstat(raw.fileno()).st_mode):
                    raise SandboxError(f"{r.virtual}: not a regular file")
                head = raw.peek(8192)[:8192] if hasattr(raw, "peek") else b""
                if b"\x00" in head:
                    raise SandboxError(f"{r.virtual}: binary file, not shown as text")
                try:
                    found = bounded.read_lines(raw, offset, limit, virtual=r.virtual)
                except bounded.ReadRefused as e:
                    raise SandboxError(str(e)) from None
        total = found.total
        if total and offset >= total:
            raise SandboxError(f"{r.virtual}: line offset {offset} is past the end ({total} lines)")
        if not found.lines:
            return TextWindow("", 0, 0, total or 0)
        return TextWindow("".join(found.lines), offset + 1, offset + len(found.lines), total)

    @_as_owner
    def write(self, path: str, content: str | bytes) -> str:
        r = self.mapper.resolve(path, write=True)
        data = content.encode() if isinstance(content, str) else content
        from .quota import check_room  # the thread's disk quota and the host's free-space floor

        check_room(self.mapper.dirs, len(data))
        with self._errors(r.virtual):
            fd = self._open_file(r, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, create_parents=True)
            with os.fdopen(fd, "wb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise SandboxError(f"{r.virtual}: not a regular file")
                f.write(data)
        return r.virtual

    @_as_owner
    def edit(self, path: str, old: str, new: str, replace_all: bool = False) -> int:
        """Replace the exact string ``old``; it must occur exactly once unless ``replace_all``."""
        if not old:
            raise SandboxError("old_string must not be empty")
        if old == new:
            raise SandboxError("old_string and new_string are identical")
        r = self.mapper.resolve(path, write=True)
        lock = EDIT_LOCKS[zlib.crc32(str(r.host).encode()) % len(EDIT_LOCKS)]
        with lock, self._errors(r.virtual):
            fd = self._open_file(r, os.O_RDWR)
            with os.fdopen(fd, "r+b") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise SandboxError(f"{r.virtual}: not a regular file")
                raw = f.read(bounded.MAX_EDIT_BYTES + 1)
                if st.st_size > bounded.MAX_EDIT_BYTES or len(raw) > bounded.MAX_EDIT_BYTES:
                    raise SandboxError(
                        f"{r.virtual}: larger than {bounded.MAX_EDIT_BYTES // (1024 * 1024)} MB, too large "
                        "for edit_file; use execute (sed -i, a script) instead"
                    )
                content = raw.decode("utf-8")
                count = content.count(old)
                if count == 0:
                    raise SandboxError(f"{r.virtual}: old_string not found")
                if count > 1 and not replace_all:
                    raise SandboxError(
                        f"{r.virtual}: old_string occurs {count} times; add context to make it unique "
                        "or set replace_all"
                    )
                updated = content.replace(old, new) if replace_all else content.replace(old, new, 1)
                from .quota import check_room  # only growth is checked: shrinking always works

                check_room(self.mapper.dirs, len(updated.encode()) - len(content.encode()))
                f.seek(0)
                f.write(updated.encode())
                f.truncate()
        return count if replace_all else 1

    @_as_owner
    def delete(self, path: str) -> str:
        """Delete the file, directory or link ``path`` names. Its last component is never followed:
        deleting a link removes the link (resolving the whole path removed the link's target, and
        refused a link pointing out of the mount)."""
        virtual = self.mapper.normalize(path)
        for m in self.mapper.mounts:
            if virtual == m.virtual or virtual.startswith(m.virtual + "/"):
                if not m.writable:
                    raise PathRefused(f"{m.virtual} is read-only")
                if virtual == m.virtual:
                    raise PathRefused(f"{virtual} itself cannot be deleted")
                break
        parent = self.mapper.resolve(posixpath.dirname(virtual), write=True)
        r = Resolved(virtual, parent.mount, parent.root, (*parent.parts, posixpath.basename(virtual)))
        with self._errors(r.virtual):
            dfd = self._open_dir(r, r.parts[:-1])
            try:
                name = r.parts[-1]
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, dir_fd=dfd)  # fd-based, does not follow symlinks
                else:
                    os.unlink(name, dir_fd=dfd)
            finally:
                os.close(dfd)
        return r.virtual

    # --- tree walks ----------------------------------------------------------------------------

    def _roots(self, path: str) -> list[tuple[Resolved, str]]:
        """(resolved dir, prefix of relative paths) to search: a mount subtree, or every mount
        below a synthetic dir such as ``/mnt/user-data``."""
        base = self.mapper.normalize(path)
        if self.mapper.synthetic_children(base) is None:
            return [(self.mapper.resolve(base), "")]
        roots = []
        for m in self.mapper.mounts:
            if m.virtual.startswith(base.rstrip("/") + "/"):
                roots.append((self.mapper.resolve(m.virtual), m.virtual[len(base) :].strip("/")))
        return roots

    def _walk(
        self, path: str, budget: bounded.Budget
    ) -> Iterator[tuple[Mount, tuple[str, ...], str, str, int]]:
        """Yield (mount, parts, rel path, name, dir fd) for every regular file below ``path``,
        until ``budget`` runs out (then ``budget.cut`` is set)."""
        seen = 0
        for r, prefix in self._roots(path):
            try:
                top = self._open_dir(r, r.parts)
            except NotADirectoryError:
                # A single file: yield it on its own.
                parent = self._open_dir(r, r.parts[:-1])
                try:
                    yield r.mount, r.parts, r.parts[-1], r.parts[-1], parent
                finally:
                    os.close(parent)
                continue
            except FileNotFoundError:
                continue
            try:
                for dirpath, dirs, files, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                    dirs.sort()  # deterministic order for the model and for tests
                    sub = () if dirpath == "." else tuple(dirpath[2:].split("/"))
                    for name in sorted(files):
                        try:
                            if not stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                                continue  # symlinks and specials are not followed
                        except OSError:
                            continue
                        seen += 1
                        if seen > _WALK_LIMIT or budget.spent():
                            budget.cut = True
                            return
                        rel = "/".join(p for p in (prefix, *sub, name) if p)
                        yield r.mount, (*r.parts, *sub, name), rel, name, dfd
            finally:
                os.close(top)

    @_as_owner
    def glob(
        self, pattern: str, path: str = "/mnt/user-data", max_results: int = 1000
    ) -> tuple[list[str], bool]:
        """Virtual paths of files matching ``pattern`` below ``path``; True when truncated."""
        match = compile_glob(pattern)
        out: list[str] = []
        budget = bounded.Budget()
        with self._errors(self.mapper.normalize(path)):
            for mount, parts, rel, _name, _fd in self._walk(path, budget):
                if match(rel):
                    if len(out) >= max_results:
                        return out, True
                    out.append(self.mapper.to_virtual(mount, parts))
        return out, budget.cut

    @_as_owner
    def grep(
        self,
        pattern: str,
        path: str = "/mnt/user-data",
        glob: str | None = None,
        max_count: int | None = 1000,
        regex: bool = False,
    ) -> tuple[list[GrepMatch], bool]:
        """Lines containing ``pattern`` (literal unless ``regex``); True when cut at ``max_count``."""
        if not pattern:
            raise SandboxError("pattern must not be empty")
        try:
            rx = re.compile(pattern if regex else re.escape(pattern))
        except re.error as e:
            raise SandboxError(f"invalid regex: {e}") from None
        include = compile_glob(glob) if glob else None
        out: list[GrepMatch] = []
        budget = bounded.Budget()
        with self._errors(self.mapper.normalize(path)):
            for mount, parts, rel, name, dfd in self._walk(path, budget):
                if include is not None and not include(rel):
                    continue
                for lineno, line in bounded.grep_file(name, dfd, rx, budget, FILE_FLAGS):
                    if max_count is not None and len(out) >= max_count:
                        return out, True
                    out.append(GrepMatch(self.mapper.to_virtual(mount, parts), lineno, line))
                if budget.cut:
                    break
        return out, budget.cut
