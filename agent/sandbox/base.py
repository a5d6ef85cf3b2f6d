"""The sandbox contract: a ``Sandbox`` per conversation thread, handed out by a ``SandboxProvider``.

Providers differ only in how commands run (bubblewrap on this host, a Docker container, later a
Kubernetes pod). File tools always act on the thread's host directories through the path mapper,
so they behave identically everywhere and never depend on the sandbox being up.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .files import Entry, GrepMatch, HostFiles, TextWindow
from .paths import PathMapper, SandboxError, ThreadDirs
from .quota import DiskQuota, quota_for

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 120.0
DEFAULT_MAX_OUTPUT = 64 * 1024


class SandboxUnavailable(SandboxError):
    """The sandbox cannot run commands here (e.g. bubblewrap or Docker missing)."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    """The command's exit status; None when it was killed on timeout."""
    output: str
    """stdout and stderr interleaved, capped (see ``truncated``)."""
    truncated: bool = False
    timed_out: bool = False
    stopped: str | None = None
    """Why the sandbox killed the command before it ended (e.g. the disk quota); the output
    already ends with that reason, so the model reads it wherever the result goes."""

    def for_model(self) -> str:
        """One text block for a tool result: the output plus a status line when it matters."""
        status = ""
        if self.timed_out:
            status = "\n[command timed out and was killed]"
        elif self.exit_code:
            status = f"\n[exit code {self.exit_code}]"
        return (self.output or "") + status


class OutputCap:
    """Keeps the head and tail of a byte stream within ``limit`` bytes and counts what it drops.

    Why head and tail: the start shows what ran, the end usually holds the error. The dropped
    middle is replaced by an explicit marker so neither the model nor a user mistakes a cut
    output for a complete one.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(int(limit), 0)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0
        self._tail_limit = self.limit // 2
        self._head_limit = self.limit - self._tail_limit

    def feed(self, data: bytes) -> None:
        room = self._head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - self._tail_limit
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        if not self.dropped:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        marker = f"\n[... output truncated: {self.dropped} more bytes ...]\n"
        return (
            bytes(self.head).decode("utf-8", "replace") + marker + bytes(self.tail).decode("utf-8", "replace")
        )


class Sandbox(abc.ABC):
    """One thread's sandbox. File operations take virtual paths; relative ones mean the workspace."""

    def __init__(
        self, dirs: ThreadDirs, owner: tuple[int, int] | None = None, quota: DiskQuota | None = None
    ) -> None:
        self.dirs = dirs
        self.thread_id = dirs.thread_id
        self.owner = owner
        """Host (uid, gid) the thread's files belong to; None: the daemon's own."""
        self.mapper = PathMapper(dirs)
        self.files = HostFiles(self.mapper, owner)
        self.quota = quota or quota_for(dirs.base.parent.parent)
        """Disk quota of this thread (quota.py); every provider checks it around ``exec``."""
        self.last_used = time.monotonic()

    @property
    def id(self) -> str:
        """Stable identifier (used by deepagents' backend protocol)."""
        return f"{type(self).__name__}:{self.dirs.base.name}"

    def touch(self) -> None:
        self.last_used = time.monotonic()

    @abc.abstractmethod
    async def exec(
        self,
        command: str,
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the command's limit, not ours
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        """Run ``command`` with ``bash -c`` in the workspace. Every process it started is dead
        when this returns (timeout or not)."""

    async def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        network: bool = False,
        memory_mb: int | None = None,
        max_line: int = 1024 * 1024,
    ) -> asyncio.subprocess.Process:
        """Start a long-lived process in this sandbox with stdin and stdout as pipes (stderr
        discarded), in the workspace, in a process group of its own: end it with
        :func:`kill_group`, which takes every process it started along. ``env`` is its whole
        environment besides PATH, HOME and LANG; ``network`` gives it the host's network.
        ``max_line`` bounds one line read from its stdout. Providers that cannot refuse."""
        raise SandboxUnavailable(
            f"the {type(self).__name__} provider cannot run a coding agent; use the local "
            "(bubblewrap) sandbox provider"
        )

    # File operations: blocking host I/O runs in a worker thread so the event loop stays free.

    async def ls(self, path: str = "/mnt/user-data/workspace") -> list[Entry]:
        return await asyncio.to_thread(self.files.ls, path)

    async def stat(self, path: str) -> Entry | None:
        return await asyncio.to_thread(self.files.stat, path)

    async def read_file(self, path: str, offset: int = 0, limit: int = 2000) -> TextWindow:
        return await asyncio.to_thread(self.files.read_text, path, offset, limit)

    async def read_bytes(self, path: str, max_bytes: int | None = None) -> bytes:
        return await asyncio.to_thread(self.files.read_bytes, path, max_bytes)

    async def write_file(self, path: str, content: str | bytes) -> str:
        return await asyncio.to_thread(self.files.write, path, content)

    async def edit(self, path: str, old: str, new: str, replace_all: bool = False) -> int:
        return await asyncio.to_thread(self.files.edit, path, old, new, replace_all)

    async def delete(self, path: str) -> str:
        return await asyncio.to_thread(self.files.delete, path)

    async def glob(self, pattern: str, path: str = "/mnt/user-data") -> list[str]:
        return (await asyncio.to_thread(self.files.glob, pattern, path))[0]

    async def grep(
        self,
        pattern: str,
        path: str = "/mnt/user-data",
        glob: str | None = None,
        max_count: int | None = 1000,
    ) -> list[GrepMatch]:
        return (await asyncio.to_thread(self.files.grep, pattern, path, glob, max_count))[0]


