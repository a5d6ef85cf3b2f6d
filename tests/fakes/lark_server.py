"""A fake Feishu/Lark open platform for driving the real lark-oapi SDK offline.

It speaks what lark-oapi 1.7.5 uses (see docs/platforms.md): the long-connection endpoint
(``POST /callback/ws/endpoint``), a websocket carrying binary protobuf ``pbbp2.Frame`` frames (ping/pong
control frames, ``im.message.receive_v1`` event data frames, the client's ``{"code":200}`` acks) and
the im.v1 REST API the adapter calls. It runs aiohttp in its **own thread with its own event loop**:
lark-oapi makes blocking ``requests`` calls, so a fake on the caller's loop would deadlock it.

Events go to the newest live connection; one injected while none is live (or while the only one is
stalled) waits for the next connection. Like the platform, the fake does not re-send an event on its
own after a 500 ack: a test calls ``redeliver``.

Everything the user would see is recorded (bot messages per chat with their current content, the
uploads, reactions) plus what the platform sees (acks per event). ``wait_for`` is thread-safe, so an
end-to-end test whose daemon is a subprocess can use the fake too.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from aiohttp import WSMsgType, web
from lark_oapi.ws.pb.pbbp2_pb2 import Frame

T = TypeVar("T")

_BOT_APP_ID_SENDER = "app"


@dataclass
class FakeMessage:
    """A message as the chat shows it. ``content`` is the platform's JSON string, current version."""

    message_id: str
    chat_id: str
    msg_type: str
    content: str
    sender: str  # an open_id, or "app" for the bot
    parent_id: str | None = None
    root_id: str | None = None
    thread_id: str | None = None
    uuid: str | None = None
    history: list[str] = field(default_factory=list)  # earlier contents, oldest first
    create_time: int = field(default_factory=lambda: int(time.time() * 1000))  # ms, as Lark says
    sender_name: str = ""

    @property
    def edits(self) -> int:
        return len(self.history)

    def buttons(self) -> list[dict[str, Any]]:
        """The buttons of a card as it shows now (anywhere in its elements, columns included)."""
        try:
            data = json.loads(self.content)
        except ValueError:
            return []
        found: list[dict[str, Any]] = []

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                if node.get("tag") == "button":
                    found.append(node)
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for item in node:
                    walk(item)

        walk(data.get("body") if self.msg_type == "interactive" else None)
        return found

    @property
    def text(self) -> str:
        """What the user reads: a card's markdown elements joined, a text's text, a file's name."""
        try:
            data = json.loads(self.content)
        except ValueError:
            return self.content
        if self.msg_type == "interactive":
            elements = (data.get("body") or {}).get("elements") or data.get("elements") or []
            return "\n".join(str(e.get("content", "")) for e in elements if isinstance(e, dict))
        if self.msg_type == "text":
            return str(data.get("text", ""))
        if self.msg_type == "file":
            return f"[file {data.get('file_key')}]"
        if self.msg_type == "image":
            return f"[image {data.get('image_key')}]"
        if self.msg_type == "audio":
            return f"[audio {data.get('file_key')}]"
        return self.content


class Injected(NamedTuple):
    """What ``inject_*`` returns: the delivery's event id (acks, redelivery) and the message id."""

    event_id: str
    message_id: str


@dataclass
class Ack:
    event_id: str  # the frame's message_id header (one per event delivery)
    code: int
    at: float
    data: Any = None
    """The handler's answer carried in the ack (base64 JSON decoded): a card callback's toast."""


@dataclass
class _Event:
    event_id: str
    payload: bytes
    message_id: str
    headers: dict[str, str | None] | None = None
    """Frame headers to change (None: leave the header out), for malformed frames."""


@dataclass
class _Failure:
    method: str
    path: re.Pattern[str]
    status: int
    code: int
    msg: str
    headers: dict[str, str]
    times: int


class _Conn:
    def __init__(self, ws: web.WebSocketResponse, request: web.Request, service_id: int) -> None:
        self.ws = ws
        self.request = request
        self.service_id = service_id
        self.stalled = False


