"""A browser's side of the operator console for end-to-end tests: an aiohttp client with its own
cookie jar that logs in with the admin token, reads the CSRF token from a page and posts forms from
the console's own origin (docs/console.md)."""

from __future__ import annotations

import re
from typing import Any

import aiohttp

TOKEN = "console-admin-token-0123456789"
"""The admin token the tests' configs set (``console.token``)."""
PAGES = ("/", "/conversations", "/people", "/approvals", "/schedules", "/tasks", "/usage", "/skills")
ACTIONS = ("/people/approve", "/people/deny", "/people/revoke", "/schedules/cancel", "/approvals/revoke", "/approvals/approve", "/approvals/deny", "/tasks/stop", "/logout")  # fmt: skip
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class Console:
    """One browser: a cookie jar (``unsafe``: the daemon is at an IP address, whose cookies aiohttp
    would otherwise drop) and the daemon's base URL."""

    def __init__(self, port: int) -> None:
        self.origin = f"http://127.0.0.1:{port}"
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def close(self) -> None:
        await self.http.close()

    async def get(self, path: str, **kw: Any) -> tuple[int, str, aiohttp.ClientResponse]:
        async with self.http.get(self.origin + "/console" + path, allow_redirects=False, **kw) as r:
            return r.status, await r.text(), r

    async def post(
        self, path: str, data: dict[str, str], *, origin: str | None = "", **kw: Any
    ) -> tuple[int, str, aiohttp.ClientResponse]:
        """POST a form; ``origin`` "" sends the console's own, None sends no Origin header."""
        headers = dict(kw.pop("headers", {}))
        if origin is not None:
            headers["Origin"] = origin or self.origin
        url = self.origin + "/console" + path
        async with self.http.post(url, data=data, headers=headers, allow_redirects=False, **kw) as r:
            return r.status, await r.text(), r

    async def login(self, token: str = TOKEN) -> tuple[int, str, aiohttp.ClientResponse]:
        return await self.post("/login", {"token": token})

    async def csrf(self) -> str:
        status, body, _ = await self.get("/")
        assert status == 200, (status, body)
        match = _CSRF.search(body)
        assert match, body
        return match.group(1)
