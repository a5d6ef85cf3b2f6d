"""Escape checks shared by the sandbox providers' tests: every provider must pass the same ones."""

from __future__ import annotations

import asyncio
from typing import Any


async def assert_no_network(sb: Any) -> None:
    """Neither the host's loopback (a live server on 127.0.0.1) nor the internet is reachable, and
    the only interface is the sandbox's own loopback."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"reached the host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        script = (
            "import socket\n"
            f"for host, port in (('127.0.0.1', {port}), ('1.1.1.1', 80)):\n"
            "    s = socket.socket(); s.settimeout(3)\n"
            "    print(host, s.connect_ex((host, port)))\n"
        )
        res = await sb.exec(f'python3 -c "{script}"; cat /proc/net/dev', timeout=20)
    finally:
        server.close()
        await server.wait_closed()
    assert "reached the host" not in res.output
    results = dict(line.split() for line in res.output.splitlines()[:2])
    assert results["127.0.0.1"] == "111"  # ECONNREFUSED: the sandbox's own empty loopback
    assert results["1.1.1.1"] in {"101", "113"}  # ENETUNREACH / EHOSTUNREACH: no route at all
    interfaces = [line.split(":")[0].strip() for line in res.output.splitlines() if ":" in line]
    assert interfaces == ["lo"]


_FORK_500 = (
    "import os, time\n"
    "n = 0\n"
    "try:\n"
    "    for _ in range(500):\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30); os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print('fork failed', e.errno)\n"
    "print('forked', n)\n"
)


async def assert_fork_limited(sb: Any, below: int = 64) -> None:
    """Forking 500 children stops with EAGAIN before ``below`` processes."""
    res = await sb.exec(f'python3 -c "{_FORK_500}"', timeout=30)
    assert "fork failed 11" in res.output  # EAGAIN
    assert int(res.output.split("forked")[1].split()[0]) < below
