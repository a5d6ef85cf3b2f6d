"""A fake WeCom intelligent-robot long connection: the websocket server on 127.0.0.1.

What it speaks (the frames of WeCom's "智能机器人长连接" API, as its official SDKs send and read them):
``aibot_subscribe`` answered with errcode 0, or 40001 for a wrong bot id / secret (then closed);
``ping`` answered with errcode 0; ``aibot_msg_callback`` frames it pushes for users' messages;
``aibot_respond_msg`` with ``msgtype: stream`` (a new stream id shows a message replying to the
callback, the same id replaces its content, ``finish: true`` ends it; a ``req_id`` it never sent
is answered 846605, a stream older than :attr:`FakeWeCom.stream_window` 846608, an update of a
finished stream 846609 (that code is this fake's: the documentation found names none));
``aibot_send_msg`` with ``msgtype: markdown`` (a message of its own). Every answer is
``{"headers": {"req_id"}, "errcode", "errmsg"}``.

One connection per robot, as WeCom has it: a second subscription closes the first connection.
Callbacks pushed while no connection is subscribed are held and pushed at the next subscription
(the real server's behaviour there is not documented; the adapter de-duplicates either way).

What tests script: users' messages (:meth:`inject_text`, :meth:`inject_body`), raw frames,
redelivery of a callback, a dropped connection, a half-open one (it stops answering and pushing,
the socket stays open), a revoked secret, expired reply windows. What they read: the bot's
messages as a user sees them (:meth:`replies_to`, :meth:`bot_messages`), every frame received.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import WSMsgType, web

from tests.fakes.wecom_cards import UPLOAD_CMDS, WeComCardsMixin

T = TypeVar("T")


@dataclass
class Shown:
    """A bot message as a user sees it: a stream (its latest content) or a proactive message."""

    chat: str
    content: str
    kind: str
    reply_to: str | None = None
    """The msgid of the user's message a stream answers (None for a proactive message)."""
    finished: bool = False
    updates: int = 0
    stream_id: str = ""
    frames: list[dict[str, Any]] = field(default_factory=list)
    card: dict[str, Any] = field(default_factory=dict)
    """A template card's latest content (``kind == "card"``): its ``button_list`` while it has one."""
    media: bytes = b""
    """The bytes of an uploaded file or image (``kind`` ``file`` / ``image``)."""

    @property
    def text(self) -> str:
        return self.content


@dataclass
class _Callback:
    frame: dict[str, Any]
    sent_at: float
    chat: str


