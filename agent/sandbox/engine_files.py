"""File tools through a container engine: the shared Docker mode's and Kubernetes' :class:`HostFiles`.

With ``agent.sandbox.docker.shared`` a thread's files live in a named volume on the engine every
daemon talks to, and with the ``kubernetes`` provider in a PersistentVolumeClaim, so no daemon has
a host path to open. Each operation is one exec of the fixed program in engine_script.py inside
the thread's container, as the sandbox user, the path an argument. How the exec travels is the
provider's (:class:`ExecTransport`: Docker's attached exec socket, Kubernetes' exec websocket);
everything else is here, once. The same interface as :class:`HostFiles` (it is one, to the code
that calls it), with the same bounds: what comes back is read with the daemon's own caps, in
bytes and in time, because the program runs beside sandboxed code and its output is as hostile
as the files are.

Virtual paths are checked here first (normalized, inside a mount, writes not on ``/mnt/skills``);
the program then checks links against the mount's own directory inside the container.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import posixpath
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

from wcmatch import glob as wcglob

from . import bounded
from .engine_exec import (
    OP_SECONDS,
    STDIN_BOOT,
    ExecTransport,
    Reply,
    answer_below,
    answer_count,
    answer_read,
    answer_time,
)
from .engine_script import HELPER
from .files import EDIT_LOCKS, Entry, GrepMatch, HostFiles, TextWindow
from .globs import compile_glob
from .paths import USER_DATA, Mount, PathMapper, PathRefused, SandboxError
from .quota import DiskQuota, QuotaExceeded, Usage, usage_problem

_HEADER_CAP = 8 * 1024 * 1024  # one JSON line: an ls of 5000 entries, 1000 grep matches
_MAX_READ_BYTES = 64 * 1024 * 1024  # as files.py: read_bytes without a cap of its own
_CHUNK = 96 * 1024  # base64 characters per argument (Linux: 128 KiB per argument string)
_CHUNKS_PER_EXEC = 12  # ~1.1 MB of argv per exec, well under ARG_MAX (a quarter of the stack)
_STDIN_PER_EXEC = 4 * 1024 * 1024  # raw bytes per exec where data goes in on stdin
_WALK_LIMIT = 50_000
_HELPER_BYTES = HELPER.encode()
log = logging.getLogger(__name__)

_ERRORS = {
    "ENOENT": "no such file or directory",
    "EISDIR": "is a directory",
    "ENOTDIR": "not a directory",
    "ELOOP": "a symlink appeared in the path; refused",
    "notreg": "not a regular file",
    "EEXIST": "already exists",
    "EFBIG": "file too large",
    "ENOSPC": "no space left on the device",
    "EACCES": "permission denied",
    "mountroot": "a mount itself cannot be deleted",
    "toomany": "too many files with that name",
    "deep": "a directory tree about 1000 levels deep is in the way; remove it with execute (rm -rf DIR)",
}


class EngineFiles(HostFiles):
    """One thread's file operations, run in its container (see the module docstring)."""

    def __init__(self, transport: ExecTransport, mapper: PathMapper, quota: DiskQuota) -> None:
        super().__init__(mapper, None)
        self.transport = transport
        self.quota = quota
        self.thread_id = mapper.dirs.thread_id

    # --- running the program ---------------------------------------------------------------

    def _open(self, args: list[str], cap: int, stdin: bytes | None = None) -> Reply:
        # coreutils' timeout kills the program even when nobody reads its output any more (neither
        # engine stops an exec whose client went away). CHITAL_EXEC marks it as none of a
        # command's, so a command's kill sweep (docker_scripts.KILLER) leaves it alone.
        argv = ["timeout", "-s", "KILL", str(int(OP_SECONDS))]
        argv += ["env", "CHITAL_EXEC=files-" + uuid.uuid4().hex, "python3", "-I", "-c"]
        if self.transport.stdin_data:  # the program itself goes on stdin, ahead of the data
            argv += [STDIN_BOOT, str(len(_HELPER_BYTES)), *args]
            stdin = _HELPER_BYTES + (stdin or b"")
        else:
            argv += [HELPER, *args]
        return Reply(self.transport.open_exec(self.thread_id, argv, stdin), cap)

    def _call(
        self, virtual: str, args: list[str], cap: int = _HEADER_CAP, stdin: bytes | None = None
    ) -> dict[str, Any]:
        reply = self._open(args, cap, stdin)
        try:
            with self._net(virtual):
                return self._checked(virtual, reply.header())
        finally:
            reply.close()

    def _call_some(self, virtual: str, args: list[str], *, several: bool) -> dict[str, Any]:
        """``_call`` for one of several mounts searched at once: a mount dir that sandboxed code
        swapped for a link (or removed) is left out of the search, not followed."""
        try:
            return self._call(virtual, args)
        except PathRefused:
            if not several:
                raise
            return {}
        except SandboxError:
            if not several:
                raise
            return {"cut": True}  # the others' results, marked incomplete

    @contextlib.contextmanager
    def _net(self, virtual: str) -> Iterator[None]:
        try:
            yield
        except (TimeoutError, OSError) as e:
            raise SandboxError(f"{virtual}: the file operation failed ({type(e).__name__})") from None

    @staticmethod
    def _checked(virtual: str, head: dict[str, Any]) -> dict[str, Any]:
        err = head.get("error")
        if err is None:
            return head
        if err == "outside":
            raise PathRefused(f"{virtual!r} resolves outside its mount (symlink escape refused)")
        if err == "ELOOP":
            raise PathRefused(f"{virtual}: {_ERRORS['ELOOP']}")
        text = _ERRORS.get(str(err)) or str(head.get("text") or err)[:200]
        raise SandboxError(f"{virtual}: {text}")

    def _where(self, path: str, *, write: bool = False) -> tuple[str, Mount, str]:
        """(normalized virtual path, its mount, the part below the mount) without touching disk."""
        virtual = self.mapper.normalize(path)
        for mount in self.mapper.mounts:
            if virtual == mount.virtual or virtual.startswith(mount.virtual + "/"):
                break
        else:
            raise PathRefused(
                f"{path!r} is outside the sandbox; use paths under {USER_DATA}/ or /mnt/skills/"
            )
        if write and not mount.writable:
            raise PathRefused(f"{mount.virtual} is read-only")
        return virtual, mount, virtual[len(mount.virtual) :].lstrip("/")

    # --- operations --------------------------------------------------------------------------

    def ls(self, path: str) -> list[Entry]:
        synthetic = self.mapper.synthetic_children(path)
        if synthetic is not None:
            return [Entry(c, True, 0, 0.0) for c in synthetic]
        virtual, mount, rel = self._where(path)
        head = self._call(
            virtual, ["ls", mount.virtual, rel, str(bounded.MAX_LS_ENTRIES), str(bounded.MAX_LS_LOOKED)]
        )
        out = []
        with answer_read(virtual):
            for item in head.get("entries") or []:
                name, is_dir, size, mtime = item
                if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
                    continue
                out.append(
                    Entry(posixpath.join(virtual, name), bool(is_dir), answer_count(size), answer_time(mtime))
                )
        out.sort(key=lambda e: e.path)
        if head.get("cut"):
            note = f"[listing cut at {bounded.MAX_LS_ENTRIES} entries; use glob or execute]"
            out.append(Entry(posixpath.join(virtual, note), False, 0, 0.0))
        return out

    def stat(self, path: str) -> Entry | None:
        if self.mapper.synthetic_children(path) is not None:
            return Entry(self.mapper.normalize(path), True, 0, 0.0)
        virtual, mount, rel = self._where(path)
        item = self._call(virtual, ["stat", mount.virtual, rel]).get("entry")
        if item is None:
            return None
        with answer_read(virtual):
            is_dir, size, mtime = item
            return Entry(virtual, bool(is_dir), answer_count(size), answer_time(mtime))

    def _read(self, path: str, cap: int, head: bool = False) -> tuple[str, Reply, int]:
        """The file's size and a reply to read its bytes from: up to ``cap`` + 1 of them, or (not
        ``head``) none when the file is larger than ``cap``."""
        virtual, mount, rel = self._where(path)
        args = ["read", mount.virtual, rel, str(cap)] + (["head"] if head else [])
        reply = self._open(args, _HEADER_CAP + cap + 1)
        try:
            with self._net(virtual), answer_read(virtual):
                size = answer_count(self._checked(virtual, reply.header()).get("size", 0))
        except BaseException:
            reply.close()
            raise
        return virtual, reply, size

    def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        cap = _MAX_READ_BYTES if max_bytes is None else max_bytes
        virtual, reply, size = self._read(path, cap)
        try:
            if size > cap:
                raise SandboxError(f"{virtual}: larger than {cap} bytes")
            with self._net(virtual):
                data = reply.read(cap + 1)
        finally:
            reply.close()
        if len(data) > cap:  # the size can grow while it is read
            raise SandboxError(f"{virtual}: larger than {cap} bytes")
        return data

    def regular_size(self, path: str) -> int:
        _, reply, size = self._read(path, 0)
        reply.close()
        return size

    def read_text(self, path: str, offset: int = 0, limit: int = 2000) -> TextWindow:
        offset, limit = max(int(offset), 0), max(int(limit), 0)
        virtual, reply, _size = self._read(path, bounded.MAX_SCAN_BYTES, head=True)
        try:
            with self._net(virtual):
                head = reply.read(8192)
                if b"\x00" in head:
                    raise SandboxError(f"{virtual}: binary file, not shown as text")
                reply.buf[:0] = head
                try:
                    found = bounded.read_lines(reply, offset, limit, virtual=virtual)  # type: ignore[arg-type]
                except bounded.ReadRefused as e:
                    raise SandboxError(str(e)) from None
        finally:
            reply.close()
        total = found.total
        if total and offset >= total:
            raise SandboxError(f"{virtual}: line offset {offset} is past the end ({total} lines)")
        if not found.lines:
            return TextWindow("", 0, 0, total or 0)
        return TextWindow("".join(found.lines), offset + 1, offset + len(found.lines), total)

    def _chunks(self, data: bytes) -> list[tuple[list[str], bytes | None]]:
        """``data`` cut into one (arguments, stdin) pair per exec."""
        if self.transport.stdin_data:
            pieces = [data[i : i + _STDIN_PER_EXEC] for i in range(0, len(data), _STDIN_PER_EXEC)] or [b""]
            return [([f"@{len(p)}"], p) for p in pieces]
        text = base64.b64encode(data).decode()
        parts = [text[i : i + _CHUNK] for i in range(0, len(text), _CHUNK)] or [""]
        return [(parts[i : i + _CHUNKS_PER_EXEC], None) for i in range(0, len(parts), _CHUNKS_PER_EXEC)]

    def write(self, path: str, content: str | bytes) -> str:
        data = content.encode() if isinstance(content, str) else content
        self.room(len(data))
        return self._put(path, data)

    def _put(self, path: str, data: bytes) -> str:
        """Write ``data`` to ``path`` (made or truncated), in as many execs as its size needs."""
        virtual, mount, rel = self._where(path, write=True)
        for i, (group, stdin) in enumerate(self._chunks(data)):
            mode = "append" if i else "truncate"
            self._call(virtual, ["write", mount.virtual, rel, mode, *group], stdin=stdin)
        return virtual

    def create_unique(self, folder: str, name: str, data: bytes) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise PathRefused(f"invalid file name {name!r}")
        virtual, mount, rel = self._where(folder, write=True)
        groups = self._chunks(data)
        first, stdin = groups[0]
        made = self._call(virtual, ["create", mount.virtual, rel, name, *first], stdin=stdin).get("name")
        if not isinstance(made, str) or "/" in made or made in ("", ".", ".."):
            raise SandboxError(f"{virtual}: the file could not be created")
        target = posixpath.join(virtual, made)
        try:
            for group, stdin in groups[1:]:
                args = ["write", mount.virtual, posixpath.join(rel, made), "append", *group]
                self._call(target, args, stdin=stdin)
        except BaseException:
            with contextlib.suppress(SandboxError):
                self.delete(target)
            raise
        return target

    def edit(self, path: str, old: str, new: str, replace_all: bool = False) -> int:
        if not old:
            raise SandboxError("old_string must not be empty")
        if old == new:
            raise SandboxError("old_string and new_string are identical")
        virtual, _, _ = self._where(path, write=True)
        # Edits of one file through this daemon are serialized, as on the host (files.py); a
        # conversation's turns never run on two daemons at once.
        lock = EDIT_LOCKS[zlib.crc32(f"{self.thread_id}\0{virtual}".encode()) % len(EDIT_LOCKS)]
        with lock:
            try:
                raw = self.read_bytes(virtual, bounded.MAX_EDIT_BYTES)
            except SandboxError as e:
                if "larger than" not in str(e):
                    raise
                raise SandboxError(
                    f"{virtual}: larger than {bounded.MAX_EDIT_BYTES // (1024 * 1024)} MB, too large "
                    "for edit_file; use execute (sed -i, a script) instead"
                ) from None
            try:
                content = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise SandboxError(f"{virtual}: not a UTF-8 text file") from None
            count = content.count(old)
            if count == 0:
                raise SandboxError(f"{virtual}: old_string not found")
            if count > 1 and not replace_all:
                raise SandboxError(
                    f"{virtual}: old_string occurs {count} times; add context to make it unique "
                    "or set replace_all"
                )
            updated = content.replace(old, new) if replace_all else content.replace(old, new, 1)
            self.room(len(updated.encode()) - len(raw))
            self._put(virtual, updated.encode())  # only the growth counts against the quota
            return count if replace_all else 1

    def delete(self, path: str) -> str:
        virtual, mount, rel = self._where(path, write=True)
        if not rel:
            raise PathRefused(f"{mount.virtual} itself cannot be deleted")
        self._call(virtual, ["delete", mount.virtual, rel])
        return virtual

    def _search_roots(self, path: str) -> list[tuple[Mount, str, str]]:
        """(mount, part below it, prefix of results) to search, as files.py's ``_roots``."""
        base = self.mapper.normalize(path)
        if self.mapper.synthetic_children(base) is None:
            _, mount, rel = self._where(base)
            return [(mount, rel, "")]
        return [
            (m, "", m.virtual[len(base) :].strip("/"))
            for m in self.mapper.mounts
            if m.virtual.startswith(base.rstrip("/") + "/")
        ]

    @staticmethod
    def _found(mount: Mount, rel: str, head: dict[str, Any], found: Any) -> str:
        """The virtual path of a file the walk reported (relative to the searched dir)."""
        if head.get("single"):
            return posixpath.join(mount.virtual, rel)
        return (
            posixpath.join(mount.virtual, rel, str(found))
            if rel
            else posixpath.join(mount.virtual, str(found))
        )

    def glob(
        self, pattern: str, path: str = "/mnt/user-data", max_results: int = 1000
    ) -> tuple[list[str], bool]:
        match = compile_glob(pattern)
        out: list[str] = []
        cut = False
        roots = self._search_roots(path)
        for mount, rel, prefix in roots:
            args = ["walk", mount.virtual, rel, str(_WALK_LIMIT), str(bounded.WALK_SECONDS)]
            head = self._call_some(mount.virtual, args, several=len(roots) > 1)
            cut = cut or bool(head.get("cut"))
            with answer_read(mount.virtual):
                files = list(head.get("files") or [])
            for found in files:
                if not answer_below(found):
                    continue
                if match("/".join(p for p in (prefix, found) if p)):
                    if len(out) >= max_results:
                        return out, True
                    out.append(self._found(mount, rel, head, found))
        return out, cut

    def grep(
        self,
        pattern: str,
        path: str = "/mnt/user-data",
        glob: str | None = None,
        max_count: int | None = 1000,
        regex: bool = False,
    ) -> tuple[list[GrepMatch], bool]:
        import re

        if not pattern:
            raise SandboxError("pattern must not be empty")
        try:
            re.compile(pattern if regex else re.escape(pattern))
        except re.error as e:
            raise SandboxError(f"invalid regex: {e}") from None
        rx = pattern if regex else re.escape(pattern)
        include, base = ("", "0") if not glob else (_glob_regex(glob), "0" if "/" in glob else "1")
        count = 1_000_000 if max_count is None else max_count
        out: list[GrepMatch] = []
        cut = False
        roots = self._search_roots(path)
        for mount, rel, prefix in roots:
            limits = [_WALK_LIMIT, bounded.WALK_SECONDS, bounded.MAX_GREP_BYTES, bounded.MAX_GREP_FILE]
            limits += [bounded.MAX_GREP_LINE, count - len(out)]
            args = ["grep", mount.virtual, rel, prefix, rx, include, base, *map(str, limits)]
            head = self._call_some(mount.virtual, args, several=len(roots) > 1)
            cut = cut or bool(head.get("cut"))
            with answer_read(mount.virtual):
                for item in head.get("matches") or []:
                    found, line, text = item
                    if not answer_below(found):
                        continue
                    where = self._found(mount, rel, head, found)
                    out.append(GrepMatch(where, answer_count(line), str(text)[:1000]))
            if cut:
                break
        return out, cut

    # --- the disk quota, measured in the volume -----------------------------------------------

    def usage(self) -> Usage:
        roots = [m.virtual for m in self.mapper.mounts if m.writable]
        head = self._call(USER_DATA, ["usage", str(self.quota.max_files), *roots])
        with answer_read(USER_DATA):
            used, files = answer_count(head.get("blocks", 0)), answer_count(head.get("files", 0))
        if head.get("cut"):
            problem = (
                f"file quota exceeded: more than {self.quota.max_files} files and directories in "
                f"{USER_DATA}; delete some (caches, build trees, node_modules) and try again"
            )
            return Usage(used, files, problem)
        if head.get("unreadable"):
            problem = (
                f"a directory in {USER_DATA} is not readable, so its size cannot be checked against "
                f"the disk quota: make it readable (chmod -R u+rwX {USER_DATA}) or delete it"
            )
            return Usage(used, files, problem)
        return Usage(used, files)

    def room(self, incoming: int) -> None:
        """Raise :class:`QuotaExceeded` unless the thread can take ``incoming`` more bytes (the
        engine's free space is the engine host's business: no floor is measured from here)."""
        if incoming < 0:
            return
        problem = usage_problem(self.usage(), self.quota, incoming)
        if problem:
            raise QuotaExceeded(problem)