async def settle(reader: asyncio.Future[Any], seconds: float) -> None:
    """Give an output reader ``seconds`` to end after its command was killed, then cancel it. Not
    ``await`` under a suppress: that would swallow a cancel of the caller's own (a stop) too."""
    if not (await asyncio.wait({reader}, timeout=seconds))[0]:
        reader.cancel()
    elif not reader.cancelled():
        reader.exception()  # retrieved: the command is being killed, the reader's end is moot


def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group :meth:`Sandbox.spawn` started (a sandbox's namespace dies with
    its first process, so nothing inside outlives this)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


class SandboxProvider(abc.ABC):
    """Hands out one sandbox per thread and owns their lifecycle.

    Call ``reconcile()`` once at start-up, ``reap_idle()`` periodically (or rely on
    ``start_reaper``), ``acquire()`` at the start of each turn, ``release()`` at its end and
    ``close()`` at shutdown.
    """

    def __init__(self, idle_timeout: float) -> None:
        self.idle_timeout = idle_timeout
        self._reaper: asyncio.Task[None] | None = None
        self.reap_gate: Callable[[], bool] | None = None
        """For sandboxes every daemon shares (the shared Docker mode): reap only while this says
        so; the gateway passes "this daemon owns the timers", so one daemon reaps, not all.
        Providers whose sandboxes are the daemon's own reap them regardless."""

    def owner_for(self, thread_id: str) -> tuple[int, int] | None:
        """(uid, gid) that sandboxed code of ``thread_id`` runs as on the host, when it is not the
        daemon's own; host-side file work for that thread runs with these rights (creds.py)."""
        return None

    def files_for(self, thread_id: str) -> HostFiles | None:
        """The thread's files when they are not in its host dirs (the shared Docker mode's are
        on the engine); None: the caller opens the host dirs. Blocking: call from a worker."""
        return None

    @abc.abstractmethod
    async def acquire(self, thread_id: str) -> Sandbox:
        """The thread's sandbox, created or woken as needed; reused across turns."""

    @abc.abstractmethod
    async def release(self, thread_id: str) -> None:
        """The turn is over; the sandbox may idle until reaped."""

    async def discard(self, thread_id: str) -> None:
        """Forget ``thread_id``'s sandbox now (the start-up probe's, agent/sandbox/probe.py), and
        stop whatever runs for it; its directories are the caller's to remove."""
        sandboxes = getattr(self, "_sandboxes", None)
        if isinstance(sandboxes, dict):
            sandboxes.pop(thread_id, None)

    @abc.abstractmethod
    async def reap_idle(self) -> list[str]:
        """Stop sandboxes idle longer than ``idle_timeout``; returns their thread ids."""

    @abc.abstractmethod
    async def reconcile(self) -> None:
        """At start-up: adopt or remove what a previous run of the daemon left behind."""

    async def close(self) -> None:
        """Stop the reaper and every sandbox of this provider."""
        await self.stop_reaper()

    def start_reaper(self, interval: float = 60.0) -> None:
        """Run ``reap_idle`` every ``interval`` seconds in the background until ``close``."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.reap_idle()
                except Exception:  # keep reaping; one failed pass must not stop the loop
                    log.exception("sandbox reaper pass failed")

        if self._reaper is None:
            self._reaper = asyncio.create_task(loop(), name="sandbox-reaper")

    async def stop_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        # Not ``await reaper`` under a suppress: a cancel of ours must not be swallowed. Cancelled
        # again every 5 s: a loop that lost its cancel must not hold the daemon's stop for ever.
        while reaper is not None and not reaper.done():
            reaper.cancel()
            await asyncio.wait({reaper}, timeout=5)
