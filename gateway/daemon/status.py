"""What ``chital status`` asks the running daemon: channel states, queue depth, recent errors.

Served on a Unix domain socket in the data directory (``status.sock``, mode 0600), never on the HTTP
endpoint: that one may listen on every interface of a container, and recent errors say more about the
deployment than a stranger should learn. Reaching the socket takes the daemon's own user (or root),
the same rights that read the database. One JSON document, ``GET /status``.

The socket is bound in a private directory and renamed into place, so it is never connectable with
looser permissions, and the rename replaces the file a killed daemon left behind. When the old socket
still answers, another daemon is running on this data directory: start-up fails instead of stealing
it (two daemons on one journal would answer every message twice).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agent.redact import Redactor
from gateway.daemon.lifecycle import StartupError
from gateway.ops import tracing
from gateway.ops.logs import RedactingFilter

if TYPE_CHECKING:
    from gateway.daemon.app import Daemon

log = logging.getLogger(__name__)

SOCKET_NAME = "status.sock"
ERRORS_KEPT = 50
MESSAGE_CHARS = 240

Snapshot = Callable[[], Awaitable[dict[str, Any]]]


def socket_path(data_dir: Path) -> Path:
    return data_dir / SOCKET_NAME


# -- recent errors ----------------------------------------------------------------------------------
_CHANNEL_IN_TEXT = re.compile(r"^(?:channel )?([a-z]+)[: ]")


def _exception_line(exc_text: str, name: str) -> str:
    """``Type: first line of the message`` from a formatted (already redacted) traceback."""
    head = re.compile(rf"^(?:[\w.]+\.)?{re.escape(name)}(?::|$)")
    lines = exc_text.splitlines()
    for line in reversed(lines):
        if head.match(line):
            return line
    return lines[-1] if lines else name


class RecentErrors(logging.Handler):
    """The last ``kept`` ERROR-or-worse log records and, apart, the last ``kept`` warnings,
    redacted and cut to one line each.

    Two lists because a channel that reconnects logs a warning per attempt: in one list they
    pushed the one ERROR that mattered (the sandbox that cannot run) out of ``chital status``
    within seconds. A logging handler, so every part of the daemon (and the SDKs' own loggers)
    feeds it without knowing it exists; redacted by the same
    :class:`~gateway.ops.logs.RedactingFilter` as the log."""

    def __init__(self, redactor: RedactingFilter, channels: Iterable[str], kept: int = ERRORS_KEPT) -> None:
        super().__init__(logging.WARNING)
        self.addFilter(redactor)
        self._channels = frozenset(channels)
        self._errors: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(maxlen=kept)
        self._warnings: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(maxlen=kept)
        self._seq = itertools.count()
        """Arrival order: records of the same millisecond stay in the order they were logged."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            lines = text.strip().splitlines()
            message = lines[0] if lines else ""
            if record.exc_info and record.exc_info[1] is not None and record.exc_text:
                last = _exception_line(record.exc_text, type(record.exc_info[1]).__name__)
                message = f"{message} ({last})" if message else last
            if len(message) > MESSAGE_CHARS:
                message = message[: MESSAGE_CHARS - 1] + "…"
            kept = self._errors if record.levelno >= logging.ERROR else self._warnings
            entry: dict[str, Any] = {
                "time": round(record.created, 3),
                "level": record.levelname,
                "channel": self._channel_of(record, message),
                "logger": record.name,
                "message": message,
            }
            trace_id = tracing.current_id()  # logged within a traced message: the trace to open
            if trace_id is not None:
                entry["trace_id"] = trace_id
            kept.append((next(self._seq), entry))
        except Exception:  # a handler must never raise into the code that logged
            self.handleError(record)

    def _channel_of(self, record: logging.LogRecord, message: str) -> str | None:
        named = getattr(record, "channel", None)
        if isinstance(named, str):
            return named
        parts = record.name.split(".")
        if len(parts) > 1 and parts[0] == "channels" and parts[1] in self._channels:
            return parts[1]
        match = _CHANNEL_IN_TEXT.match(message)
        if match and match.group(1) in self._channels:
            return match.group(1)
        return None

    def entries(self, last: int | None = None) -> list[dict[str, Any]]:
        """Errors and warnings together, oldest first."""
        items = [entry for _, entry in sorted([*self._errors, *self._warnings], key=lambda e: e[0])]
        return items[-last:] if last else items

    def errors(self) -> list[dict[str, Any]]:
        """ERROR and CRITICAL records only, oldest first."""
        return [entry for _, entry in self._errors]

    def warnings(self) -> list[dict[str, Any]]:
        return [entry for _, entry in self._warnings]


# -- queue depth ------------------------------------------------------------------------------------
def queue_depth(
    journal: dict[str, int], parked: int, turns_running: float, turns_waiting: float
) -> dict[str, int]:
    """The journal's open entries by state, how many of the pending ones are replies waiting for a
    delivery retry, and the turns this process holds now (the TurnQueue's gauges)."""
    return {
        "pending": journal.get("pending", 0),
        "running": journal.get("running", 0),
        "parked": parked,
        "failed": journal.get("failed", 0),
        "done": journal.get("done", 0),
        "turns_running": int(turns_running),
        "turns_waiting": int(turns_waiting),
    }


# -- the socket -------------------------------------------------------------------------------------
class StatusUnavailable(Exception):
    """The status socket cannot be opened; the daemon runs on without ``chital status``."""


def socket_answers(path: Path) -> bool:
    """True when a process accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def bind_private(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600 from the moment it is reachable there.

    Bound inside a fresh 0700 directory next to ``path``, chmodded, then renamed over ``path``
    (which also replaces a stale socket of a killed daemon). Raises :class:`StartupError` when a
    live daemon answers on ``path``, :class:`StatusUnavailable` when the socket cannot be made."""
    if path.exists() or path.is_symlink():
        if path.is_socket() and socket_answers(path):
            raise StartupError(
                f"another chital daemon is running on {path.parent} (its status socket {path} answers); "
                "stop it first, or give this one its own storage.path"
            )
    private = Path(tempfile.mkdtemp(prefix=".status-", dir=path.parent))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        staged = private / "s"
        sock.bind(str(staged))
        os.chmod(staged, 0o600)
        sock.listen(64)
        os.replace(staged, path)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        too_long = exc.errno == errno.ENAMETOOLONG or "too long" in str(exc)
        why = "the path is too long for a Unix socket" if too_long else (exc.strerror or str(exc))
        raise StatusUnavailable(f"cannot open the status socket {path}: {why}") from None
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return sock


class StatusServer:
    """``GET /status`` on the socket: whatever ``snapshot`` returns, as JSON."""

    def __init__(self, path: Path, snapshot: Snapshot, redact: Redactor | None = None) -> None:
        self.path = path
        self._snapshot = snapshot
        self._redact = redact or Redactor()
        """Masks the daemon's secrets in the document (gateway/config/secrets.py): the last word before
        it leaves the process, whatever a reason or an error line quotes."""
        self._runner: web.AppRunner | None = None
        self._inode: int | None = None

    async def start(self) -> None:
        async def status(request: web.Request) -> web.Response:
            body = await self._snapshot()
            last = request.query.get("errors", "")
            for key in ("errors", "warnings"):
                if last.isdigit() and isinstance(body.get(key), list):
                    body[key] = body[key][-int(last) :] if int(last) else []
            return web.json_response(self._redact.deep(body))

        app = web.Application()
        app.router.add_get("/status", status)
        sock = bind_private(self.path)
        self._inode = os.stat(self.path).st_ino
        runner = self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        try:
            await runner.setup()
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            await self.close()
            raise

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        # Remove the file only if it is still ours (a second daemon may have replaced it).
        with contextlib.suppress(OSError):
            if self._inode is not None and os.stat(self.path).st_ino == self._inode:
                self.path.unlink()


async def snapshot(daemon: Daemon, errors: RecentErrors) -> dict[str, Any]:
    """The body of ``GET /status``: ``/readyz``'s document (the same channel, agent and storage
    reports: one source of truth), plus the queue, the recent errors and the process."""
    journal: dict[str, int] = {}
    problem = None
    if daemon.store is not None:
        try:
            journal = await daemon.store.journal_counts()
        except Exception as exc:  # a busy or failing database must not hide the rest of the status
            problem = f"the journal could not be counted: {type(exc).__name__}: {exc}"
    registry = daemon.metrics.registry
    gateway = daemon.gateway
    queue: dict[str, Any] = queue_depth(
        journal,
        len(gateway.parking) if gateway is not None else 0,
        registry.get_sample_value("chital_turns_running") or 0.0,
        registry.get_sample_value("chital_turns_queued") or 0.0,
    )
    if problem is not None:
        queue["error"] = problem
    now = time.time()
    return {
        **daemon.readiness(),
        "pid": daemon.pid,
        "started": daemon.started,
        "uptime_s": round(now - daemon.started, 1) if daemon.started else None,
        "now": round(now, 3),
        "queue": queue,
        "tracing": tracing_summary(daemon),
        "timers": daemon.timers.report() if daemon.timers is not None else {},
        "errors": errors.errors(),
        "warnings": errors.warnings(),
    }


def tracing_summary(daemon: Daemon) -> dict[str, Any]:
    """Whether this daemon makes spans, and where they go (the exporters' kinds, never their
    addresses or headers: an endpoint may carry a credential in its query)."""
    cfg = daemon.config.tracing
    if not tracing.active():
        return {"enabled": False}
    kinds = (("otlp", bool(cfg.otlp_endpoint)), ("langfuse", cfg.langfuse.configured))
    exporters = [name for name, on in kinds if on]
    return {"enabled": True, "exporters": exporters, "sample_ratio": cfg.sample_ratio}
