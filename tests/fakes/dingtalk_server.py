"""A fake DingTalk (Stream gateway and the robot OpenAPI) on 127.0.0.1, for the real adapter.

What it speaks: ``POST /v1.0/gateway/connections/open`` (clientId/clientSecret -> endpoint and a
one-time ticket; 401 ``authFailed`` otherwise), the Stream websocket at that endpoint (frames of
type ``SYSTEM``/``EVENT``/``CALLBACK`` with ``headers.topic`` and ``headers.messageId``, data as a
JSON string; it records each ack by message id and sends every unacknowledged robot message again
to the next connection, as DingTalk does; with several connections of one app open, as several
daemons keep, each message goes to one of them in turn, and the unacknowledged ones of a connection
that closes go to another), ``POST /v1.0/oauth2/accessToken``, the robot sends
``/v1.0/robot/oToMessages/batchSend`` and ``/v1.0/robot/groupMessages/send`` (the
``x-acs-dingtalk-access-token`` header checked), ``/v1.0/robot/messageFiles/download`` and the
file URL it hands out. Errors have DingTalk's body shape ``{"requestid", "code", "message"}``.

Interactive cards: ``createAndDeliver``, ``PUT /v1.0/card/streaming`` and, for a card made from
the buttons template (:attr:`FakeDingTalk.button_template`), ``PUT /v1.0/card/instances``
(``updateCardDataByKey``); a press (:meth:`FakeDingTalk.press`) is a ``CALLBACK`` frame of topic
``/v1.0/card/instances/callback`` carrying ``outTrackId``, the presser's ``userId``, ``spaceType``
/ ``spaceId`` and ``content`` (``cardPrivateData.params`` of the pressed button), delivered only to
a connection that subscribed to that topic, and sent again until acknowledged.

What tests script: users' robot messages (:meth:`inject_text`), raw frames, redelivery, a dropped
connection, a half-open one (no pongs, no frames), a ``disconnect`` system frame, a revoked secret.
What they read: the bot's messages per chat, acks, connections, calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import WSMsgType, web

from tests.fakes.polling import poll

T = TypeVar("T")
ROBOT_TOPIC = "/v1.0/im/bot/messages/get"
CARD_TOPIC = "/v1.0/card/instances/callback"
BUTTON_TEMPLATE = "tpl-buttons.schema"


@dataclass
class Sent:
    """A robot message as the user sees it."""

    chat_id: str
    key: str
    param: dict[str, Any]
    query_key: str

    @property
    def text(self) -> str:
        return str(self.param.get("text") or self.param.get("content") or "")


@dataclass
class Card:
    """An interactive card as the user sees it: its text now, how often it changed, finalised."""

    chat_id: str
    key: str
    text: str
    updates: int = 0
    final: bool = False
    shown: list[str] = field(default_factory=list)
    """Every text the card showed, in order (a secret must never be in any of them)."""
    buttons: list[dict[str, Any]] = field(default_factory=list)
    """A buttons card's buttons now (``text``, ``color``, ``value``); empty once withdrawn."""


