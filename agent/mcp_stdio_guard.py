"""A relay between Chital and a stdio MCP server that bounds each line the server writes.

The MCP SDK's stdio client reads a server's stdout by concatenating chunks until a newline: a
50 MB answer is held whole, and the concatenation is quadratic (minutes of the daemon's CPU). So
Chital starts a stdio server through this script (``python mcp_stdio_guard.py LIMIT -- cmd
args``): requests pass through unchanged; an answer line longer than LIMIT bytes is dropped as it
streams (never held) and replaced by a JSON-RPC error for the same request id (read from the line's
first bytes), which the catalog reports as "larger than LIMIT bytes".

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


def _pump(dst: subprocess.Popen[bytes]) -> None:
    """Our stdin to the server's, as it comes; closes the server's when ours ends."""
    assert dst.stdin is not None
    try:
        while chunk := os.read(0, 65536):
            dst.stdin.write(chunk)
            dst.stdin.flush()
    except OSError:
        pass
    finally:
        try:
            dst.stdin.close()
        except OSError:
            pass


def _too_large(head: bytes, limit: int) -> bytes:
    found = _ID.search(head)
    if found is None:
        return b""
    error = {"code": TOO_LARGE, "message": f"answer larger than {limit} bytes, dropped"}
    message = {"jsonrpc": "2.0", "id": json.loads(found.group(1)), "error": error}
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
                out.write(_too_large(head, limit) if dropping else b"".join(line))
                out.flush()
                line, size, head, dropping = [], 0, b"", False
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())