class FakeLark:
    """The fake platform. ``start()`` it, point the SDK's ``domain`` at :attr:`base_url`."""

    platform = "lark"
    """The channel name in the config and in user ids (``lark:<id>``)."""

    def __init__(
        self,
        *,
        app_id: str = "cli_fake",
        app_secret: str = "fake-secret",
        bot_open_id: str = "ou_bot",
        bot_name: str = "Chital",
        ping_interval: int = 30,
        reconnect_interval: int = 1,
    ) -> None:
        self.app_id, self.app_secret = app_id, app_secret
        self.bot_open_id, self.bot_name = bot_open_id, bot_name
        self.ping_interval, self.reconnect_interval = ping_interval, reconnect_interval
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        # platform state (guarded by _cond)
        self.messages: dict[str, FakeMessage] = {}  # every message, user's and bot's, by id
        self.acks: list[Ack] = []
        self.uploads: dict[str, tuple[str, bytes]] = {}  # image_key/file_key -> (name, data)
        self.upload_fields: dict[str, dict[str, str]] = {}
        """Each upload's other form fields (``file_type``, ``duration``, ``file_name``), by key."""
        self.resources: dict[tuple[str, str], tuple[str, bytes]] = {}  # (message_id, key) -> file
        self.reactions: list[tuple[str, str]] = []  # (message_id, emoji_type)
        self.requests: list[tuple[str, str]] = []  # (method, path) of every REST call
        self.endpoint_calls = 0
        self.connections = 0  # websocket connections accepted so far
        self.pings = 0
        self._events: dict[str, _Event] = {}
        self._pending: list[str] = []  # event ids waiting for a live connection
        self._conns: list[_Conn] = []
        self._uuids: dict[str, str] = {}
        self._failures: list[_Failure] = []
        self._endpoint_error: int | None = None
        self._token = "t-" + hashlib.sha256(f"{app_id}:{app_secret}".encode()).hexdigest()[:24]

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FakeLark:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="fake-lark", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake lark did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FakeLark:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def channel_settings(self, liveness_timeout: float = 6) -> dict[str, Any]:
        """``channels.lark`` of a config that talks to this fake: the one factory the tests share
        (its app credentials, its address, a liveness timeout short enough for the outage tests)."""
        return {
            "enabled": True,
            "app_id": self.app_id,
            "app_secret": self.app_secret,
            "domain": self.base_url,
            "liveness_timeout": liveness_timeout,
        }

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/callback/ws/endpoint", self._endpoint)
        app.router.add_get("/ws", self._ws)
        app.router.add_post("/open-apis/auth/v3/tenant_access_token/internal", self._token_api)
        app.router.add_post("/open-apis/auth/v3/app_access_token/internal", self._token_api)
        app.router.add_route("*", "/open-apis/{tail:.*}", self._api)
        self._runner = web.AppRunner(app)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                conn.request.transport.abort()  # type: ignore[union-attr]
        if self._runner is not None:
            await self._runner.cleanup()

    def _call(self, coro_fn: Callable[[], Any]) -> Any:
        """Run ``coro_fn()`` on the fake's loop from any thread and wait for it."""
        if self._loop is None:
            raise RuntimeError("fake lark not started")

        async def wrapper() -> Any:
            return await coro_fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self._loop).result(10)

    # -- waiting -----------------------------------------------------------------------------
    def wait_for(self, predicate: Callable[[FakeLark], T], timeout: float = 10.0) -> T:
        """Block until ``predicate(self)`` is truthy (re-checked on every state change); return it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(self)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("condition not met in time")
                self._cond.wait(min(left, 0.5))

    async def wait_connected(self, timeout: float = 15.0) -> None:
        """Until the SDK holds a websocket to this fake (a daemon's Lark channel is up)."""
        await self.wait_for_async(lambda f: f.live_connections >= 1 or None, timeout=timeout)

    async def wait_for_async(self, predicate: Callable[[FakeLark], T], timeout: float = 10.0) -> T:
        """``wait_for`` for coroutines: never blocks the caller's event loop."""
        return await asyncio.to_thread(self.wait_for, predicate, timeout)

    def _changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- what the user sees ------------------------------------------------------------------
    def bot_messages(self, chat_id: str | None = None) -> list[FakeMessage]:
        with self._cond:
            return [
                m
                for m in self.messages.values()
                if m.sender == _BOT_APP_ID_SENDER and (chat_id is None or m.chat_id == chat_id)
            ]

    def acks_for(self, event: Injected | str) -> list[int]:
        event_id = event.event_id if isinstance(event, Injected) else event
        with self._cond:
            return [a.code for a in self.acks if a.event_id == event_id]

    @property
    def live_connections(self) -> int:
        with self._cond:
            return sum(1 for c in self._conns if not c.stalled and not c.ws.closed)

    # -- injecting user activity -------------------------------------------------------------
    def inject_message(
        self,
        chat_id: str,
        sender_open_id: str,
        text: str,
        *,
        chat_type: str = "p2p",
        mention_bot: bool = False,
        message_id: str | None = None,
        thread_id: str | None = None,
        mentions: list[tuple[str, str]] | None = None,
        parent_id: str | None = None,
        sender_name: str = "",
    ) -> Injected:
        """A user posts ``text``. With ``mention_bot`` the text starts with the bot's @-placeholder.
        ``mentions`` adds other users as (open_id, name); their placeholders are appended to the text.
        Returns the event id (the frame's message_id header, what acks refer to) and message id."""
        ments: list[dict[str, Any]] = []
        if mention_bot:
            ments.append(self._mention(len(ments) + 1, self.bot_open_id, self.bot_name))
            text = f"@_user_{len(ments)} {text}"
        for open_id, name in mentions or []:
            ments.append(self._mention(len(ments) + 1, open_id, name))
            text = f"{text} @_user_{len(ments)}"
        return self.inject_event(
            chat_id,
            sender_open_id,
            "text",
            {"text": text},
            chat_type=chat_type,
            message_id=message_id,
            thread_id=thread_id,
            mentions=ments,
            parent_id=parent_id,
            sender_name=sender_name,
        )

    def inject_file(
        self,
        chat_id: str,
        sender_open_id: str,
        name: str,
        data: bytes,
        *,
        image: bool = False,
        audio: bool = False,
        chat_type: str = "p2p",
    ) -> Injected:
        """A user sends a file (or an image, or a voice message: ``audio``); its bytes become
        downloadable as a message resource."""
        key = f"{'img' if image else 'file'}_v3_{next(self._ids)}"
        message_id = f"om_{next(self._ids):08d}"
        with self._cond:
            self.resources[(message_id, key)] = (name, data)
        content: dict[str, Any] = {"image_key": key} if image else {"file_key": key, "file_name": name}
        if audio:
            content = {"file_key": key, "duration": 2000}  # a recorded voice message has no name
        return self.inject_event(
            chat_id,
            sender_open_id,
            "image" if image else "audio" if audio else "file",
            content,
            chat_type=chat_type,
            message_id=message_id,
        )

    def inject_event(
        self,
        chat_id: str,
        sender_open_id: str,
        msg_type: str,
        content: dict[str, Any] | str,
        *,
        chat_type: str = "p2p",
        message_id: str | None = None,
        thread_id: str | None = None,
        mentions: list[dict[str, Any]] | None = None,
        mutate: Callable[[dict[str, Any]], None] | None = None,
        parent_id: str | None = None,
        sender_name: str = "",
    ) -> Injected:
        """A user's message event. ``content`` as a str is sent as it is (not even valid JSON, if
        so given); ``mutate`` may break the event body before it is sent (drop the sender ...)."""
        message_id = message_id or f"om_{next(self._ids):08d}"
        event_id = f"ev_{next(self._ids):08d}"
        now_ms = str(int(time.time() * 1000))
        body = {
            "schema": "2.0",
            "header": {
                "event_id": event_id,
                "event_type": "im.message.receive_v1",
                "create_time": now_ms,
                "token": "",
                "app_id": self.app_id,
                "tenant_key": "tenant_fake",
            },
            "event": {
                "sender": {
                    "sender_id": {
                        "open_id": sender_open_id,
                        "union_id": "on_" + sender_open_id,
                        "user_id": None,
                    },
                    "sender_type": "user",
                    "tenant_key": "tenant_fake",
                },
                "message": {
                    "message_id": message_id,
                    "root_id": self._root_of(parent_id) or (thread_id and f"om_root_{thread_id}"),
                    "parent_id": parent_id,
                    "create_time": now_ms,
                    "update_time": now_ms,
                    "chat_id": chat_id,
                    "thread_id": thread_id,
                    "chat_type": chat_type,
                    "message_type": msg_type,
                    "content": content
                    if isinstance(content, str)
                    else json.dumps(content, ensure_ascii=False),
                    "mentions": mentions or None,
                },
            },
        }
        with self._cond:
            self.messages[message_id] = FakeMessage(
                message_id,
                chat_id,
                msg_type,
                body["event"]["message"]["content"],
                sender_open_id,
                parent_id=parent_id,
                root_id=body["event"]["message"]["root_id"],
                thread_id=thread_id,
                create_time=int(now_ms),
                sender_name=sender_name,
            )
        if mutate is not None:
            mutate(body)
        return self.inject_payload(json.dumps(body).encode(), event_id=event_id, message_id=message_id)

    def p2p_chat(self, open_id: str) -> str:
        """The chat id of ``open_id``'s one-to-one chat with the bot (``oc_p2p_<open_id without ou_>``)."""
        return f"oc_p2p_{open_id.removeprefix('ou_')}"

    def inject_menu(
        self, open_id: str, event_key: Any, *, mutate: Callable[[dict[str, Any]], None] | None = None
    ) -> Injected:
        """``open_id`` picks the custom-menu entry whose ``event_key`` is given: an
        ``application.bot.menu_v6`` event as Lark sends it (``mutate`` may break it first)."""
        event_id = f"ev_{next(self._ids):08d}"
        body: dict[str, Any] = {
            "schema": "2.0",
            "header": {"event_id": event_id, "event_type": menu_event_type(), "create_time": str(int(time.time() * 1000)),
                       "token": "", "app_id": self.app_id, "tenant_key": "tenant_fake"},
            "event": {"operator": {"operator_name": "Menu User",
                                   "operator_id": {"open_id": open_id, "union_id": "on_" + open_id, "user_id": None}},
                      "event_key": event_key, "timestamp": int(time.time())},
        }  # fmt: skip
        if mutate is not None:
            mutate(body)
        return self.inject_payload(json.dumps(body).encode(), event_id=event_id)

    def inject_payload(
        self, payload: bytes, *, event_id: str | None = None, message_id: str = ""
    ) -> Injected:
        """Deliver an event frame whose payload is exactly ``payload`` (malformed ones included)."""
        event_id = event_id or f"ev_{next(self._ids):08d}"
        with self._cond:
            self._events[event_id] = _Event(event_id, payload, message_id)
        self._call(lambda: self._deliver(event_id))
        return Injected(event_id, message_id)

    def inject_frame(self, payload: bytes, headers: dict[str, str | None]) -> Injected:
        """Deliver an event frame with ``headers`` changed (``{"type": "card"}``, ``{"sum": None}``
        drops the header): the frames lark-oapi itself cannot take."""
        event_id = f"ev_{next(self._ids):08d}"
        with self._cond:
            self._events[event_id] = _Event(event_id, payload, "", headers)
        self._call(lambda: self._deliver(event_id))
        return Injected(event_id, "")

    def card_press_body(self, message_id: str, chat_id: str, open_id: str, value: Any) -> dict[str, Any]:
        """A ``card.action.trigger`` event body (not sent), for tests to break and send with
        :meth:`inject_payload`."""
        event_id = f"ev_{next(self._ids):08d}"
        return {
            "schema": "2.0",
            "header": {"event_id": event_id, "token": "", "create_time": str(int(time.time() * 1e6)),
                       "event_type": "card.action.trigger", "tenant_key": "tenant_fake", "app_id": self.app_id},
            "event": {
                "operator": {"tenant_key": "tenant_fake", "user_id": None, "open_id": open_id,
                             "union_id": "on_" + open_id},
                "token": f"c-{event_id}",
                "action": {"value": value, "tag": "button"},
                "host": "im_message",
                "context": {"open_message_id": message_id, "open_chat_id": chat_id},
            },
        }  # fmt: skip

    def press_button(self, message_id: str, open_id: str, label: str) -> Injected:
        """``open_id`` presses the card button labelled ``label`` (or containing it): a
        ``card.action.trigger`` callback over the long connection (an event frame), carrying the
        button's callback value; the bot's toast comes back in the ack (:meth:`ack_data`)."""
        msg = self.messages[message_id]
        button = next((b for b in msg.buttons() if label in b["text"]["content"]), None)
        if button is None:
            raise AssertionError(f"no button {label!r} on {message_id}")
        value = next(b["value"] for b in button.get("behaviors", []) if b.get("type") == "callback")
        event_id = f"ev_{next(self._ids):08d}"
        body = {
            "schema": "2.0",
            "header": {"event_id": event_id, "token": "", "create_time": str(int(time.time() * 1e6)),
                       "event_type": "card.action.trigger", "tenant_key": "tenant_fake", "app_id": self.app_id},
            "event": {
                "operator": {"tenant_key": "tenant_fake", "user_id": None, "open_id": open_id,
                             "union_id": "on_" + open_id},
                "token": f"c-{event_id}",
                "action": {"value": value, "tag": "button"},
                "host": "im_message",
                "context": {"open_message_id": message_id, "open_chat_id": msg.chat_id},
            },
        }  # fmt: skip
        return self.inject_payload(json.dumps(body).encode(), event_id=event_id, message_id=message_id)

    def ack_data(self, event: Injected | str) -> Any:
        """What the bot answered in its ack of ``event`` (the last delivery's), or None."""
        event_id = event.event_id if isinstance(event, Injected) else event
        with self._cond:
            return next((a.data for a in reversed(self.acks) if a.event_id == event_id), None)

    def redeliver(self, event: Injected | str) -> None:
        """The platform delivers the same event (same event and message id) once more."""
        event_id = event.event_id if isinstance(event, Injected) else event
        self._call(lambda: self._deliver(event_id))

    def _root_of(self, parent_id: str | None) -> str | None:
        parent = self.messages.get(parent_id or "")
        return (parent.root_id or parent.message_id) if parent else None

    def _mention(self, n: int, open_id: str, name: str) -> dict[str, Any]:
        return {
            "key": f"@_user_{n}",
            "id": {"open_id": open_id, "union_id": "on_" + open_id, "user_id": None},
            "name": name,
            "tenant_key": "tenant_fake",
        }

    async def _deliver(self, event_id: str) -> None:
        conn = next((c for c in reversed(self._conns) if not c.stalled and not c.ws.closed), None)
        if conn is None:
            self._pending.append(event_id)
            return
        ev = self._events[event_id]
        frame = Frame()
        frame.SeqID, frame.LogID, frame.service, frame.method = 0, 0, conn.service_id, 1
        headers: dict[str, str | None] = {
            "type": "event", "message_id": event_id, "trace_id": "trace-" + event_id, "sum": "1", "seq": "0",
            **(ev.headers or {}),
        }  # fmt: skip
        for k, v in headers.items():
            if v is None:
                continue
            h = frame.headers.add()
            h.key, h.value = k, v
        frame.payload = ev.payload
        try:
            await conn.ws.send_bytes(frame.SerializeToString())
        except Exception:
            self._pending.append(event_id)

    # -- breaking things ---------------------------------------------------------------------
    def drop_connection(self, mode: str = "close") -> None:
        """``close``: websocket close frame; ``abort``: TCP abort; ``stall``: half-open (the server
        stops reading, answering pings and sending, but keeps the socket)."""
        if mode not in ("close", "abort", "stall"):
            raise ValueError(mode)

        async def drop() -> None:
            for conn in list(self._conns):
                if mode == "close":
                    await conn.ws.close()
                elif mode == "abort":
                    conn.request.transport.abort()  # type: ignore[union-attr]
                else:
                    conn.stalled = True
                    conn.request.transport.pause_reading()  # type: ignore[union-attr]
            self._changed()

        self._call(drop)

    def endpoint_error(self, code: int | None) -> None:
        """Make the endpoint answer ``{"code": code}`` (None: back to normal). lark-oapi treats 1 and
        1000040343 as retryable server errors and any other code as a client error that, during a
        reconnect, ends its client for good."""
        with self._cond:
            self._endpoint_error = code

    def fail_next(
        self,
        method: str,
        path: str,
        *,
        status: int = 500,
        code: int = 1,
        msg: str = "injected",
        times: int = 1,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The next ``times`` REST calls matching ``method`` and the ``path`` regex fail."""
        with self._cond:
            self._failures.append(
                _Failure(method.upper(), re.compile(path), status, code, msg, headers or {}, times)
            )

    def rate_limit_next(self, method: str, path: str, *, reset: int = 2, times: int = 1) -> None:
        """The platform's frequency limit: HTTP 429, code 99991400, x-ogw-ratelimit-reset."""
        self.fail_next(
            method,
            path,
            status=429,
            code=99991400,
            msg="request trigger frequency limit",
            times=times,
            headers={"x-ogw-ratelimit-reset": str(reset)},
        )

    # -- long connection ---------------------------------------------------------------------
    async def _endpoint(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._cond:
            self.endpoint_calls += 1
            err = self._endpoint_error
        self._changed()
        if body.get("AppID") != self.app_id or body.get("AppSecret") != self.app_secret:
            return web.json_response({"code": 1000040344, "msg": "invalid app credentials"})
        if err is not None:
            return web.json_response({"code": err, "msg": "injected endpoint error"})
        service_id = next(self._ids)
        url = f"ws://127.0.0.1:{self.port}/ws?device_id=dev{service_id}&service_id={service_id}"
        return web.json_response(
            {
                "code": 0,
                "msg": "ok",
                "data": {
                    "URL": url,
                    "ClientConfig": {
                        "ReconnectCount": -1,
                        "ReconnectInterval": self.reconnect_interval,
                        "ReconnectNonce": 0,
                        "PingInterval": self.ping_interval,
                    },
                },
            }
        )

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        conn = _Conn(ws, request, int(request.query.get("service_id", "1")))
        with self._cond:
            self._conns.append(conn)
            self.connections += 1
            pending, self._pending = self._pending, []
        self._changed()
        for event_id in pending:
            await self._deliver(event_id)
        try:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY or conn.stalled:
                    continue
                frame = Frame()
                frame.ParseFromString(msg.data)
                headers = {h.key: h.value for h in frame.headers}
                if frame.method == 0 and headers.get("type") == "ping":
                    with self._cond:
                        self.pings += 1
                    pong = Frame()
                    pong.SeqID, pong.LogID, pong.service, pong.method = 0, 0, conn.service_id, 0
                    h = pong.headers.add()
                    h.key, h.value = "type", "pong"
                    await ws.send_bytes(pong.SerializeToString())
                elif frame.method == 1:
                    answer = json.loads(frame.payload or b"{}")
                    data = json.loads(base64.b64decode(answer["data"])) if answer.get("data") else None
                    with self._cond:
                        self.acks.append(
                            Ack(headers.get("message_id", ""), int(answer.get("code", 0)), time.time(), data)
                        )
                self._changed()
        finally:
            with self._cond:
                if conn in self._conns:
                    self._conns.remove(conn)
            self._changed()
        return ws

    # -- REST --------------------------------------------------------------------------------
    async def _token_api(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._cond:
            self.requests.append((request.method, request.path))
        failure = self._injected_failure(request)  # fail_next("POST", "tenant_access_token") ...
        if failure is not None:
            return failure
        if body.get("app_id") != self.app_id or body.get("app_secret") != self.app_secret:
            return web.json_response({"code": 10014, "msg": "app secret invalid"})
        return web.json_response(
            {
                "code": 0,
                "msg": "ok",
                "tenant_access_token": self._token,
                "app_access_token": self._token,
                "expire": 7200,
            }
        )

    def _injected_failure(self, request: web.Request) -> web.Response | None:
        with self._cond:
            for f in self._failures:
                if f.method == request.method and f.path.search(request.path) and f.times > 0:
                    f.times -= 1
                    return web.json_response(
                        {"code": f.code, "msg": f.msg}, status=f.status, headers=f.headers
                    )
        return None

    async def _api(self, request: web.Request) -> web.StreamResponse:
        with self._cond:
            self.requests.append((request.method, request.path))
        failure = self._injected_failure(request)
        if failure is not None:
            return failure
        if request.headers.get("Authorization") != f"Bearer {self._token}":
            return web.json_response({"code": 99991663, "msg": "Invalid access token"}, status=400)
        path, method = request.path, request.method
        if path == "/open-apis/bot/v3/info" and method == "GET":
            return _ok(
                extra={
                    "bot": {
                        "activate_status": 2,
                        "app_name": self.bot_name,
                        "open_id": self.bot_open_id,
                        "ip_white_list": [],
                    }
                }
            )
        if path == "/open-apis/im/v1/messages" and method == "POST":
            body = await request.json()
            kind, receiver = request.query.get("receive_id_type"), body.get("receive_id", "")
            if kind == "open_id":  # to a person: their one-to-one chat with the bot
                if not str(receiver).startswith("ou_"):
                    return _err(400, 99992361, "open_id cross app")
                return self._create(body, self.p2p_chat(receiver), None)
            if kind != "chat_id":
                return _err(400, 99992402, "field validation failed: receive_id_type")
            return self._create(body, receiver, None)
        if m := re.fullmatch(r"/open-apis/im/v1/messages/([^/]+)/reply", path):
            parent = self.messages.get(m.group(1))
            if parent is None:
                return _err(400, 230001, "message not found")
            return self._create(await request.json(), parent.chat_id, parent)
        if m := re.fullmatch(r"/open-apis/im/v1/messages/([^/]+)/reactions", path):
            body = await request.json()
            if m.group(1) not in self.messages:
                return _err(400, 230001, "message not found")
            emoji = (body.get("reaction_type") or {}).get("emoji_type", "")
            with self._cond:
                self.reactions.append((m.group(1), emoji))
            self._changed()
            return _ok({"reaction_id": f"r{next(self._ids)}", "reaction_type": {"emoji_type": emoji}})
        if m := re.fullmatch(r"/open-apis/im/v1/messages/([^/]+)/resources/([^/]+)", path):
            res = self.resources.get((m.group(1), m.group(2)))
            if res is None:
                return _err(400, 234003, "resource not found")
            # Like Lark: an image is fetched with type=image, a file, audio or video with type=file.
            if request.query.get("type") != ("image" if m.group(2).startswith("img_") else "file"):
                return _err(400, 234001, "invalid param: type")
            return web.Response(
                body=res[1],
                content_type="application/octet-stream",
                headers={"Content-Disposition": f'attachment; filename="{res[0]}"'},
            )
        if path == "/open-apis/im/v1/messages" and method == "GET":
            return self._list(request)
        if (m := re.fullmatch(r"/open-apis/im/v1/messages/([^/]+)", path)) and method == "GET":
            found = self.messages.get(m.group(1))
            if found is None:
                return _err(400, 230001, "message not found")
            named = request.query.get("with_sender_name", "").lower() == "true"  # the SDK sends "True"
            return _ok({"items": [self._message_json(found, named)]})
        if m := re.fullmatch(r"/open-apis/im/v1/messages/([^/]+)", path):
            return await self._edit(request, m.group(1))
        if path in ("/open-apis/im/v1/images", "/open-apis/im/v1/files") and method == "POST":
            fields: dict[str, bytes] = {}
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                fields[part.name or ""] = bytes(await part.read())  # type: ignore[union-attr]
            image = path.endswith("images")
            data = fields.get("image" if image else "file")
            if data is None:
                return _err(400, 234001, "file missing")
            key = f"{'img' if image else 'file'}_v3_{next(self._ids)}"
            if fields.get("file_type") == b"opus" and not (
                data.startswith(b"OggS") and b"OpusHead" in data[:128]
            ):
                return _err(400, 234010, "file type does not match: opus expected")
            with self._cond:
                self.uploads[key] = (fields.get("file_name", b"").decode(), data)
                self.upload_fields[key] = {
                    k: v.decode() for k, v in fields.items() if k not in ("file", "image")
                }
            self._changed()
            return _ok({"image_key": key} if image else {"file_key": key})
        return _err(404, 404, f"no fake for {method} {path}")

    def _create(self, body: dict[str, Any], chat_id: str, parent: FakeMessage | None) -> web.Response:
        uuid = body.get("uuid")
        with self._cond:
            if uuid and uuid in self._uuids:  # the platform's de-duplication on uuid
                return _ok(self._message_json(self.messages[self._uuids[uuid]]))
            if not isinstance(body.get("content"), str) or not body.get("msg_type"):
                return _err(400, 230001, "invalid content")
            if len(body["content"].encode()) > 30 * 1024 and body["msg_type"] in ("interactive", "post"):
                return _err(400, 230025, "message content too long")
            thread_id = parent.thread_id if parent else None
            if parent and body.get("reply_in_thread") and not thread_id:
                thread_id = f"omt_{parent.message_id}"
            msg = FakeMessage(
                f"om_{next(self._ids):08d}",
                chat_id,
                body["msg_type"],
                body["content"],
                _BOT_APP_ID_SENDER,
                parent_id=parent.message_id if parent else None,
                root_id=(parent.root_id or parent.message_id) if parent else None,
                thread_id=thread_id,
                uuid=uuid,
            )
            self.messages[msg.message_id] = msg
            if uuid:
                self._uuids[uuid] = msg.message_id
        self._changed()
        return _ok(self._message_json(msg))

    async def _edit(self, request: web.Request, message_id: str) -> web.Response:
        body = await request.json()
        msg = self.messages.get(message_id)
        if msg is None or msg.sender != _BOT_APP_ID_SENDER:
            return _err(400, 230001, "message not found")
        if request.method == "PATCH":  # card update
            if msg.msg_type != "interactive":
                return _err(400, 230001, "only cards can be patched")
            try:
                new_card = json.loads(body.get("content", ""))
            except ValueError:
                return _err(400, 230001, "invalid card")
            if (new_card.get("config") or {}).get("update_multi") is not True:
                return _err(400, 230099, "update_multi must be true")
            if len(body["content"].encode()) > 30 * 1024:
                return _err(400, 230025, "message content too long")
        elif request.method == "PUT":  # text / post edit
            if msg.msg_type not in ("text", "post") or body.get("msg_type") != msg.msg_type:
                return _err(400, 230001, "only text and post messages can be edited")
        else:
            return _err(405, 405, "method not allowed")
        with self._cond:
            msg.history.append(msg.content)
            msg.content = body["content"]
        self._changed()
        return _ok(self._message_json(msg) if request.method == "PUT" else None)

    def _list(self, request: web.Request) -> web.Response:
        """GET im/v1/messages: a chat's or a thread's messages (``container_id_type`` chat|thread),
        ``sort_type`` ByCreateTimeAsc|Desc, ``page_size`` 1-50, paged by ``page_token``."""
        q = request.query
        kind, container = q.get("container_id_type"), q.get("container_id", "")
        if kind not in ("chat", "thread") or not container:
            return _err(400, 99992402, "field validation failed: container_id_type")
        size = int(q.get("page_size") or 20)
        if not 1 <= size <= 50:
            return _err(400, 99992402, "field validation failed: page_size")
        with self._cond:
            found = [m for m in self.messages.values()
                     if (m.thread_id if kind == "thread" else m.chat_id) == container]  # fmt: skip
        found.sort(
            key=lambda m: (m.create_time, m.message_id), reverse=q.get("sort_type") == "ByCreateTimeDesc"
        )
        start = int(q.get("page_token") or 0)
        page, more = found[start : start + size], len(found) > start + size
        named = q.get("with_sender_name", "").lower() == "true"
        data = {"items": [self._message_json(m, named) for m in page], "has_more": more}
        if more:
            data["page_token"] = str(start + size)
        return _ok(data)

    def _message_json(self, msg: FakeMessage, named: bool = False) -> dict[str, Any]:
        now = str(int(time.time() * 1000))
        bot = msg.sender == _BOT_APP_ID_SENDER
        sender: dict[str, Any] = (
            {"id": self.app_id, "id_type": "app_id", "sender_type": "app", "tenant_key": "tenant_fake"}
            if bot
            else {"id": msg.sender, "id_type": "open_id", "sender_type": "user", "tenant_key": "tenant_fake"}
        )
        if named:
            sender["sender_name"] = self.bot_name if bot else msg.sender_name
        return {
            "message_id": msg.message_id,
            "root_id": msg.root_id,
            "parent_id": msg.parent_id,
            "thread_id": msg.thread_id,
            "msg_type": msg.msg_type,
            "create_time": str(msg.create_time),
            "update_time": now,
            "deleted": False,
            "updated": bool(msg.history),
            "chat_id": msg.chat_id,
            "sender": sender,
            "body": {"content": msg.content},
        }


def menu_event_type() -> str:
    """The bot custom menu's event (the developer console's "Bot custom menu" subscription)."""
    return "application.bot.menu_v6"


def _ok(data: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> web.Response:
    body: dict[str, Any] = {"code": 0, "msg": "success"}
    if data is not None:
        body["data"] = data
    body.update(extra or {})
    return web.json_response(body)


def _err(status: int, code: int, msg: str) -> web.Response:
    return web.json_response({"code": code, "msg": msg}, status=status)
