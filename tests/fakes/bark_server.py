"""A fake Bark server (bark-server's API v2): ``POST /push`` with a JSON ``device_key``, ``title``,
``body`` (and ``group``, ``level``, ``url``). Known device keys get ``{"code": 200}``; an unknown
one gets HTTP 400, as bark-server answers when it finds no device token for the key (its message
echoes the key: a client must not print it)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes.push_http import FakePushServer, Recorded, json_of


class FakeBark(FakePushServer):
    def __init__(self, device_keys: tuple[str, ...] = ("barkdevicekey0123456789",)) -> None:
        super().__init__()
        self.device_keys = set(device_keys)

    def answer(self, rec: Recorded) -> web.Response:
        if rec.method == "GET" and rec.path == "/ping":
            return web.json_response({"code": 200, "message": "pong", "timestamp": 1700000000})
        if rec.method != "POST" or rec.path != "/push":
            return web.json_response({"code": 404, "message": "not found"}, status=404)
        try:
            data = json_of(rec)
        except ValueError:
            return web.json_response({"code": 400, "message": "request bind failed"}, status=400)
        key = str(data.get("device_key", ""))
        if key not in self.device_keys:
            msg = f"failed to get device token: failed to get [{key}] device token from database"
            return web.json_response({"code": 400, "message": msg}, status=400)
        return web.json_response({"code": 200, "message": "success", "timestamp": 1700000000})

    def notifications(self) -> list[dict[str, Any]]:
        """The pushes the server accepted (HTTP 200), as their JSON bodies."""
        return [json_of(r) for r in self.requests if r.answered == 200 and r.path == "/push"]
