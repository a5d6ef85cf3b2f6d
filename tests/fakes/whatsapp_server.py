"""A fake WhatsApp Cloud API on 127.0.0.1: the Graph API the adapter calls, and a driver that
delivers webhooks to the daemon as Meta does.

Graph side (bearer token checked on every call; errors in Graph's JSON shape
``{"error": {"message", "type", "code", "error_subcode", "fbtrace_id"}}``):
``GET /{version}/{phone_number_id}`` (the number's record), ``POST /{version}/{phone_number_id}/messages``
(text, interactive, image, document, reaction, read/typing; a recipient outside the 24-hour window
gets error 131047, a revoked token 190), ``POST /{version}/{phone_number_id}/media`` (multipart
upload), ``GET /{version}/{media_id}`` (the media's short-lived URL, size, type) and the URL itself.

Webhook side (:meth:`deliver`): a signed ``POST`` (``X-Hub-Signature-256``, HMAC-SHA256 of the raw
body with the app secret) of the real payload shape, ``entry[].changes[].value`` with
``messages``, ``contacts`` and ``statuses``; unsigned, wrongly signed and raw bodies for attacks,
and redelivery of a message. :meth:`verify` is Meta's subscription handshake. With
:attr:`FakeWhatsApp.webhook_urls` set, deliveries are spread over several daemons as a load
balancer in front of them does, and one no daemon took (5xx, timeout, dead) is retried on the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from channels.base import Channel
from channels.webroute import mount_path
from tests.fakes.polling import poll

T = TypeVar("T")
VERSION = "v21.0"
PHONE_NUMBER_ID = "106540352242922"
DISPLAY_NUMBER = "+1 555 010 0000"
BUSINESS_WA_ID = "15550100000"
"""The business number's digits: ``metadata.display_phone_number`` and a quoted reply's ``context.from``."""
GROUP = "Y2FwaV9ncm91cDoxNzA1NTU1MDEzOToxMjAzNjM0MDQ2OTQyMzM4MjAZD"
"""A Groups API group id (the shape Meta's docs show)."""
WINDOW_ERROR = 131047
TOKEN_ERROR = 190


@dataclass
class Sent:
    """A message the bot sent, as the fake recorded it."""

    wamid: str
    to: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("type", ""))

    @property
    def text(self) -> str:
        if self.kind == "text":
            return str(self.body["text"]["body"])
        if self.kind == "interactive":
            return str(self.body["interactive"]["body"]["text"])
        media = self.body.get(self.kind)
        return str(media.get("caption", "")) if isinstance(media, dict) else ""

    @property
    def reply_to(self) -> str | None:
        context = self.body.get("context")
        return context.get("message_id") if isinstance(context, dict) else None


def graph_error(status: int, code: int, message: str, etype: str = "OAuthException") -> web.Response:
    body = {"error": {"message": message, "type": etype, "code": code, "error_subcode": 2494010,
                      "fbtrace_id": "AbCdEfGhIjK"}}  # fmt: skip
    return web.json_response(body, status=status)


