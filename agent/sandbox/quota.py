"""Per-thread disk quota, and a free-space floor that keeps room for the daemon's databases.

Why measured and not enforced by the kernel: no special filesystem is assumed (no XFS project
quotas, no loop device per thread), and sandboxed code writes straight into host directories. Left
alone, one thread filled the data disk and SQLite answered "database or disk is full" to everyone.
So the quota is a measurement of the thread's three dirs (workspace, uploads, outputs), applied at
every point where data gets in:

* before a command starts, before a file tool writes and before an upload is saved
  (:func:`check_room`): refused when the thread is at its quota, when the incoming bytes would
  cross it, or when the filesystem holding the sandbox root would keep less than ``min_free_mb``;
* while a command runs (:func:`watch`): free space is re-read every 0.1 s (one ``statvfs``) and
  usage re-measured every 0.5 s, or less often when a walk is slow (never more than a third of the
  time spent walking); the provider kills the command when a limit is crossed and says why;
* after a command (:func:`after_command`): the result says so when it left the thread full;
* RLIMIT_FSIZE is clamped to the quota (providers), so no single file can exceed it.

Usage is allocated blocks (``st_blocks``), so sparse files count what they really take; hard links
count once. The walk never follows symlinks and opens every directory relative to its parent with
``O_NOFOLLOW``; it is bounded by ``disk_files`` entries and ``MAX_DEPTH`` levels, and a tree it
cannot fully measure (too many files, too deep, unreadable) counts as over quota with a message
saying what to remove, so hiding data from the walk does not pay.

Known gaps (docs/sandbox.md): between two watchdog ticks a command can write at disk speed (the
free-space floor is checked 5x as often, and RLIMIT_FSIZE bounds each file); space held by files
deleted while still open is invisible to the walk (it is freed when the command's processes die,
which every provider guarantees at the end of a command, and the floor still applies); the measure
and the write are not atomic, so concurrent writers of one thread can each pass the check.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .config import SandboxLimits
from .paths import OUTPUTS, UPLOADS, USER_DATA, WORKSPACE, SandboxError, ThreadDirs

log = logging.getLogger(__name__)

MB = 1024 * 1024
DEFAULT_MIN_FREE_MB = 512
MAX_DEPTH = 128
"""Directory levels the walk descends; a deeper tree is refused rather than left unmeasured."""
FLOOR_EVERY = 0.1
WALK_EVERY = 0.5
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Walks run here, not in the default executor: Docker output pumps hold its threads for whole
# commands, and a watchdog must not queue behind them. Its threads start on a submit from the event
# loop's thread, so they never inherit a file tool's switched filesystem identity (creds.py).
_walkers: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _walkers
    if _walkers is None:
        _walkers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="sandbox-quota")
    return _walkers


def release_walkers() -> None:
    """Let the walker threads end once their queued walks are done (the runtime's close calls it).
    An idle pool's threads are not daemon threads: left alone they held every stop for the 3 s
    the CLI grants lingering threads. The next walk, if any, starts a new pool."""
    global _walkers
    pool, _walkers = _walkers, None
    if pool is not None:
        pool.shutdown(wait=False)


class QuotaExceeded(SandboxError):
    """A thread is at its disk quota, or the host disk at its free-space floor. The text is meant
    for the model and the user: it says how much is used and what to delete."""


@dataclass(frozen=True)
class DiskQuota:
    limit_bytes: int
    min_free_bytes: int
    max_files: int = 100_000

    @classmethod
    def from_limits(cls, limits: SandboxLimits, min_free_mb: int = DEFAULT_MIN_FREE_MB) -> DiskQuota:
        return cls(limits.disk_mb * MB, min_free_mb * MB, limits.disk_files)


@dataclass(frozen=True)
class Usage:
    bytes: int
    files: int
    problem: str | None = None
    """Why the tree could not be fully measured (then it counts as over quota)."""


_registry: dict[Path, DiskQuota] = {}


def register(root: Path | str, quota: DiskQuota) -> None:
    """Record the quota of a sandbox root, so ``check_room`` callers need only a thread's dirs."""
    _registry[Path(root).resolve()] = quota


def quota_for(root: Path | str) -> DiskQuota:
    """The quota registered for ``root`` (by its provider), else the defaults."""
    return _registry.get(Path(root).resolve()) or DiskQuota.from_limits(SandboxLimits())


def _mb(n: float) -> str:
    """Megabytes for people: "5", "4.2", "1024"."""
    value = round(n / MB, 1)
    return f"{value:.0f}" if value >= 10 or value.is_integer() else f"{value:.1f}"


_DELETE_HINT = (
    f"delete files in {WORKSPACE}, {OUTPUTS} or {UPLOADS} (the delete tool works even while "
    "commands are refused) and try again"
)


def _thread_dirs(target: ThreadDirs | Path | str) -> ThreadDirs:
    if isinstance(target, ThreadDirs):
        return target
    path = Path(target).resolve()
    for p in (path, *path.parents):
        if p.parent.name == "threads":
            return ThreadDirs("", p, None)
    raise ValueError(f"{path} is not inside a sandbox thread dir (<root>/threads/<id>/...)")


# --- measuring --------------------------------------------------------------------------------


def free_bytes(path: Path | str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding ``path`` (or its
    nearest existing parent: an upload may be checked before its thread dir exists)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def measure(dirs: ThreadDirs, max_files: int = 100_000) -> Usage:
    """Allocated bytes and entries under the thread's three dirs; see the module doc."""
    total = files = 0
    seen: set[tuple[int, int]] = set()
    for virtual, host in ((WORKSPACE, dirs.workspace), (UPLOADS, dirs.uploads), (OUTPUTS, dirs.outputs)):
        stack: list[tuple[str, ...]] = [()]
        while stack:
            parts = stack.pop()
            try:
                fd = _open_chain(host, parts)
            except PermissionError:
                where = "/".join((virtual, *parts))
                problem = (
                    f"{where} is not readable, so its size cannot be checked against the disk quota: "
                    f"make it readable (chmod -R u+rwX {where}) or delete it"
                )
                return Usage(total, files, problem)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    continue  # removed or swapped for a link meanwhile: nothing of ours to count
                raise
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        files += 1
                        if files > max_files:
                            problem = (
                                f"file quota exceeded: more than {max_files} files and directories in "
                                f"{USER_DATA}; delete some (caches, build trees, node_modules) and try again"
                            )
                            return Usage(total, files, problem)
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if stat.S_ISDIR(st.st_mode):
                            if len(parts) >= MAX_DEPTH:
                                problem = (
                                    f"directories nested more than {MAX_DEPTH} levels deep in {virtual} "
                                    "cannot be checked against the disk quota; flatten or delete them"
                                )
                                return Usage(total, files, problem)
                            stack.append((*parts, entry.name))
                        elif st.st_nlink > 1:
                            key = (st.st_dev, st.st_ino)
                            if key in seen:
                                continue
                            seen.add(key)
                        total += st.st_blocks * 512
            finally:
                os.close(fd)
    return Usage(total, files)


def _open_chain(top: Path, parts: tuple[str, ...]) -> int:
    """A directory fd for ``top/parts...``, no component a symlink; two fds open at most, so the
    depth of a tree costs time, not file descriptors."""
    fd = os.open(top, _DIR_FLAGS)
    try:
        for part in parts:
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- verdicts ---------------------------------------------------------------------------------


def floor_problem(root: Path, quota: DiskQuota, incoming: int = 0) -> str | None:
    """A message when the disk holding ``root`` has (or would keep) less than the floor free."""
    if quota.min_free_bytes <= 0:
        return None
    free = free_bytes(root)
    if free - incoming >= quota.min_free_bytes:
        return None
    return (
        f"the host disk is nearly full: {_mb(free)} MB free, and {_mb(quota.min_free_bytes)} MB are "
        f"kept free for the service; {_DELETE_HINT}, or ask the operator to free disk space"
    )


def usage_problem(usage: Usage, quota: DiskQuota, incoming: int = 0) -> str | None:
    """A message when ``usage`` (plus ``incoming`` bytes) is at or over the thread's quota."""
    if usage.problem:
        return usage.problem
    if incoming > 0 and usage.bytes + incoming > quota.limit_bytes:
        return (
            f"disk quota exceeded: {_mb(usage.bytes)} MB used of {_mb(quota.limit_bytes)} MB, and "
            f"{_mb(incoming)} MB more do not fit; {_DELETE_HINT}"
        )
    if incoming <= 0 and usage.bytes >= quota.limit_bytes:
        return (
            f"disk quota exceeded: {_mb(usage.bytes)} MB used of {_mb(quota.limit_bytes)} MB; {_DELETE_HINT}"
        )
    return None


def check_room(
    target: ThreadDirs | Path | str, incoming_bytes: int = 0, quota: DiskQuota | None = None
) -> None:
    """Raise :class:`QuotaExceeded` unless the thread can take ``incoming_bytes`` more.

    ``target`` is the thread's :class:`ThreadDirs` or any path inside its dir (an uploads dir).
    With ``incoming_bytes`` 0 it asks "may a command start?": refused at the quota. A write that
    does not grow the thread (``incoming_bytes`` < 0) is never refused. Blocking: call it from a
    worker thread in async code.
    """
    dirs = _thread_dirs(target)
    if incoming_bytes < 0:
        return
    root = dirs.base.parent.parent
    quota = quota or quota_for(root)
    problem = floor_problem(root, quota, incoming_bytes) or usage_problem(
        measure(dirs, quota.max_files), quota, incoming_bytes
    )
    if problem:
        raise QuotaExceeded(problem)


# --- around a command -------------------------------------------------------------------------


async def before_command(dirs: ThreadDirs, quota: DiskQuota) -> None:
    """Refuse to start a command in a full thread or on a nearly full disk."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(_pool(), check_room, dirs, 0, quota)


async def watch(dirs: ThreadDirs, quota: DiskQuota) -> str:
    """Return (never raise) a reason to stop the running command, as soon as there is one.

    Meant to race the command: the provider kills the command when this returns and cancels this
    when the command ends first. The first walk comes one interval in, the pre-check just walked.
    """
    loop = asyncio.get_running_loop()
    root = dirs.base.parent.parent
    next_walk = loop.time() + WALK_EVERY
    walk: asyncio.Future[Usage] | None = None
    started = 0.0
    while True:
        try:
            problem = floor_problem(root, quota)
            if problem:
                return problem
            if walk is None and loop.time() >= next_walk:
                started = loop.time()
                walk = loop.run_in_executor(_pool(), measure, dirs, quota.max_files)
            if walk is not None and walk.done():
                current, walk = walk, None
                took = loop.time() - started
                next_walk = loop.time() + max(WALK_EVERY, 2 * took)
                problem = usage_problem(current.result(), quota)
                if problem:
                    return problem
        except Exception:  # a failed measurement must not kill a command; try again next tick
            log.exception("sandbox quota watchdog for %s failed", dirs.base.name)
            walk = None
            next_walk = loop.time() + WALK_EVERY
        await asyncio.sleep(FLOOR_EVERY)


async def after_command(dirs: ThreadDirs, quota: DiskQuota) -> str | None:
    """A line for the command's result when it left the thread without room, else None."""
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(_pool(), check_room, dirs, 0, quota)
    except QuotaExceeded as e:
        return f"[{e}; further commands are refused until then]"
    except OSError:
        log.exception("sandbox quota check after a command in %s failed", dirs.base.name)
    return None


def stopped_note(reason: str) -> str:
    return f"\n[command stopped: {reason}]"


__all__ = [
    "DiskQuota",
    "QuotaExceeded",
    "Usage",
    "after_command",
    "before_command",
    "check_room",
    "free_bytes",
    "measure",
    "quota_for",
    "register",
    "watch",
]
