"""Reaches into ``kubernetes`` (the official client): an exec websocket read frame by frame.

Why (agent/sandbox/kubernetes_provider.py): ``kubernetes.stream.stream(..., _preload_content=False)``
returns a ``WSClient`` whose public reading (``update``/``read_channel``) buffers every frame that
is already waiting, without a bound, and copies all output into a second buffer (``capture_all``,
which ``stream`` does not let a caller turn off). A sandboxed command's output is hostile in size,
so the provider reads one frame at a time from the websocket-client connection the ``WSClient``
holds (its ``sock`` attribute, not documented), with a timeout per read, and stops a blocked read
from another thread with that connection's ``abort``. Each frame's header and length are read
ahead of its payload through websocket-client's frame buffer (``needs_header``/``recv_header``/
``recv_length``, not documented either; websocket-client has its own line in
:data:`compat.versions.VERIFIED`), so a frame announcing more than :data:`MAX_FRAME` is refused
before its payload is gathered.

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
WEBSOCKET = "websocket-client"
MAX_FRAME = 4 * 1024 * 1024
"""The largest exec frame read (bytes). An API server sends a command's output in chunks of tens
of KB; a frame's header can announce 2**63 bytes, which websocket-client would gather in memory
before handing any of it over. Checked from the header, before the payload is read."""
_OPCODE_CONT, _OPCODE_TEXT, _OPCODE_BINARY, _OPCODE_CLOSE, _OPCODE_PING = 0x0, 0x1, 0x2, 0x8, 0x9
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
    capped = usable(WEBSOCKET)
    channel: int | None = None  # the message under way: its channel (-1: not known yet), or None
    while True:
        try:
            if capped and _announced(sock.frame_buffer) > MAX_FRAME:
                raise FrameTooLarge(f"the exec stream sent a frame over {MAX_FRAME // 1024**2} MB; cut there")
            frame = sock.recv_frame()
        except FrameTooLarge:
            raise
        except websocket.WebSocketTimeoutException:
            raise TimeoutError("no data from the exec stream in time") from None
        except websocket.WebSocketConnectionClosedException:
            return
        except websocket.WebSocketException as e:  # reserved opcode or bits, a fragmented ping, ...
            raise StreamBroken(f"the exec stream broke the websocket protocol ({type(e).__name__})") from None
        except OSError:
            return
        opcode, data = frame.opcode, bytes(frame.data)
        if opcode == _OPCODE_CLOSE:
            with contextlib.suppress(Exception):
                sock.send_close()
            return
        if opcode == _OPCODE_PING:
            with contextlib.suppress(Exception):
                sock.pong(data[:125])
            continue
        if opcode in (_OPCODE_TEXT, _OPCODE_BINARY):
            if channel is not None:
                raise StreamBroken("the exec stream began a message inside another")
            channel = -1
        elif opcode != _OPCODE_CONT:
            continue  # a pong
        elif channel is None:
            raise StreamBroken("the exec stream continued a message it had not begun")
        if channel < 0 and data:  # the message's first byte says its channel
            channel, data = data[0], data[1:]
        current = channel
        if frame.fin:
            channel = None
        if current < 0 or current == _CLOSE_CHANNEL or not data:  # v5: one of the streams closed
            continue
        yield current, data


class StreamBroken(ConnectionError):
    """An exec stream that broke the websocket protocol: cut there."""


class FrameTooLarge(StreamBroken):
    """An exec frame over :data:`MAX_FRAME`: the stream is cut there (its message says so)."""


def _announced(buffer: Any) -> int:
    """The next frame's length from its header, read ahead of its payload (websocket-client's
    frame buffer keeps the header and length for the ``recv_frame`` that follows)."""
    if buffer.needs_header():
        buffer.recv_header()
    if buffer.needs_length():
        buffer.recv_length()
    return int(buffer.length)


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
