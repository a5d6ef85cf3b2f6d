"""The no-follow primitives :class:`~agent.sandbox.files.HostFiles` opens and names files with.

Split from agent/sandbox/files.py, which holds the operations (ls, read, write, edit, glob, grep...);
this module holds what they share about one name in a directory fd, none of it following a link:
the flags every open adds, whether a name is a link or exists at all (to tell a symlink swapped in
by sandboxed code from an ordinary failure), and the candidate names of a new file, each tried
with ``O_EXCL`` so an entry already there is skipped, never opened.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
"""Added to every file open: no link followed at the last component, and a FIFO or device the
sandbox planted fails or returns at once instead of blocking a daemon thread (O_NONBLOCK has no
effect on regular files)."""


def is_link_at(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def exists_at(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def numbered_names(name: str, tries: int = 1000) -> Iterator[str]:
    """``name``, then ``stem-2.ext``, ``stem-3.ext``... (``tries`` names in all)."""
    yield name
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    for n in range(2, tries + 1):
        yield f"{stem}-{n}.{ext}" if ext else f"{stem}-{n}"
