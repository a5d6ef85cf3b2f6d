"""Reaches into ``docker`` (the SDK): the socket under an exec's attached stream.

Why (agent/sandbox/engine_files.py): the shared Docker mode reads each file operation's answer from
``exec_start(socket=True)``, whose object wraps the raw socket (``_sock``) and keeps the HTTP
response it came from (``_response``). A deadline per read needs the raw socket's timeout, and the
response must be closed with the socket, or its connection stays checked out of the SDK's pool.

Public fallback (outside :data:`compat.versions.VERIFIED`'s ``docker`` set): no timeout is set on the
socket (the operation's deadline is checked between frames only, so a stalled container holds a
read until the engine gives up) and the response is left to the garbage collector.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from compat.versions import usable

DISTRIBUTION = "docker"


def raw_socket(sock: Any) -> socket.socket | None:
    """The plain socket under an exec's attached stream, where there is one (not on Windows pipes)."""
    if not usable(DISTRIBUTION):
        return None
    inner = getattr(sock, "_sock", sock)
    return inner if isinstance(inner, socket.socket) else None


def close_response(sock: Any) -> None:
    """Close the HTTP response an exec's stream came from (its pooled connection goes back)."""
    if not usable(DISTRIBUTION):
        return
    with contextlib.suppress(Exception):
        sock._response.close()
