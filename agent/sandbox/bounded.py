"""Reading files the sandbox controls without letting them size the daemon's memory or time.

Sandboxed code decides what is in its files: a sparse 1 GB file whose first line never ends, a
million-line log, a directory of a million entries. The daemon reads them in its own process (the
file tools act on the host dirs, files.py), so every read here is streamed in fixed chunks and
stops at a byte budget, a line budget and a deadline; a long line is cut after
:data:`MAX_LINE_BYTES` and says so, it is never held whole. Opening goes through files.py's
``O_NOFOLLOW | O_NONBLOCK`` and an ``fstat`` check, so FIFOs, sockets and device nodes are refused
before a byte is read (docs/sandbox.md, "Bounded reads").
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

CHUNK = 1024 * 1024
"""Bytes read per system call: the most a read holds at once besides what it returns."""
MAX_LINE_BYTES = 4096
"""Bytes of one line shown; the rest of the line is skipped (streamed past, never kept)."""
MAX_WINDOW_BYTES = 256 * 1024
"""Bytes of lines one read_file call returns at most (the model's own cut is about 80 K chars)."""
MAX_SCAN_BYTES = 64 * 1024 * 1024
"""Bytes one read_file call scans at most, to reach its offset and to count the file's lines."""
READ_SECONDS = 10.0
"""Wall time one read_file call may spend scanning."""
MAX_EDIT_BYTES = 8 * 1024 * 1024
"""Larger files are not edited in the daemon's memory (edit_file); the agent can use a shell."""
MAX_LS_ENTRIES = 5000
"""Entries of one directory listed; a larger directory is listed in part, and says so."""
MAX_LS_LOOKED = 4 * MAX_LS_ENTRIES
"""Entries of one directory looked at, those left out (a dangling link) included: a directory of
millions of them is cut here instead of read whole and answered as empty."""
WALK_SECONDS = 20.0
"""Wall time one glob or grep call may spend; then it returns what it found, marked truncated."""
MAX_GREP_BYTES = 256 * 1024 * 1024
"""Bytes one grep call reads over all files; then it stops, marked truncated."""
MAX_GREP_FILE = 8 * 1024 * 1024
"""Bigger files are skipped by grep: it is for source and text, not data dumps."""
MAX_GREP_LINE = 1000
"""Characters of a matching line shown."""


class ReadRefused(Exception):
    """The read cannot be done within the bounds; the text says why, for the model."""


@dataclass
class Lines:
    """What :func:`read_lines` found."""

    lines: list[str] = field(default_factory=list)
    """The window's lines, each with its line ending; a cut line ends in a note saying so."""
    total: int | None = None
    """Lines in the file, None when the scan stopped before its end (a budget ran out)."""


def cut_note(skipped: int | None) -> str:
    """What replaces the unseen rest of a long line."""
    more = f"{skipped:,} more bytes" if skipped is not None else "the rest"
    return f" [… line cut: {more} of this line not shown; use execute with cut, fold or head -c]"


def _decode(raw: bytes, whole: bool) -> str:
    """``raw`` as UTF-8 (strict: a non-UTF-8 file is refused upstream); a cut line may end inside
    a character, so up to three trailing bytes may be dropped there."""
    if whole:
        return raw.decode("utf-8")
    for trim in range(4):
        try:
            return raw[: len(raw) - trim].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8")  # raises: genuinely not UTF-8


class _Window:
    """Collects the lines of the window as they stream past."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.size = 0
        self.cur = bytearray()
        self.cur_len = 0

    def feed(self, piece: bytes) -> None:
        room = MAX_LINE_BYTES - len(self.cur)
        if room > 0:
            self.cur += piece[:room]
        self.cur_len += len(piece)

    def finish(self, complete: bool) -> None:
        """End the current line: ``complete`` when its end was seen (newline or end of file)."""
        raw = bytes(self.cur)
        if self.cur_len <= len(raw):
            self.lines.append(_decode(raw, True))
        else:
            body = raw.rstrip(b"\n")
            skipped = self.cur_len - len(body) if complete else None
            self.lines.append(_decode(body, False) + cut_note(skipped) + "\n")
        self.size += len(raw)
        self.cur = bytearray()
        self.cur_len = 0


def read_lines(f: BinaryIO, offset: int, limit: int, *, virtual: str) -> Lines:
    """Lines ``offset`` (0-based) .. ``offset+limit`` of the open file ``f``, streamed.

    Stops filling the window at :data:`MAX_WINDOW_BYTES`, and stops reading at
    :data:`MAX_SCAN_BYTES` or after :data:`READ_SECONDS` (then ``total`` is None: the file's
    length in lines is not known). Raises :class:`ReadRefused` when ``offset`` lies beyond what
    the budgets let it reach."""
    deadline = time.monotonic() + READ_SECONDS
    end = offset + limit
    line = 0  # index of the line the next byte belongs to
    partial = False  # bytes of line ``line`` were seen (no newline yet)
    window = _Window()
    full = limit <= 0
    scanned = 0
    stopped = False
    while True:
        if scanned >= MAX_SCAN_BYTES or time.monotonic() > deadline:
            stopped = True
            break
        chunk = f.read(min(CHUNK, MAX_SCAN_BYTES - scanned))
        if not chunk:
            break
        scanned += len(chunk)
        pos, n = 0, len(chunk)
        while pos < n:
            if line < offset:
                newlines = chunk.count(b"\n", pos)
                if line + newlines < offset:  # the whole rest of the chunk is before the window
                    line += newlines
                    partial = not chunk.endswith(b"\n")
                    break
                nl = chunk.find(b"\n", pos)
                line, pos, partial = line + 1, nl + 1, False
            elif line < end and not full:
                nl = chunk.find(b"\n", pos)
                stop = n if nl < 0 else nl + 1
                window.feed(chunk[pos:stop])
                pos = stop
                if nl < 0:
                    partial = True
                    break
                window.finish(True)
                line, partial = line + 1, False
                full = window.size >= MAX_WINDOW_BYTES
            else:  # past the window: only count
                line += chunk.count(b"\n", pos)
                partial = not chunk.endswith(b"\n")
                break
    in_window = offset <= line < end and window.cur_len > 0
    if in_window:
        window.finish(not stopped)
    if stopped:
        if line < offset or (line == offset and not window.lines):
            raise ReadRefused(
                f"{virtual}: line offset {offset} lies beyond the first {scanned:,} bytes "
                "I read of this file; use execute (sed -n, tail, split) to look further in"
            )
        return Lines(window.lines, None)
    total = line + (1 if partial else 0)
    return Lines(window.lines, total)


class Budget:
    """Time and bytes one glob or grep call may spend (py); ``cut`` once either ran out."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + WALK_SECONDS
        self.bytes_left = MAX_GREP_BYTES
        self.cut = False

    def spent(self) -> bool:
        if self.bytes_left <= 0 or time.monotonic() > self.deadline:
            self.cut = True
        return self.cut


def grep_file(
    name: str, dfd: int, rx: re.Pattern[str], budget: Budget, flags: int
) -> Iterator[tuple[int, str]]:
    """Matching lines of the file ``name`` in ``dfd``: a regular file of at most
    :data:`MAX_GREP_FILE` bytes that is not binary; each line shown cut at :data:`MAX_GREP_LINE`."""
    try:
        fd = os.open(name, os.O_RDONLY | flags, dir_fd=dfd)
    except OSError:
        return
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_GREP_FILE or budget.spent():
            return
        data = f.read(MAX_GREP_FILE)  # the file may have grown since fstat
    budget.bytes_left -= len(data)
    if b"\x00" in data[:8192]:
        return  # binary
    for i, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if rx.search(line):
            yield i, line if len(line) <= MAX_GREP_LINE else line[:MAX_GREP_LINE] + " [… line cut]"
