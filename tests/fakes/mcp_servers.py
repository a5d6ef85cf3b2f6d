"""Real MCP servers for tests (tests/fixtures/mcp_test_server.py, built with the official SDK),
served over streamable HTTP or SSE on 127.0.0.1 in a subprocess, and the config of each.

    async with McpHttpServer("streamable_http", token="tok-...") as srv:
        McpServer(transport="streamable_http", url=srv.url, headers={"Authorization": ...})

A subprocess rather than a thread: a test kills it in the middle of a call (the ``die`` tool ends
it; :meth:`McpHttpServer.restart` brings it back on the same port).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Literal

from tests.daemon import free_port

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SERVER = FIXTURES / "mcp_test_server.py"
GARBAGE = FIXTURES / "mcp_garbage_server.py"
OAUTH = FIXTURES / "mcp_oauth_server.py"
HttpTransport = Literal["streamable_http", "sse"]


def stdio_config(*, extra: bool = False, **kw: Any) -> dict[str, Any]:
    """The config of the test server over stdio (``extra``: with its ``weather`` tool)."""
    env = {"MCP_TEST_EXTRA": "1"} if extra else {}
    env.update(kw.pop("env", {}))
    return {"transport": "stdio", "command": sys.executable, "args": [str(SERVER), "stdio"], "env": env, **kw}


def garbage_config(mode: str = "list", **kw: Any) -> dict[str, Any]:
    """A stdio server that speaks broken JSON-RPC (tests/fixtures/mcp_garbage_server.py)."""
    return {"transport": "stdio", "command": sys.executable, "args": [str(GARBAGE), mode], **kw}


class McpHttpServer:
    """The test server on ``transport`` at :attr:`url`; ``token`` makes it require that bearer."""

    def __init__(self, transport: HttpTransport, *, token: str | None = None, extra: bool = False) -> None:
        self.transport = transport
        self.token = token
        self.extra = extra
        self.port = free_port()
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        path = "/mcp" if self.transport == "streamable_http" else "/sse"
        return f"http://127.0.0.1:{self.port}{path}"

    def config(self, token: str | None = None, **kw: Any) -> dict[str, Any]:
        """This server's entry in ``agent.mcp.servers`` (with ``token`` as its bearer, if any)."""
        cfg: dict[str, Any] = {"transport": self.transport, "url": self.url, **kw}
        if token is not None:
            cfg["headers"] = {"Authorization": f"Bearer {token}"}
        return cfg

    async def start(self) -> McpHttpServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_TEST_")}
        if self.token:
            env["MCP_TEST_TOKEN"] = self.token
        if self.extra:
            env["MCP_TEST_EXTRA"] = "1"
        self.proc = await asyncio.create_subprocess_exec(*self._argv(), env=env)
        for _ in range(300):  # up to ~30 s on a loaded machine
            if self.proc.returncode is not None:
                raise RuntimeError(f"the MCP test server exited with {self.proc.returncode}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return self
            await asyncio.sleep(0.1)
        raise RuntimeError("the MCP test server did not start listening")

    def _argv(self) -> list[str]:
        return [sys.executable, str(SERVER), self.transport, str(self.port)]

    async def wait_exit(self) -> int:
        assert self.proc is not None
        return await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def __aenter__(self) -> McpHttpServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class McpOAuthServer(McpHttpServer):
    """tests/fixtures/mcp_oauth_server.py: an MCP server asking for OAuth and its authorization
    server (client credentials, refresh tokens) on one port; :meth:`admin` drives the latter."""

    def __init__(self, transport: HttpTransport, *, client_id: str, client_secret: str) -> None:
        super().__init__(transport)
        self.client_id, self.client_secret = client_id, client_secret

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        return [
            sys.executable,
            str(OAUTH),
            self.transport,
            str(self.port),
            self.client_id,
            self.client_secret,
        ]

    def oauth_config(self, secret: str | None = None, **kw: Any) -> dict[str, Any]:
        """This server's entry in ``agent.mcp.servers``, with its OAuth client credentials."""
        oauth = {
            "client_id": self.client_id,
            "client_secret": secret or self.client_secret,
            "issuer": self.issuer,
        }
        return {"transport": self.transport, "url": self.url, "oauth": oauth, **kw}

    async def admin(self, action: str = "stats", **params: Any) -> dict[str, Any]:
        """``ttl`` (seconds=), ``revoke_refresh``, ``revoke_client``, ``expire_access``, ``stats``:
        returns the token endpoint's hit counts and every token issued."""
        import httpx

        async with httpx.AsyncClient(trust_env=False) as client:
            r = await client.post(f"{self.issuer}/_admin/{action}", params=params)
            r.raise_for_status()
            data: dict[str, Any] = r.json()
            return data
