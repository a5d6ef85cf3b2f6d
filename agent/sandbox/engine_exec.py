"""How a file operation's exec reaches a thread's container, and how its answer is read.

The engine-backed file tools (engine_files.py) run one fixed program per operation; the provider
says how that exec travels (:class:`ExecTransport`: Docker's attached exec socket, Kubernetes' exec
websocket) and :class:`Reply` reads what comes back with the daemon's own caps, in bytes and in
time, because the program runs beside sandboxed code and its output is as hostile as the files.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator
from typing import Any, Protocol

from .paths import SandboxError

IO_SECONDS = 60.0  # no byte for this long: the operation is abandoned (the transport's read timeout)
OP_SECONDS = 120.0  # the whole operation, here and (killed) in the container
STDIN_BOOT = (
    "import sys;n=int(sys.argv.pop(1));exec(compile(sys.stdin.buffer.read(n),'<chital-files>','exec'))"
)
"""Where the transport takes data on stdin (Kubernetes), the program comes first on stdin too:
an exec's arguments travel in the request's URL, and proxies in front of an API server commonly
refuse URLs past 8 KB. Reads exactly its length (``read(n)`` on a pipe waits for n bytes)."""


class ExecStream(Protocol):
    """One running exec's output, as (stream, bytes) frames: 1 stdout, 2 stderr."""

    def frames(self) -> Iterator[tuple[int, bytes]]:
        """The frames until the program ends; a read waiting longer than ``IO_SECONDS`` raises
        ``TimeoutError`` (or ``OSError``)."""
        ...

    def close(self) -> None: ...


class ExecTransport(Protocol):
    """How a provider runs engine_script.py in a thread's container (see the module docstring)."""

    stdin_data: bool
    """Data goes in on stdin (``@<n>`` arguments: n raw bytes each) rather than as base64
    arguments: Kubernetes carries an exec's arguments in the URL, whose size the API server caps."""

    def open_exec(self, thread_id: str, argv: list[str], stdin: bytes | None = None) -> ExecStream:
        """Start ``argv`` as the sandbox user in the thread's container (made or revived as
        needed) and feed it ``stdin``. Raises :class:`SandboxError` with a reason fit for the
        model (never a credential) when it cannot."""
        ...


class Reply:
    """The program's stdout, read with a deadline per read and a cap in bytes."""

    def __init__(self, stream: ExecStream, cap: int) -> None:
        self.sock = stream
        self.frames = iter(stream.frames())
        self.buf = bytearray()
        self.cap = cap
        self.got = 0
        self.eof = False
        self.deadline = time.monotonic() + OP_SECONDS

    def _more(self) -> bool:
        for stream, data in self.frames:
            if time.monotonic() > self.deadline:
                raise SandboxError("the file operation took too long; refused")
            if stream != 1:  # stderr: the program writes none; ignore whatever appears
                continue
            self.got += len(data)
            if self.got > self.cap:
                raise SandboxError("the file operation's reply is larger than its cap; refused")
            self.buf += data
            return True
        self.eof = True
        return False

    def header(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            if not self._more():
                raise SandboxError("the file operation gave no answer (the sandbox may be overloaded)")
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        try:
            head = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the limit
            raise SandboxError("the file operation gave an unreadable answer") from None
        if not isinstance(head, dict):
            raise SandboxError("the file operation gave an unreadable answer")
        return head

    def read(self, n: int = -1) -> bytes:
        """File-like: up to ``n`` bytes of the payload (``bounded.read_lines`` reads from this)."""
        while not self.eof and (n < 0 or len(self.buf) < n):
            self._more()
        n = len(self.buf) if n < 0 else min(n, len(self.buf))
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sock.close()


def answer_count(value: Any) -> int:
    """A size, count or line number from the answer: an int in [0, 2**63), or ValueError (a
    forged 10**400 would overflow a division later, a negative size would pass the quota)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError("not a count")
    return value


def answer_time(value: Any) -> float:
    """A modification time from the answer: a finite number, or ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("not a time")
    return float(value)


def answer_below(found: Any) -> bool:
    """Whether a path the walk reported is relative and stays below the searched directory."""
    if not isinstance(found, str) or not found or found.startswith("/"):
        return False
    return ".." not in found.split("/")


@contextlib.contextmanager
def answer_read(virtual: str) -> Iterator[None]:
    """Reading the fields of the program's answer. It runs as the sandbox user beside sandboxed
    code, which can forge what it prints (a write to /proc/PID/fd/1 ahead of the program's own
    line is enough; no ptrace needed): a field of the wrong shape (a name where a size goes,
    three items where four do, 1e999) is refused as unreadable JSON is, never a TypeError out
    of a file tool."""
    try:
        yield
    except (TypeError, ValueError, OverflowError):
        raise SandboxError(f"{virtual}: the file operation gave an unreadable answer") from None