def _glob_regex(pattern: str) -> str:
    if ".." in pattern.split("/"):
        raise PathRefused("'..' is not allowed in glob patterns")
    inc, _ = wcglob.translate(pattern.lstrip("/"), flags=wcglob.BRACE | wcglob.GLOBSTAR)
    return "|".join(f"(?:{r})" for r in inc)


WATCH_EVERY = 2.0  # seconds between disk measurements while a command runs


class EngineRoom:
    """The quota around a command, for sandboxes whose files are behind the engine (the shared
    Docker mode's and Kubernetes'): each measurement is an exec (~0.1 s), so the check before a
    command is skipped while :attr:`room_known` holds (within a turn only this daemon runs the
    thread's commands, and file writes and uploads check the quota themselves; ``acquire``, a new
    turn, clears it); after a command, and every :data:`WATCH_EVERY` seconds while one runs, the
    workspace is measured again."""

    files: EngineFiles
    id: str
    room_known: bool = False

    async def _before_command(self) -> None:
        if self.room_known:
            return
        await asyncio.to_thread(self.files.room, 0)
        self.room_known = True

    async def _after_command(self) -> str | None:
        self.room_known = False
        try:
            await asyncio.to_thread(self.files.room, 0)
        except QuotaExceeded as e:
            return f"[{e}; further commands are refused until then]"
        except Exception:  # a failed measurement must not fail the command that ran
            log.exception("sandbox quota check after a command in %s failed", self.id)
            return None
        self.room_known = True
        return None

    async def _watch_disk(self) -> str:
        while True:
            await asyncio.sleep(WATCH_EVERY)
            try:
                await asyncio.to_thread(self.files.room, 0)
            except QuotaExceeded as e:
                return str(e)
            except Exception:  # try again next tick
                log.exception("sandbox quota watchdog for %s failed", self.id)
