"""Host-side file work on a sandbox's directories, done with the sandbox user's rights, not root's.

Why: a daemon running as root that opens a path sandboxed code can influence is one mistake away
from reading ``/etc/shadow`` or writing anywhere. :class:`~agent.sandbox.files.HostFiles` already
opens every component with ``O_NOFOLLOW`` relative to a directory fd; this is the second wall. Linux
keeps a *filesystem* uid/gid per thread (``setfsuid(2)``); switching it from 0 to the sandbox's uid
drops the file-related capabilities (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``, ``CAP_FOWNER``,
``CAP_CHOWN``...) for that thread only, so even a link that slipped through could reach only what
the sandbox user itself can. Files created meanwhile are owned by the sandbox user, as they should be.

Python has no binding for ``setfsuid``; glibc's wrapper is a plain per-thread syscall (unlike
``setuid``, it is not broadcast to every thread), which is exactly what a worker thread needs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

_libc = ctypes.CDLL(None, use_errno=True)
_held = threading.local()


def can_switch() -> bool:
    """True when this process can take another filesystem identity (it runs as root)."""
    return os.geteuid() == 0


@contextlib.contextmanager
def fs_identity(owner: tuple[int, int] | None) -> Iterator[None]:
    """Run the block with filesystem uid/gid ``owner`` in this thread (no-op when not root, when
    ``owner`` is None or root, or when already inside this context)."""
    if owner is None or owner[0] == 0 or not can_switch() or getattr(_held, "on", False):
        yield
        return
    uid, gid = owner
    # setfsgid first: once the fsuid is not 0, the thread may no longer change its fsgid.
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    if _libc.setfsuid(-1) != uid:  # -1 only reads the current value back
        _libc.setfsgid(0)
        raise PermissionError("could not take the sandbox user's filesystem identity")
    _held.on = True
    try:
        yield
    finally:
        _held.on = False
        _libc.setfsuid(0)
        _libc.setfsgid(0)
