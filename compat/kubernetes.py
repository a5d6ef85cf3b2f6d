"""Reaches into ``kubernetes`` (the official client): an exec websocket read frame by frame.

Why (agent/sandbox/kubernetes_provider.py): ``kubernetes.stream.stream(..., _preload_content=False)``
returns a ``WSClient`` whose public reading (``update``/``read_channel``) buffers every frame that
is already waiting, without a bound, and copies all output into a second buffer (``capture_all``,
which ``stream`` does not let a caller turn off). A sandboxed command's output is hostile in size,
so the provider reads one frame at a time from the websocket-client connection the ``WSClient``
holds (its ``sock`` attribute, not documented), with a timeout per read, and stops a blocked read
from another thread with that connection's ``abort``.

Public fallback (outside :data:`compat.versions.VERIFIED`'s ``kubernetes`` set): the public
``update``/``read_channel`` loop, draining ``read_all`` after each pass (so the copy does not
grow), a closing ``close`` instead of an abort (a blocked read ends at its poll timeout, 1 s).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from urllib3.exceptions import HTTPError

from compat.versions import usable

TransportError = HTTPError
"""What the REST client raises (urllib3's) when the API server is unreachable or slow: no status."""

DISTRIBUTION = "kubernetes"
_OPCODE_TEXT, _OPCODE_BINARY, _OPCODE_CLOSE = 0x1, 0x2, 0x8
_CLOSE_CHANNEL = 255
ERROR_CHANNEL = 3


def frames(ws: Any, timeout: float | None) -> Iterator[tuple[int, bytes]]:
    """(channel, bytes) of each data frame of an exec websocket until it closes: 1 stdout, 2
    stderr, 3 the exec's final Status. A read waiting longer than ``timeout`` raises
    ``TimeoutError``; a connection that drops ends the frames (the pod may be gone)."""
    if not usable(DISTRIBUTION):
        yield from _public_frames(ws, timeout)
        return
    import websocket  # the client's own dependency (websocket-client)

    sock = ws.sock
    sock.settimeout(timeout)
    while True:
        try:
            opcode, frame = sock.recv_data_frame(True)
        except websocket.WebSocketTimeoutException:
            raise TimeoutError("no data from the exec stream in time") from None
        except (websocket.WebSocketConnectionClosedException, OSError):
            return
        if opcode == _OPCODE_CLOSE:
            return
        if opcode not in (_OPCODE_TEXT, _OPCODE_BINARY):
            continue
        data = bytes(frame.data)
        if not data or data[0] == _CLOSE_CHANNEL:  # v5: one of the streams closed
            continue
        yield data[0], data[1:]


def _public_frames(ws: Any, timeout: float | None) -> Iterator[tuple[int, bytes]]:
    import time

    last = time.monotonic()
    while ws.is_open():
        ws.update(timeout=1.0)
        got = False
        for channel in (1, 2, ERROR_CHANNEL):
            data = ws.read_channel(channel)
            if data:
                got = True
                yield channel, data if isinstance(data, bytes) else data.encode()
        ws.read_all()  # drops the client's second copy of the output
        if got:
            last = time.monotonic()
        elif timeout is not None and time.monotonic() - last > timeout:
            raise TimeoutError("no data from the exec stream in time")
    for channel in (1, 2, ERROR_CHANNEL):
        data = ws.read_channel(channel)
        if data:
            yield channel, data if isinstance(data, bytes) else data.encode()


def abort(ws: Any) -> None:
    """End the exec's connection now, from any thread: a read blocked on it returns."""
    if usable(DISTRIBUTION):
        with contextlib.suppress(Exception):
            ws.sock.abort()
    with contextlib.suppress(Exception):
        ws.close()


def timed_connect(seconds: Callable[[], float]) -> None:
    """Give every exec websocket's connect (TCP, TLS, the upgrade) a deadline of ``seconds()``.

    ``kubernetes.stream.ws_client.create_websocket`` connects a ``websocket.WebSocket`` with no
    timeout and no way to pass one, so an API server that accepts and never answers would hold
    the connect (and the provider's connect lock, every thread's execs) forever. The client's
    module-level ``WebSocket`` name is replaced, once, by a subclass whose ``connect`` defaults
    ``timeout``. Only for the verified client versions (outside them a connect has no deadline)."""
    if not usable(DISTRIBUTION):
        return
    import websocket
    from kubernetes.stream import ws_client

    if getattr(ws_client.WebSocket, "chital_timed", False):
        return

    class TimedWebSocket(websocket.WebSocket):
        chital_timed = True

        def connect(self, url: str, **options: Any) -> None:
            options.setdefault("timeout", seconds())
            super().connect(url, **options)

    ws_client.WebSocket = TimedWebSocket  # type: ignore[misc]
