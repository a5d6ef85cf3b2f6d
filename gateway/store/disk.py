"""The disk reserve: blocks kept aside beside the SQLite database so the journal can still write
while the disk is full, and the error raised once even that is spent.

Apart from the journal (gateway/store/journal.py) because it is file-system policy, not a
statement: the daemon's start-up takes the reserve (gateway/daemon/lifecycle.py) and the turn
runner reacts to :class:`StorageFull` without needing the store's tables.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from pathlib import Path

RESERVE_NAME = ".chital-reserve"
DEFAULT_RESERVE = 64 * 1024 * 1024
"""Disk space kept aside in the data dir for the journal itself (see :class:`DiskReserve`)."""


class StorageFull(Exception):
    """The disk under the data dir is full, even after giving up the reserve."""


class DiskReserve:
    """A file of pre-allocated blocks beside the database, given back when SQLite finds the disk
    full, so the journal can still record what is going on (a turn's failure, new messages) while
    an operator frees space. Re-taken once there is room again.

    Why a file and not a free-space check: anything on the same filesystem (a sandbox, logs,
    another program) can fill it between two checks; blocks we already own cannot be taken."""

    def __init__(self, folder: Path, size: int) -> None:
        self.path = folder / RESERVE_NAME
        self.size = size

    def take(self) -> bool:
        """Allocate the reserve if it is missing; False when the disk has no room for it."""
        if self.size <= 0:
            return True
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_size >= self.size:
                return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
            finally:
                os.close(fd)
            return True
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            return False

    def release(self) -> bool:
        """Give the reserved blocks back; True when there was something to give."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        return True


def is_full(exc: BaseException) -> bool:
    """SQLite's "database or disk is full" (SQLITE_FULL), which the reserve is given back for."""
    return isinstance(exc, sqlite3.OperationalError) and "full" in str(exc).lower()