class FakeWhatsApp:
    platform = "whatsapp"

    def __init__(
        self,
        token: str = "EAAGfakeWhatsAppAccessToken0123456789abcdef",
        app_secret: str = "fake-app-secret-0123456789abcdef",
        verify_token: str = "fake-verify-token-0123456789",
    ) -> None:
        self.token, self.app_secret, self.verify_token = token, app_secret, verify_token
        self.port = 0
        self.webhook_url = ""
        """The daemon's webhook (``http://127.0.0.1:<hooks port>/channels/whatsapp/webhook``)."""
        self.webhook_urls: list[str] = []
        """Several daemons behind a load balancer: when set, :meth:`deliver` spreads deliveries
        over these in turn and, as Meta retries, offers a delivery refused with a 5xx, timed out
        or sent to a dead daemon to the next one."""
        self.delivery_timeout = 10.0
        """How long a spread delivery waits for an answer before it is given to the next daemon."""
        self.attempts: list[tuple[str, int]] = []
        """Each spread delivery attempt: (URL, HTTP status or 0 when no answer came)."""
        self._turn = itertools.count()
        self.calls: list[tuple[str, str]] = []
        self.sent: list[Sent] = []
        self.uploads: dict[str, tuple[bytes, str, str]] = {}
        self.media: dict[str, tuple[bytes, str]] = {}
        self.outside_window: set[str] = set()
        self.refused: list[dict[str, Any]] = []
        """Sends refused with 131047 (outside the 24-hour window)."""
        self.lie_about_size: dict[str, int] = {}
        self._fail: dict[str, list[web.Response]] = {}
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def channel_settings(self) -> dict[str, Any]:
        return {"enabled": True, "phone_number_id": PHONE_NUMBER_ID, "access_token": self.token,
                "app_secret": self.app_secret, "verify_token": self.verify_token,
                "graph_url": self.base_url, "api_version": VERSION}  # fmt: skip

    async def start(self) -> FakeWhatsApp:
        app = web.Application(client_max_size=200 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- scripting ------------------------------------------------------------------------------
    def revoke_token(self) -> None:
        self.token = "revoked-" + self.token

    def fail_next(self, kind: str, response: web.Response) -> None:
        """The next call of ``kind`` (``messages``, ``media``, ``phone``) answers ``response``."""
        self._fail.setdefault(kind, []).append(response)

    def add_media(self, data: bytes, mime: str = "application/octet-stream") -> str:
        media_id = f"{next(self._ids) + 900000000}"
        self.media[media_id] = (data, mime)
        return media_id

    def message(self, sender: str, mtype: str = "text", **fields: Any) -> dict[str, Any]:
        """A user's message as the webhook carries it (``wamid.`` ids, unix timestamp)."""
        wamid = f"wamid.HBgL{next(self._ids):08d}FakeMessageId"
        return {"from": sender, "id": wamid, "timestamp": str(int(time.time())), "type": mtype, **fields}

    def payload(self, *messages: Any, statuses: list[Any] | None = None, names: dict[str, str] | None = None,
                number: str = PHONE_NUMBER_ID) -> dict[str, Any]:  # fmt: skip
        senders = {m["from"] for m in messages if isinstance(m, dict) and isinstance(m.get("from"), str)}
        contacts = [
            {"profile": {"name": (names or {}).get(s, f"User {s[-4:]}")}, "wa_id": s} for s in senders
        ]
        value: dict[str, Any] = {"messaging_product": "whatsapp",
                                 "metadata": {"display_phone_number": BUSINESS_WA_ID, "phone_number_id": number}}  # fmt: skip
        if messages:
            value["contacts"] = contacts
            value["messages"] = list(messages)
        if statuses:
            value["statuses"] = statuses
        return {"object": "whatsapp_business_account",
                "entry": [{"id": "102290129340398", "changes": [{"field": "messages", "value": value}]}]}  # fmt: skip

    def sign(self, body: bytes, secret: str | None = None) -> str:
        key = (secret if secret is not None else self.app_secret).encode()
        return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()

    async def post(self, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
        """POST ``body`` to the daemon's webhook with ``headers`` as given (no signature added)."""
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        async with aiohttp.ClientSession() as s, s.post(self.webhook_url, data=body, headers=hdrs) as r:
            return r.status, await r.text()

    async def deliver(self, payload: Any, *, signature: str | None = None) -> int:
        """Deliver ``payload`` signed with the app secret (or with ``signature`` as given); to
        :attr:`webhook_url`, or spread over :attr:`webhook_urls` when set."""
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        headers = {"X-Hub-Signature-256": signature or self.sign(body)}
        if self.webhook_urls:
            return await self._spread(body, headers)
        status, _ = await self.post(body, headers)
        return status

    async def _spread(self, body: bytes, headers: dict[str, str], rounds: int = 5) -> int:
        """The load balancer in front of several daemons: the next daemon in turn gets the
        delivery; a 5xx, a timeout or a refused connection moves it to the one after (Meta
        retries a delivery it got no 2xx for). Returns the first non-5xx status, else the last."""
        hdrs = {"Content-Type": "application/json", **headers}
        status = 0
        timeout = aiohttp.ClientTimeout(total=self.delivery_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            for _ in range(rounds):
                for _ in range(len(self.webhook_urls)):
                    url = self.webhook_urls[next(self._turn) % len(self.webhook_urls)]
                    try:
                        async with s.post(url, data=body, headers=hdrs) as r:
                            status = r.status
                            await r.read()
                    except (aiohttp.ClientError, TimeoutError):
                        status = 0
                    self.attempts.append((url, status))
                    if 0 < status < 500:
                        return status
                await asyncio.sleep(0.5)
        return status

    async def inject_text(self, sender: str, text: str, **fields: Any) -> dict[str, Any]:
        """A user writes ``text``; returns the message once the daemon answered 200."""
        msg = self.message(sender, "text", text={"body": text}, **fields)
        status = await self.deliver(self.payload(msg))
        assert status == 200, f"the webhook answered {status}"
        return msg

    async def redeliver(self, message: dict[str, Any]) -> int:
        """Meta sends the same message again (same wamid), as it does after a non-2xx or a timeout."""
        return await self.deliver(self.payload(message))

    async def verify(
        self, token: str, challenge: str = "1158201444", mode: str = "subscribe"
    ) -> tuple[int, str]:
        params = {"hub.mode": mode, "hub.verify_token": token, "hub.challenge": challenge}
        async with aiohttp.ClientSession() as s, s.get(self.webhook_url, params=params) as r:
            return r.status, await r.text()

    # -- reading --------------------------------------------------------------------------------
    def to(self, wa_id: str) -> list[Sent]:
        return [m for m in self.sent if m.to == wa_id and m.kind not in ("reaction", "")]

    def replies_to(self, wamid: str) -> list[Sent]:
        return [m for m in self.sent if m.reply_to == wamid and m.kind != "reaction"]

    def message_calls(self) -> int:
        return sum(1 for method, path in self.calls if method == "POST" and path.endswith("/messages"))

    async def wait_for(self, check: Callable[[], T | None], timeout: float = 15, what: str = "") -> T:
        found: T = await poll(check, timeout, what, lambda: [m.body for m in self.sent][-5:], every=0.05)
        return found

    # -- server ---------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.calls.append((request.method, path))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return graph_error(
                401, TOKEN_ERROR, "Error validating access token: The session has been invalidated."
            )
        parts = path.strip("/").split("/")
        if parts[0] == "media-blob" and len(parts) == 2 and parts[1] in self.media:
            return web.Response(body=self.media[parts[1]][0], content_type=self.media[parts[1]][1])
        if len(parts) < 2 or parts[0] != VERSION:
            return graph_error(400, 100, "Unknown path components", "GraphMethodException")
        if parts[1:] == [PHONE_NUMBER_ID] and request.method == "GET":
            return self._take("phone") or web.json_response(
                {
                    "id": PHONE_NUMBER_ID,
                    "display_phone_number": DISPLAY_NUMBER,
                    "verified_name": "Chital Test",
                }
            )
        if parts[1:] == [PHONE_NUMBER_ID, "messages"] and request.method == "POST":
            return self._take("messages") or await self._message(request)
        if parts[1:] == [PHONE_NUMBER_ID, "media"] and request.method == "POST":
            return self._take("media") or await self._upload(request)
        if len(parts) == 2 and request.method == "GET" and parts[1] in self.media:
            if failure := self._take("media_url"):
                return failure
            data, mime = self.media[parts[1]]
            size = self.lie_about_size.get(parts[1], len(data))
            return web.json_response({"url": f"{self.base_url}/media-blob/{parts[1]}", "mime_type": mime,
                                      "sha256": hashlib.sha256(data).hexdigest(), "file_size": size,
                                      "id": parts[1], "messaging_product": "whatsapp"})  # fmt: skip
        return graph_error(400, 100, "Unsupported request", "GraphMethodException")

    def _take(self, kind: str) -> web.Response | None:
        queue = self._fail.get(kind)
        return queue.pop(0) if queue else None

    async def _message(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("messaging_product") != "whatsapp":
            return graph_error(400, 100, "The parameter messaging_product is required.")
        if body.get("status") == "read":
            return web.json_response({"success": True})
        to = body.get("to")
        group = body.get("recipient_type") == "group"
        if not isinstance(to, str) or (to != GROUP if group else not to.isdigit()):
            return graph_error(400, 100, "Invalid parameter: to")
        if group and body.get("type") == "interactive":
            return graph_error(400, 131009, "Parameter value is not valid: interactive messages in groups")
        if body.get("type") == "text" and len(body["text"]["body"]) > 4096:
            return graph_error(400, 100, "Param text['body'] must be at most 4096 characters long.")
        if to in self.outside_window and body.get("type") != "reaction":
            self.refused.append(body)
            return graph_error(400, WINDOW_ERROR, "(#131047) Re-engagement message", "OAuthException")
        wamid = f"wamid.HBgLBOT{next(self._ids):08d}"
        self.sent.append(Sent(wamid, to, body))
        return web.json_response({"messaging_product": "whatsapp", "contacts": [{"input": to, "wa_id": to}],
                                  "messages": [{"id": wamid}]})  # fmt: skip

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        upload = form.get("file")
        if form.get("messaging_product") != "whatsapp" or not isinstance(upload, web.FileField):
            return graph_error(400, 100, "The parameter messaging_product is required.")
        media_id = f"{next(self._ids) + 800000000}"
        self.uploads[media_id] = (upload.file.read(), str(form.get("type")), upload.filename)
        return web.json_response({"id": media_id})


@contextlib.asynccontextmanager
async def webhook_listener(channel: Channel, fake: FakeWhatsApp) -> AsyncIterator[str]:
    """``channel``'s web routes on a listener of their own (as the daemon's hooks listener mounts
    them), for adapter tests without a daemon; points ``fake``'s driver at it."""
    app = web.Application()
    for route in channel.web_routes():
        app.router.add_route(route.method, mount_path(channel.name, route), route.handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake.webhook_url = f"http://127.0.0.1:{runner.addresses[0][1]}/channels/{channel.name}/webhook"
    try:
        yield fake.webhook_url
    finally:
        await runner.cleanup()
