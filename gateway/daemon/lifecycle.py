"""The daemon's start-up and shutdown discipline: what it opened is closed, in reverse, whatever fails.

Modelled on aiohttp's ``web_runner`` / cleanup contexts and python-telegram-bot's ``Application``:
every resource is registered with its release *at the moment it is acquired*, so a start-up that
fails halfway releases exactly what it had opened, newest first, and one release that fails does not
stop the others (their errors are gathered and reported together). Background tasks are tracked in
one place and cancelled and awaited on close, so nothing keeps running behind a closed store.

Why this matters in the field: a half-started daemon (the HTTP port taken, the data directory
read-only) used to keep its SQLite thread alive and hang forever without serving ``/healthz``; a
supervisor (systemd, Docker) only restarts a process that exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from compat.versions import check_all
from gateway.config.urls import mask_url_query
from gateway.ops.tasks import TaskTracker
from gateway.store.disk import DiskReserve

log = logging.getLogger(__name__)

Release = Callable[[], Awaitable[object]]


class StartupError(Exception):
    """The daemon cannot start. The message is one line for the operator: what failed, where, and
    which setting to change; never a traceback, never a secret."""


class Resources:
    """A stack of (name, release) pairs plus the background tasks of the daemon."""

    def __init__(self, tasks: TaskTracker | None = None) -> None:
        self._stack: list[tuple[str, Release]] = []
        self._tasks = tasks if tasks is not None else TaskTracker()
        """The daemon's own background loops (retention, schedules, …): a child of the daemon's one
        tracker (gateway/ops/tasks.py), so every failed background task is logged one way."""
        self._closed = False

    def push(self, name: str, release: Release) -> None:
        """Register what releases a resource just acquired."""
        if self._closed:
            raise RuntimeError(f"cannot register {name}: the daemon is already closed")
        self._stack.append((name, release))

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start a background task that :meth:`release_all` cancels and awaits."""
        if self._closed:
            coro.close()
            raise RuntimeError(f"cannot start task {name}: the daemon is already closed")
        return self._tasks.spawn(coro, name)

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        return self._tasks.running

    async def cancel_tasks(self) -> None:
        """Cancel every tracked task and wait until each has finished."""
        await self._tasks.close()

    async def release_all(self) -> list[tuple[str, BaseException]]:
        """Cancel the tasks, then release every resource newest first. Returns the failures."""
        self._closed = True
        errors: list[tuple[str, BaseException]] = []
        try:
            await self.cancel_tasks()
        except BaseException as exc:  # only a cancel of the caller: recorded, and the releases still run
            errors.append(("background tasks", exc))
        while self._stack:
            name, release = self._stack.pop()
            try:
                await release()
            except asyncio.CancelledError as cancelled:
                # A release cancelled from outside must not leave older resources open.
                errors.append((name, cancelled))
            except Exception as failed:
                errors.append((name, failed))
        for name, err in errors:
            log.error("closing %s failed: %s", name, one_line(err))
        return errors


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters)."""
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -- the data directory ---------------------------------------------------------------------------
PROBE_NAME = ".chital-write-probe"
PROBE_BYTES = 64 * 1024


def prepare_data_dir(path: Path, reserve_bytes: int) -> None:
    """Make sure ``path`` is a directory we can write to and that holds the journal's reserve.

    A probe file is written and fsynced (not just ``os.access``: root passes every permission check,
    yet still cannot write to a read-only mount, an immutable directory or a full disk). Raises
    :class:`StartupError` naming the directory and the setting to change."""
    where = f"the data directory {path}"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)  # gateway/config/data_dir.py keeps it private
    except FileExistsError:
        raise StartupError(f"{where} is a file, not a directory (set storage.path)") from None
    except NotADirectoryError:
        raise StartupError(f"{where} cannot be created: a parent is a file (set storage.path)") from None
    except OSError as exc:
        raise StartupError(f"{where} cannot be created: {_os_reason(exc)} (set storage.path)") from None
    if not path.is_dir():
        raise StartupError(f"{where} is not a directory (set storage.path)")
    probe = path / PROBE_NAME
    try:
        with contextlib.suppress(FileNotFoundError):
            probe.unlink()
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        fix = (
            "free some space, or set storage.path"
            if exc.errno in (errno.ENOSPC, errno.EDQUOT)
            else "set storage.path"
        )
        raise StartupError(f"{where} is not writable: {_os_reason(exc)} ({fix})") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    if not DiskReserve(path, reserve_bytes).take():
        mb = reserve_bytes >> 20
        raise StartupError(
            f"the disk under {path} is full: no room for the journal's {mb} MB reserve "
            "(free some space, or lower storage.reserve_mb)"
        )


def _os_reason(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    if exc.errno == errno.EACCES:
        return "permission denied"
    if exc.errno == errno.EPERM:
        return "operation not permitted (immutable or read-only?)"
    return exc.strerror or one_line(exc)


def database_error(path: Path, exc: BaseException) -> StartupError:
    """A one-line reason why the database at ``path`` could not be opened."""
    if isinstance(exc, sqlite3.DatabaseError):
        return StartupError(f"cannot open the database {path}: {str(exc).splitlines()[0]} (see storage.path)")
    if isinstance(exc, OSError):
        return StartupError(f"cannot open the database {path}: {_os_reason(exc)} (see storage.path)")
    return StartupError(f"cannot open the database {path}: {one_line(exc)}")


def redact_url(url: str) -> str:
    """A database URL fit for a log line: the password masked."""
    url = mask_url_query(url)  # libpq also takes ?password=
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    creds, host = parts.netloc.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}" if ":" in creds else f"{user}@{host}"))


def postgres_error(url: str, exc: BaseException) -> StartupError:
    """A one-line reason why the PostgreSQL database could not be used (password masked)."""
    reason = one_line(exc).replace(url, redact_url(url))
    return StartupError(f"cannot open the database {redact_url(url)}: {reason} (see storage.url)")


# -- the HTTP port ----------------------------------------------------------------------------------
def listen_error(host: str, port: int, exc: OSError) -> StartupError:
    """``cannot listen on HOST:PORT: why (set http.port)``."""
    where = f"cannot listen on {host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return StartupError(f"{where}: address already in use (set http.port)")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StartupError(f"{where}: permission denied (ports below 1024 need privileges; set http.port)")
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return StartupError(f"{where}: no such local address (set http.host)")
    reason = exc.strerror or one_line(exc)
    return StartupError(f"{where}: {reason} (set http.host / http.port)")


def vendor_check() -> None:
    """Libraries installed outside the releases Chital's reaches into them were verified on
    (compat/versions.py): one line each; the daemon goes on with the public path where there is
    one, and does not start where there is none."""
    refused = []
    for problem in check_all():
        if problem.fatal:
            refused.append(problem.line())
        else:
            log.warning("%s", problem.line())
    if refused:
        raise StartupError("; ".join(refused))