class FakeWeCom(WeComCardsMixin):
    platform = "wecom"

    def __init__(
        self, bot_id: str = "aibFakeRobot0001", secret: str = "wecom-fake-secret-0123456789abcdefXYZ"
    ) -> None:
        self.bot_id = bot_id
        self.secret = secret
        self.revoked = False
        self.port = 0
        self.stream_window = 360.0
        self.subscribes = 0
        self.refusals = 0
        self.pings = 0
        self.received: list[dict[str, Any]] = []
        """Every frame the bot sent (parsed) but pings, subscription frames with their secret masked."""
        self.messages: list[Shown] = []
        self._streams: dict[tuple[str, str], Shown] = {}
        self._callbacks: dict[str, _Callback] = {}
        self._expired: set[str] = set()
        self._live: web.WebSocketResponse | None = None
        self._dead: set[int] = set()  # ids of half-open sockets
        self._held: list[str] = []
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._media: dict[str, bytes] = {}
        self._redirects: dict[str, str] = {}
        self.downloads = 0
        self._cards: dict[str, Shown] = {}
        self._card_events: dict[str, tuple[float, str]] = {}
        self.update_window = 5.0
        self._uploads: dict[str, dict[str, Any]] = {}
        self.uploaded: dict[str, tuple[bytes, str, str]] = {}
        """media_id -> (bytes, filename, type) of each finished upload."""
        self.fail_upload: tuple[str, int] | None = None
        """``(cmd, errcode)``: answer the next such upload command with this errcode."""
        self.subscribe_errors: list[tuple[int, str]] = []
        """Answers the next subscriptions get instead of success (first first), e.g. ``(-1, "system
        busy")``; unlike a refused secret, the connection is left open after it."""
        self.gzip_media = False
        """Serve media gzip-encoded (``Content-Encoding: gzip``) even to a client asking for none."""
        self.garbled_answers: list[Any] = []
        """``errcode`` values (a string, a list, null...) the next replies are answered with after
        being shown, first first."""
        self.lose_finish_answer = False
        """The next stream frame with ``finish: true`` is shown, then the connection drops before
        its answer is sent."""
        self.before_subscribe_answer: list[str] = []
        """Raw frames pushed (once) before the next subscription's answer."""

    # -- server --------------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/", self._ws)
        app.router.add_get("/media/{id}", self._media_get)
        app.router.add_get("/redirect/{id}", self._redirect_get)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self.drop()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def channel_settings(self) -> dict[str, Any]:
        return {"enabled": True, "bot_id": self.bot_id, "secret": self.secret, "ws_url": self.url,
                "heartbeat_interval": 1.0}  # fmt: skip

    @property
    def connected(self) -> bool:
        return self._live is not None and not self._live.closed and id(self._live) not in self._dead

    async def wait_connected(self, timeout: float = 20) -> None:
        await self.wait_for(lambda: self.connected, timeout=timeout, what="the robot's subscription")

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True, max_msg_size=64 * 1024 * 1024)
        await ws.prepare(request)
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                if id(ws) in self._dead:
                    continue  # half-open: nothing gets through any more
                await self._frame(ws, msg.data)
        finally:
            if self._live is ws:
                self._live = None
            self._poke()
        return ws

    async def _answer(
        self, ws: web.WebSocketResponse, req_id: Any, errcode: Any = 0, errmsg: str = "ok",
        body: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        answer: dict[str, Any] = {"headers": {"req_id": req_id}, "errcode": errcode, "errmsg": errmsg}
        if body is not None:
            answer["body"] = body
        await ws.send_str(json.dumps(answer))

    async def _frame(self, ws: web.WebSocketResponse, raw: str) -> None:
        frame = json.loads(raw)
        cmd, req_id = frame.get("cmd"), (frame.get("headers") or {}).get("req_id")
        body = frame.get("body") or {}
        if cmd == "aibot_subscribe":
            self.received.append({**frame, "body": {**body, "secret": "***"}})
            self.subscribes += 1
            early, self.before_subscribe_answer = self.before_subscribe_answer, []
            for text in early:
                await ws.send_str(text)
            if self.subscribe_errors:
                await self._answer(ws, req_id, *self.subscribe_errors.pop(0))
                return
            if self.revoked or body.get("bot_id") != self.bot_id or body.get("secret") != self.secret:
                self.refusals += 1
                await self._answer(ws, req_id, 40001, "invalid secret")
                await ws.close()
                return
            old, self._live = self._live, ws
            await self._answer(ws, req_id)
            if old is not None and old is not ws:
                await old.close()  # one connection per robot: the newer one takes over
            held, self._held = self._held, []
            for text in held:
                await ws.send_str(text)
            self._poke()
            return
        if cmd == "ping":
            self.pings += 1
            await self._answer(ws, req_id)
            return
        self.received.append(frame)
        if cmd == "aibot_respond_msg":
            code, msg = self._respond(req_id, body, frame)
            if self.lose_finish_answer and code == 0 and (body.get("stream") or {}).get("finish"):
                self.lose_finish_answer = False
                await self.drop()  # shown and finished, but the answer never reaches the bot
                return
            await self._answer(ws, req_id, self.garbled_answers.pop(0) if self.garbled_answers else code, msg)
        elif cmd == "aibot_send_msg":
            code, msg = self._send(body, frame)
            if code == 0 and self.garbled_answers:
                code = self.garbled_answers.pop(0)
            await self._answer(ws, req_id, code, msg)
        elif cmd == "aibot_respond_update_msg":
            code, msg = self._update(req_id, body, frame)
            await self._answer(ws, req_id, code, msg)
        elif cmd in UPLOAD_CMDS:
            code, msg, answer = self._upload(cmd, body)
            await self._answer(ws, req_id, code, msg, answer)
        else:
            await self._answer(ws, req_id, 40058, "unknown cmd")
        self._poke()

    def _respond(self, req_id: Any, body: dict[str, Any], frame: dict[str, Any]) -> tuple[int, str]:
        cb = self._callbacks.get(req_id) if isinstance(req_id, str) else None
        if cb is None:
            return 846605, "invalid req_id"
        if req_id in self._expired or time.monotonic() - cb.sent_at > self.stream_window:
            return 846608, "stream message update expired"
        stream = body.get("stream") or {}
        sid, content = stream.get("id"), stream.get("content")
        if body.get("msgtype") != "stream" or not isinstance(sid, str) or not isinstance(content, str):
            return 40008, "invalid message"
        if len(content.encode()) > 20480:
            return 40058, "content exceeds 20480 bytes"
        shown = self._streams.get((req_id, sid))
        if shown is None:
            shown = Shown(cb.chat, content, "stream", reply_to=cb.frame["body"]["msgid"], stream_id=sid)
            self._streams[(req_id, sid)] = shown
            self.messages.append(shown)
        elif shown.finished:
            return 846609, "stream already finished"
        else:
            shown.updates += 1
        shown.content = content
        shown.finished = bool(stream.get("finish"))
        shown.frames.append(frame)
        return 0, "ok"

    async def _media_get(self, request: web.Request) -> web.StreamResponse:
        data = self._media.get(request.match_info["id"])
        if data is None:
            return web.Response(status=404)
        self.downloads += 1
        if self.gzip_media:  # whatever the client asked: a hostile or misconfigured file server
            return web.Response(body=gzip.compress(data), content_type="application/octet-stream",
                                headers={"Content-Encoding": "gzip"})  # fmt: skip
        return web.Response(body=data, content_type="application/octet-stream")

    async def _redirect_get(self, request: web.Request) -> web.StreamResponse:
        self.downloads += 1
        return web.Response(status=302, headers={"Location": self._redirects[request.match_info["id"]]})

    def add_redirect(self, location: str) -> str:
        """A URL on this fake that answers ``302 Location: location`` (a media host bouncing)."""
        rid = f"r{next(self._ids)}"
        self._redirects[rid] = location
        return f"http://127.0.0.1:{self.port}/redirect/{rid}"

    def add_media(self, data: bytes) -> dict[str, str]:
        """Serve ``data`` encrypted as WeCom does (AES-256-CBC, the IV the key's first 16 bytes,
        PKCS#7 to 32-byte blocks); the ``{url, aeskey}`` a message carries for it."""
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        key = os.urandom(32)
        pad = 32 - len(data) % 32
        encryptor = Cipher(algorithms.AES(key), modes.CBC(key[:16])).encryptor()
        sealed = encryptor.update(data + bytes([pad]) * pad) + encryptor.finalize()
        media_id = f"m{next(self._ids)}"
        self._media[media_id] = sealed
        return {"url": f"http://127.0.0.1:{self.port}/media/{media_id}",
                "aeskey": base64.b64encode(key).decode().rstrip("=")}  # fmt: skip

    # -- scripting -------------------------------------------------------------------------------
    def _push(self, frame: dict[str, Any] | str) -> None:
        text = frame if isinstance(frame, str) else json.dumps(frame, ensure_ascii=False)
        if self.connected:
            assert self._live is not None
            asyncio.get_running_loop().create_task(self._live.send_str(text))
        else:
            self._held.append(text)

    def inject_body(self, body: dict[str, Any], *, chat: str = "", req_id: str = "") -> dict[str, Any]:
        """Push an ``aibot_msg_callback`` with ``body`` as it is; the frame pushed is returned."""
        req_id = req_id or f"cbreq_{next(self._ids)}_{time.monotonic_ns()}"
        frame = {"cmd": "aibot_msg_callback", "headers": {"req_id": req_id}, "body": body}
        self._callbacks[req_id] = _Callback(frame, time.monotonic(), chat)
        self._push(frame)
        return frame

    def inject_text(self, user: str, text: str, *, group: str = "", msgtype: str = "text",
                    **fields: Any) -> dict[str, Any]:  # fmt: skip
        """A user's message in a 1:1 chat, or in ``group`` (an @-mention: WeCom delivers only
        those from groups, with the ``@name`` in front of the text)."""
        body: dict[str, Any] = {
            "msgid": f"msg{next(self._ids)}x{time.monotonic_ns()}",
            "aibotid": self.bot_id,
            "chattype": "group" if group else "single",
            "from": {"userid": user},
            "create_time": int(time.time()),
            "msgtype": msgtype,
        }
        if group:
            body["chatid"] = group
        if msgtype == "text":
            body["text"] = {"content": text}
        body.update(fields)
        return self.inject_body(body, chat=group or user)

    def redeliver(self, frame: dict[str, Any]) -> dict[str, Any]:
        """The same callback (same msgid) pushed again under a new ``req_id``."""
        return self.inject_body(frame["body"], chat=self._callbacks[frame["headers"]["req_id"]].chat)

    def send_raw(self, text: str) -> None:
        self._push(text)

    def expire(self, frame: dict[str, Any]) -> None:
        """WeCom no longer takes stream updates for the reply to ``frame`` (past its window)."""
        self._expired.add(frame["headers"]["req_id"])

    async def drop(self) -> None:
        """Close the robot's connection (a network drop)."""
        ws, self._live = self._live, None
        if ws is not None:
            await ws.close()

    def half_open(self) -> None:
        """The connection stays open but nothing gets through either way (no answers, no pushes)."""
        if self._live is not None:
            self._dead.add(id(self._live))
            self._live = None

    async def revoke(self) -> None:
        """The secret was reset in the admin console: subscriptions are refused from now on."""
        self.revoked = True
        await self.drop()

    # -- reading ---------------------------------------------------------------------------------
    def replies_to(self, frame: dict[str, Any]) -> list[Shown]:
        msgid = frame["body"]["msgid"]
        return [m for m in self.messages if m.reply_to == msgid]

    def bot_messages(self, chat: str) -> list[Shown]:
        return [m for m in self.messages if m.chat == chat]

    def _poke(self) -> None:
        self._changed.set()

    async def wait_for(self, check: Callable[[], T | None], timeout: float = 15, what: str = "") -> T:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = check()
            if value:
                return value
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what or check}; messages: "
                                     f"{[(m.chat, m.kind, m.content[:80]) for m in self.messages]}")  # fmt: skip
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.2))
            except TimeoutError:
                pass
