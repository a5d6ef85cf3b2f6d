"""A fake ntfy server: ``POST /<topic>`` with the message as the body and ``Title``, ``Priority``,
``Tags``, ``Markdown``, ``X-Sequence-ID`` headers; ``GET /v1/health`` and ``GET /v1/account`` (what
``chital check --online`` asks). With ``token`` set, a request without
``Authorization: Bearer <token>`` gets ntfy's 401 (``{"code":40101,...}``). A body over 4,096
bytes is flagged (ntfy would turn it into an attachment)."""

from __future__ import annotations

import base64
import re

from aiohttp import web

from tests.fakes.push_http import FakePushServer, Recorded

MESSAGE_LIMIT = 4096


def decode_header(value: str) -> str:
    """ntfy decodes RFC 2047 ``=?UTF-8?B?...?=`` header values; so does the fake."""
    m = re.fullmatch(r"=\?UTF-8\?B\?([A-Za-z0-9+/=]*)\?=", value, re.IGNORECASE)
    return base64.b64decode(m.group(1)).decode("utf-8") if m else value


class FakeNtfy(FakePushServer):
    def __init__(self, token: str | None = None) -> None:
        super().__init__()
        self.token = token

    def answer(self, rec: Recorded) -> web.Response:
        authorized = self.token is None or rec.headers.get("Authorization") == f"Bearer {self.token}"
        if rec.method == "GET" and rec.path == "/v1/health":
            return web.json_response({"healthy": True})
        if rec.method == "GET" and rec.path == "/v1/account":
            if not authorized or "Authorization" not in rec.headers:
                return web.json_response({"code": 40101, "http": 401, "error": "unauthorized"}, status=401)
            return web.json_response({"username": "chital", "role": "user"})
        topic = rec.path.strip("/")
        if rec.method not in ("POST", "PUT") or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", topic):
            return web.json_response({"code": 40401, "http": 404, "error": "page not found"}, status=404)
        if not authorized:
            err = {"code": 40101, "http": 401, "error": f"unauthorized for topic {topic}"}
            return web.json_response(err, status=401)
        return web.json_response({"id": f"m{len(self.requests)}", "event": "message", "topic": topic})

    def notifications(self) -> list[Recorded]:
        """The publishes the server accepted."""
        return [r for r in self.requests if r.answered == 200 and r.method in ("POST", "PUT")]

    @staticmethod
    def title(rec: Recorded) -> str:
        return decode_header(rec.headers.get("Title", ""))
