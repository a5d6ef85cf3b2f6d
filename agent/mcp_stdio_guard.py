"""A relay between Chital and a stdio MCP server that bounds each line the server writes.

The MCP SDK's stdio client reads a server's stdout by concatenating chunks until a newline: a
50 MB answer is held whole, and the concatenation is quadratic (minutes of the daemon's CPU). So
Chital starts a stdio server through this script (``python mcp_stdio_guard.py LIMIT -- cmd
args``): requests pass through unchanged; an answer line longer than LIMIT bytes is dropped as it
streams (never held) and replaced by a JSON-RPC error for the same request id (read from the line's
first bytes when it is one Chital asked and has no answer to yet, else the only such request: some
SDKs write the id after the result), which the catalog reports as "larger than LIMIT bytes".

Standard library only, run by path (not ``-m``): it starts once per call and must start fast. It
passes its environment on unchanged (the SDK's minimal one plus the server's ``env``). The SDK
stops a server by killing its process group, which holds this relay and the server alike.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

TOO_LARGE = -32099
"""The JSON-RPC error code of a dropped answer (implementation-defined server error range)."""
_ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')
_HEAD = 512


_pending: dict[str, object] = {}
"""Requests sent and not answered yet: their id as JSON text -> the id."""
_lock = threading.Lock()


def _note_requests(data: bytes) -> None:
    for line in data.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and "method" in message and "id" in message:
            with _lock:
                _pending[json.dumps(message["id"])] = message["id"]


def _pump(dst: subprocess.Popen[bytes]) -> None:
    """Our stdin to the server's, as it comes (noting the requests' ids); closes the server's when
    ours ends."""
    assert dst.stdin is not None
    buffered = b""
    try:
        while chunk := os.read(0, 65536):
            buffered += chunk
            if b"\n" in buffered:  # requests are Chital's own, small: parse whole lines
                done, _, buffered = buffered.rpartition(b"\n")
                _note_requests(done)
            dst.stdin.write(chunk)
            dst.stdin.flush()
    except OSError:
        pass
    finally:
        try:
            dst.stdin.close()
        except OSError:
            pass


def _answered(head: bytes) -> None:
    found = _ID.search(head)
    if found is not None:
        with _lock:
            _pending.pop(found.group(1).decode(errors="replace"), None)


def _too_large(head: bytes, limit: int) -> bytes:
    """The error answer standing in for a dropped line (nothing when whose it was is unknown)."""
    found = _ID.search(head)
    key = found.group(1).decode(errors="replace") if found else None
    with _lock:
        if key not in _pending:
            key = next(iter(_pending)) if len(_pending) == 1 else None
        if key is None:
            return b""
        request_id = _pending.pop(key)
    error = {"code": TOO_LARGE, "message": f"answer larger than {limit} bytes, dropped"}
    message = {"jsonrpc": "2.0", "id": request_id, "error": error}
    return json.dumps(message).encode() + b"\n"


def main() -> int:
    limit = int(sys.argv[1])
    command = sys.argv[3:] if sys.argv[2] == "--" else sys.argv[2:]
    try:
        server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    except OSError as exc:
        sys.stderr.write(f"mcp_stdio_guard: cannot start the MCP server: {type(exc).__name__}\n")
        return 127
    threading.Thread(target=_pump, args=(server,), daemon=True).start()
    assert server.stdout is not None
    out = sys.stdout.buffer
    line: list[bytes] = []
    size, head, dropping = 0, b"", False
    fd = server.stdout.fileno()
    while chunk := os.read(fd, 65536):
        while chunk:
            end = chunk.find(b"\n")
            part, chunk = (chunk, b"") if end < 0 else (chunk[: end + 1], chunk[end + 1 :])
            if len(head) < _HEAD:
                head += part[: _HEAD - len(head)]
            size += len(part)
            if not dropping and size > limit:
                dropping, line = True, []
            if not dropping:
                line.append(part)
            if end >= 0:
                if not dropping:
                    _answered(head)
                out.write(_too_large(head, limit) if dropping else b"".join(line))
                out.flush()
                line, size, head, dropping = [], 0, b"", False
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())