class FakeDingTalk:
    platform = "dingtalk"

    def __init__(self, client_id: str = "dingfakeclientid0001",
                 client_secret: str = "FakeDingTalkClientSecret_0123456789abcdef") -> None:  # fmt: skip
        self.client_id = client_id
        self.client_secret = client_secret
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count(1)
        self.calls: list[str] = []
        self.tokens: set[str] = set()
        self.token_requests = 0
        self.opens = 0
        self.revoked = False
        self.half_open = False
        self.ws: web.WebSocketResponse | None = None
        """The newest connection (system frames and :meth:`drop` go to it)."""
        self.connections = 0
        self.live: list[web.WebSocketResponse] = []
        """The open connections, oldest first; a message goes to one of them in turn."""
        self.given: dict[str, int] = {}
        """Message id -> the number (1, 2, …, in order of connecting) of the connection that has it."""
        self.deliveries: list[tuple[str, int]] = []
        """Every (message id, connection number) a message frame was sent on, in order."""
        self._serial: dict[int, int] = {}
        self._turn = itertools.count()
        self.subscribed: set[str] = set()
        self.button_template = BUTTON_TEMPLATE
        self.frames: dict[str, dict[str, Any]] = {}
        """Every frame sent, by message id."""
        self.pending: dict[str, dict[str, Any]] = {}
        """Robot message frames not acknowledged yet, in order."""
        self.acks: list[dict[str, Any]] = []
        self.sent: list[Sent] = []
        self.files: dict[str, bytes] = {}
        """Files users sent, by download code."""
        self.uploads: dict[str, tuple[str, bytes]] = {}
        self.cards: dict[str, Card] = {}
        """Cards the bot created, by outTrackId."""
        """What the bot uploaded: media id -> (file name, bytes)."""
        self._fail: dict[str, list[tuple[int, str, str]]] = {}
        self._tickets: set[str] = set()
        self._transport: asyncio.BaseTransport | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def channel_settings(self) -> dict[str, Any]:
        return {"enabled": True, "client_id": self.client_id, "client_secret": self.client_secret,
                "api_base": self.base_url, "oapi_base": self.base_url, "keepalive": 1}  # fmt: skip

    async def start(self) -> FakeDingTalk:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/connect", self._connect)
        app.router.add_get("/files/{code}", self._file)
        app.router.add_post("/media/upload", self._upload)
        app.router.add_put("/v1.0/card/streaming", self._card_stream)
        app.router.add_put("/v1.0/card/instances", self._card_update)
        app.router.add_post("/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[union-attr]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- scripting -------------------------------------------------------------------------------
    def message(self, chat: str, sender: str, text: str, *, group: bool = False, at: bool = True,
                **extra: Any) -> dict[str, Any]:  # fmt: skip
        """A robot message's data; ``chat`` is a group's conversation id or (1:1) unused."""
        return {
            "conversationId": chat if group else f"cid1to1{sender}",
            "conversationType": "2" if group else "1",
            "msgId": f"msg{next(self._ids)}{uuid.uuid4().hex[:8]}",
            "senderStaffId": sender,
            "senderId": f"$:LWCP_v1:${sender}",
            "senderNick": sender.title(),
            "chatbotUserId": "$:LWCP_v1:$robot",
            "robotCode": self.client_id,
            "isInAtList": at if group else None,
            "conversationTitle": "Team" if group else None,
            "createAt": int(time.time() * 1000),
            "sessionWebhook": "https://oapi.invalid/robot/sendBySession?session=x",
            "sessionWebhookExpiredTime": int(time.time() * 1000) + 5_400_000,
            "msgtype": "text",
            "text": {"content": f" {text}"},
            **extra,
        }

    async def inject_text(self, chat: str, sender: str, text: str, **kw: Any) -> dict[str, Any]:
        data = self.message(chat, sender, text, **kw)
        await self.inject(data)
        return data

    async def inject(self, data: Any, *, topic: str = ROBOT_TOPIC, kind: str = "CALLBACK",
                     mid: str | None = None) -> str:  # fmt: skip
        """A frame carrying ``data`` (JSON-encoded unless already a string); kept until acked."""
        mid = mid or f"frame-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        raw = data if isinstance(data, str) else json.dumps(data)
        frame = {"specVersion": "1.0", "type": kind, "headers": {
            "appId": "fakeapp", "connectionId": "c", "contentType": "application/json",
            "messageId": mid, "time": str(int(time.time() * 1000)), "topic": topic}, "data": raw}  # fmt: skip
        self.frames[mid] = frame
        if kind == "CALLBACK" and topic in (ROBOT_TOPIC, CARD_TOPIC):
            self.pending[mid] = frame
        if kind == "CALLBACK" and topic == CARD_TOPIC and CARD_TOPIC not in self.subscribed:
            return mid  # DingTalk sends a topic only to a connection that subscribed to it
        if mid in self.pending:
            await self._give(mid)
        else:
            await self.send_frame(frame)
        return mid

    async def send_frame(self, frame: Any) -> None:
        if self.ws is not None and not self.ws.closed and not self.half_open:
            await self.ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))

    async def redeliver(self, mid: str) -> None:
        """The same frame once more (DingTalk retrying a frame whose ack it did not see), on the
        connection that had it while that one is open."""
        held = next((ws for ws in self._open() if self._serial[id(ws)] == self.given.get(mid)), None)
        if held is None or self.half_open:
            await self.send_frame(self.frames[mid])
        else:
            await self._send_on(held, mid)

    def _open(self) -> list[web.WebSocketResponse]:
        return [ws for ws in self.live if not ws.closed]

    async def _give(self, mid: str, avoid: web.WebSocketResponse | None = None) -> None:
        """Send message ``mid`` on one open connection, the next in turn (DingTalk hands a message
        to one client of the app); with none open it waits for the next to connect."""
        conns = [ws for ws in self._open() if ws is not avoid]
        if not conns or self.half_open:
            return
        await self._send_on(conns[next(self._turn) % len(conns)], mid)

    async def _send_on(self, ws: web.WebSocketResponse, mid: str) -> None:
        self.given[mid] = self._serial[id(ws)]
        self.deliveries.append((mid, self._serial[id(ws)]))
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_str(json.dumps(self.frames[mid]))

    async def system(self, topic: str, data: dict[str, Any] | None = None) -> str:
        return await self.inject(data or {}, topic=topic, kind="SYSTEM")

    async def drop(self) -> None:
        """Close the websocket without a close frame (the network broke)."""
        transport, self.ws = self._transport, None
        if transport is not None:
            transport.abort()

    async def press(self, card: str, user: str, index: int = 0, *, value: str | None = None,
                    space: tuple[str, str] | None = None, **override: Any) -> str:  # fmt: skip
        """``user`` presses button ``index`` of ``card`` (or one carrying ``value``) where the card
        is (``space``: another ``(spaceType, spaceId)``); ``override`` replaces callback fields."""
        shown = self.cards[card]
        if value is None:
            value = str(shown.buttons[index]["value"])
        group = shown.chat_id.startswith("cid")
        kind, where = space or (("IM_GROUP", shown.chat_id) if group else ("IM_ROBOT", f"robot-{user}"))
        content = {"cardPrivateData": {"actionIds": [f"button{index}"], "params": {"value": value}}}
        data = {"type": "actionCallback", "corpId": "dingcorpfake", "outTrackId": card, "userId": user,
                "userIdType": 1, "spaceType": kind, "spaceId": where, "extension": "{}",
                "content": json.dumps(content)}  # fmt: skip
        data.update(override)
        return await self.inject(data, topic=CARD_TOPIC)

    def revoke(self) -> None:
        """The app's secret is reset: open and token calls are refused, issued tokens too."""
        self.revoked = True
        self.tokens.clear()

    def fail_next(self, kind: str, status: int, code: str, message: str = "scripted failure") -> None:
        """The next call of ``kind`` (``send``, ``token``, ``open``, ``download``) answers ``status``
        ``code`` with ``message``."""
        self._fail.setdefault(kind, []).append((status, code, message))

    # -- reading ---------------------------------------------------------------------------------
    def acked(self, mid: str) -> bool:
        return any(a.get("headers", {}).get("messageId") == mid for a in self.acks)

    def open_connections(self) -> list[int]:
        """The numbers of the connections open now, oldest first."""
        return [self._serial[id(ws)] for ws in self._open()]

    def messages_to(self, chat: str) -> list[Sent]:
        return [m for m in self.sent if m.chat_id == chat]

    async def wait_for(self, check: Callable[[], T | None], timeout: float = 15, what: str = "") -> T:
        found: T = await poll(check, timeout, what, lambda: [m.text for m in self.sent][-5:], every=0.05)
        return found

    # -- server ----------------------------------------------------------------------------------
    async def _connect(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("ticket") not in self._tickets:
            return _error(401, "invalidTicket", "ticket is invalid")
        ws = web.WebSocketResponse(autoping=False, max_msg_size=16 * 1024 * 1024)
        await ws.prepare(request)
        self._transport = request.transport
        self.ws, self.connections = ws, self.connections + 1
        self._serial[id(ws)] = self.connections
        holding = {self._serial[id(c)] for c in self._open()}
        self.live.append(ws)
        for mid in list(self.pending):  # those no open connection has: this one gets them
            if self.given.get(mid) not in holding and not self.half_open:
                await self._send_on(ws, mid)
        try:
            async for msg in ws:
                if msg.type == WSMsgType.PING:
                    if not self.half_open:
                        await ws.pong(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    ackd = json.loads(msg.data)
                    self.acks.append(ackd)
                    self.pending.pop(ackd.get("headers", {}).get("messageId", ""), None)
        finally:
            self.live.remove(ws)
            if self.ws is ws:
                self.ws = None
            mine = self._serial[id(ws)]
            for mid in [m for m in self.pending if self.given.get(m) == mine]:
                await self._give(mid, avoid=ws)  # unacknowledged: another client gets it
        return ws

    async def _file(self, request: web.Request) -> web.StreamResponse:
        data = self.files.get(request.match_info["code"])
        return web.Response(body=data) if data is not None else web.Response(status=404)

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        """The older API's upload: token in the query, errors as ``{"errcode", "errmsg"}``."""
        self.calls.append("/media/upload")
        if request.query.get("access_token") not in self.tokens:
            return web.json_response({"errcode": 40014, "errmsg": "不合法的access_token"})
        form = await request.post()
        media = form.get("media")
        if not isinstance(media, web.FileField) or form.get("type") not in (
            "image",
            "file",
            "voice",
            "video",
        ):
            return web.json_response({"errcode": 40035, "errmsg": "缺少参数 media"})
        media_id = f"@media{next(self._ids)}"
        self.uploads[media_id] = (media.filename, media.file.read())
        return web.json_response(
            {"errcode": 0, "errmsg": "ok", "media_id": media_id, "type": form.get("type")}
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        self.calls.append(path)
        body = await request.json()
        if path == "/v1.0/gateway/connections/open":
            self.opens += 1
            if failure := self._take("open"):
                return failure
            if (
                self.revoked
                or body.get("clientId") != self.client_id
                or body.get("clientSecret") != self.client_secret
            ):
                return _error(401, "authFailed", "鉴权失败")
            ticket = uuid.uuid4().hex
            self._tickets.add(ticket)
            subs = body.get("subscriptions") or []
            self.subscribed = {str(x.get("topic")) for x in subs if isinstance(x, dict)}
            return web.json_response({"endpoint": f"ws://127.0.0.1:{self.port}/connect", "ticket": ticket})
        if path == "/v1.0/oauth2/accessToken":
            self.token_requests += 1
            if failure := self._take("token"):
                return failure
            if (
                self.revoked
                or body.get("appKey") != self.client_id
                or body.get("appSecret") != self.client_secret
            ):
                return _error(400, "invalidClientSecret", "app secret is invalid")
            token = f"tok{uuid.uuid4().hex}"
            self.tokens.add(token)
            return web.json_response({"accessToken": token, "expireIn": 7200})
        if request.headers.get("x-acs-dingtalk-access-token") not in self.tokens:
            return _error(401, "InvalidAuthentication", "access token is invalid")
        if path in ("/v1.0/robot/oToMessages/batchSend", "/v1.0/robot/groupMessages/send"):
            return await self._send(path, body)
        if path == "/v1.0/card/instances/createAndDeliver":
            return self._card_create(body)
        if path == "/v1.0/robot/messageFiles/download":
            if failure := self._take("download"):
                return failure
            code = body.get("downloadCode")
            if code not in self.files:
                return _error(400, "invalidDownloadCode", "download code is invalid")
            return web.json_response({"downloadUrl": f"{self.base_url}/files/{code}"})
        return _error(404, "notFound", "unknown api")

    async def _send(self, path: str, body: dict[str, Any]) -> web.StreamResponse:
        if failure := self._take("send"):
            return failure
        if body.get("robotCode") != self.client_id:
            return _error(400, "robotNotExist", "robot does not exist")
        if len(str(body.get("msgParam", "")).encode()) > 15_000:  # groupMessages/send's documented limit
            return _error(400, "invalidParameter.msgParam.length", "msgParam is longer than 15000 bytes")
        try:
            param = json.loads(body["msgParam"])
        except (KeyError, TypeError, ValueError):
            return _error(400, "invalidParameter", "msgParam is invalid")
        key = f"pq{next(self._ids)}"
        if path.endswith("batchSend"):
            users = body.get("userIds") or []
            for user in users:
                self.sent.append(Sent(user, str(body.get("msgKey")), param, key))
            return web.json_response({"processQueryKey": key, "invalidStaffIdList": [],
                                      "flowControlledStaffIdList": []})  # fmt: skip
        self.sent.append(Sent(str(body.get("openConversationId")), str(body.get("msgKey")), param, key))
        return web.json_response({"processQueryKey": key})

    def _card_create(self, body: dict[str, Any]) -> web.StreamResponse:
        out, space = str(body.get("outTrackId") or ""), str(body.get("openSpaceId") or "")
        params = dict((body.get("cardData") or {}).get("cardParamMap") or {})
        buttons: list[dict[str, Any]] = []
        if body.get("cardTemplateId") == self.button_template:
            try:
                buttons = json.loads(params.pop("buttons"))
            except (KeyError, TypeError, ValueError):
                return _error(400, "invalidParameter", "the template's buttons variable is missing")
            if not isinstance(buttons, list) or not all(
                isinstance(b, dict) and isinstance(b.get("text"), str) and isinstance(b.get("value"), str)
                for b in buttons
            ):
                return _error(400, "invalidParameter", "the buttons variable is not a list of buttons")
        if (
            not body.get("cardTemplateId")
            or not out
            or not space.startswith("dtv1.card//")
            or len(params) != 1
            or not all(isinstance(v, str) for v in params.values())  # cardParamMap holds strings
        ):
            return _error(400, "invalidParameter", "card parameters are invalid")
        if out in self.cards:
            return _error(400, "outTrackIdExists", "outTrackId already exists")
        kind, _, chat = space.removeprefix("dtv1.card//").partition(".")
        deliver = (
            body.get("imGroupOpenDeliverModel" if kind == "IM_GROUP" else "imRobotOpenDeliverModel") or {}
        )
        if kind not in ("IM_GROUP", "IM_ROBOT") or deliver.get("robotCode") != self.client_id:
            return _error(400, "invalidParameter", "deliver model is invalid")
        key, text = next(iter(params.items()))
        self.cards[out] = Card(chat, key, str(text), shown=[str(text)], buttons=buttons)
        return web.json_response({"success": True, "result": {"outTrackId": out}})

    async def _card_call(
        self, request: web.Request, path: str
    ) -> tuple[dict[str, Any], Card] | web.StreamResponse:
        """A call on an existing card: recorded, its token checked, its body and card; or the
        error DingTalk answers (401 for a bad token, ``cardNotExist``)."""
        self.calls.append(path)
        if request.headers.get("x-acs-dingtalk-access-token") not in self.tokens:
            return _error(401, "InvalidAuthentication", "access token is invalid")
        body = await request.json()
        card = self.cards.get(str(body.get("outTrackId")))
        if card is None:
            return _error(400, "cardNotExist", "card does not exist")
        return body, card

    async def _card_update(self, request: web.Request) -> web.StreamResponse:
        """``PUT /v1.0/card/instances``: the given variables replaced (``updateCardDataByKey``)."""
        found = await self._card_call(request, "/v1.0/card/instances")
        if isinstance(found, web.StreamResponse):
            return found
        body, card = found
        params = (body.get("cardData") or {}).get("cardParamMap")
        if not isinstance(params, dict) or not all(isinstance(v, str) for v in params.values()):
            return _error(400, "invalidParameter", "cardParamMap is invalid")
        if card.key in params:
            card.text, card.updates = params[card.key], card.updates + 1
            card.shown.append(card.text)
        if "buttons" in params:
            card.buttons = json.loads(params["buttons"])
        return web.json_response({"success": True})

    async def _card_stream(self, request: web.Request) -> web.StreamResponse:
        found = await self._card_call(request, "/v1.0/card/streaming")
        if isinstance(found, web.StreamResponse):
            return found
        body, card = found
        if card.final:
            return _error(400, "cardFinalized", "the card's streaming is finished")
        if body.get("key") != card.key or not body.get("guid") or body.get("isFull") is not True:
            return _error(400, "invalidParameter", "streaming parameters are invalid")
        card.text, card.updates, card.final = (
            str(body.get("content")),
            card.updates + 1,
            bool(body.get("isFinalize")),
        )
        card.shown.append(card.text)
        return web.json_response({"success": True})

    def _take(self, kind: str) -> web.StreamResponse | None:
        queue = self._fail.get(kind)
        if not queue:
            return None
        status, code, message = queue.pop(0)
        return _error(status, code, message)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"requestid": uuid.uuid4().hex.upper(), "code": code, "message": message},
                             status=status)  # fmt: skip
