"""``chital mcp login NAME``: the one-time, operator-run authorization of an MCP server whose
``oauth.grant`` is ``authorization_code`` (the daemon has no browser; agent/tools/mcp_oauth.py).

The MCP SDK's ``OAuthClientProvider`` runs the flow (discovery, dynamic registration when no
``client_id`` is configured, PKCE, the token exchange); this module gives it the two things a
terminal can: a ``redirect_handler`` that prints the authorization URL for the operator to open
in any browser, and a ``callback_handler`` that receives the code on a loopback listener
(``http://127.0.0.1:PORT/callback``, RFC 8252 section 7.3) for one request with a ``code`` or an
``error``. The session that triggered the flow then lists the server's tools, proving the tokens
work; they are stored in the daemon's token directory, 0600, never printed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from agent.settings import McpServer
from agent.tools.mcp_oauth import FileTokenStorage, build_auth, token_path

LOGIN_TIMEOUT = 600.0
"""Seconds the operator has to complete the authorization in the browser."""


class LoginFailed(Exception):
    """The login did not complete (refused, timed out, the server failed); the text is ours."""


class _Loopback:
    """One-shot receiver of the authorization redirect on 127.0.0.1."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.result: asyncio.Future[tuple[str, str | None]] = asyncio.get_running_loop().create_future()
        self._runner: web.AppRunner | None = None

    async def _callback(self, request: web.Request) -> web.Response:
        query = request.query
        if not self.result.done():
            if query.get("code"):
                self.result.set_result((query["code"], query.get("state")))
            else:  # the authorization server's error code only, never its free text
                error = "".join(c for c in query.get("error", "no code") if c.isalnum() or c in "_-")[:60]
                self.result.set_exception(LoginFailed(f"the authorization server refused: {error}"))
        return web.Response(text="Chital: authorization received. You can close this window.\n")

    async def __aenter__(self) -> _Loopback:
        app = web.Application()
        app.router.add_get("/callback", self._callback)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        except OSError as exc:
            await self._runner.cleanup()
            raise LoginFailed(
                f"cannot listen on 127.0.0.1:{self.port} (oauth.redirect_port): {exc.strerror}"
            ) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait(self) -> tuple[str, str | None]:
        try:
            async with asyncio.timeout(LOGIN_TIMEOUT):
                return await asyncio.shield(self.result)
        except TimeoutError:
            raise LoginFailed(f"no authorization within {LOGIN_TIMEOUT:g}s") from None


async def login(name: str, config: McpServer, token_dir: Path, say: Callable[[str], None]) -> int:
    """Authorize server ``name`` and store its tokens; returns how many tools it then lists."""
    from langchain_mcp_adapters.client import MultiServerMCPClient
    from mcp.client.auth import OAuthFlowError

    from agent.tools.mcp import classify

    oauth = config.oauth
    if oauth is None or oauth.grant != "authorization_code":
        raise LoginFailed(f"MCP server {name!r} has no oauth section with grant: authorization_code")
    storage = FileTokenStorage(token_path(token_dir, name, config))
    storage.forget_tokens()  # the operator asks for a fresh authorization (e.g. after a revocation)
    async with _Loopback(oauth.redirect_port) as loopback:

        async def redirect(url: str) -> None:
            say(f"Open this URL in a browser and authorize Chital:\n\n  {url}\n")
            say(f"Waiting for the redirect to http://127.0.0.1:{oauth.redirect_port}/callback …")

        auth = build_auth(name, config, storage, redirect=redirect, callback=loopback.wait)
        connection = {**config.connection(), "auth": auth}
        client = MultiServerMCPClient({name: connection})  # type: ignore[dict-item]
        try:
            tools = await client.get_tools(server_name=name)
        except LoginFailed:
            raise
        except Exception as exc:
            found = [e for e in _leaves(exc) if isinstance(e, LoginFailed)]
            if found:
                raise found[0] from None
            if any(isinstance(e, OAuthFlowError) for e in _leaves(exc)) and not loopback.result.done():
                raise LoginFailed("the OAuth flow failed before the authorization step") from None
            raise LoginFailed(classify(exc)[0]) from None
    return len(tools)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [e for sub in exc.exceptions for e in _leaves(sub)]
    return [exc] + (_leaves(exc.__cause__) if exc.__cause__ is not None else [])
