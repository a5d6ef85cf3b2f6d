"""One subscribed WeCom long connection: the subscription, our frames matched to their answers by
``req_id``, and the ``ping`` heartbeat.

Why our own client (aiohttp's websocket) rather than WeCom's official ``wecom-aibot-python-sdk``:
that SDK reads frames in its own task and hands them to event listeners without awaiting them, so
nothing it offers lets a message be journaled before the next one is read (per-conversation order)
or tells us of a frame it could not parse (it logs and drops it, uncounted), and it logs whole
frames (users' messages) at debug level. The protocol is small: a JSON object per text frame,
``{"cmd", "headers": {"req_id"}, "body"}``, answered by ``{"headers": {"req_id"}, "errcode",
"errmsg"}``. The frame names and the answer matching follow that SDK (docs/setup/wecom.md).

WeCom answers the frames sent for one ``req_id`` in order, and an answer names only the
``req_id``; so, as the SDK does, frames for one ``req_id`` are sent one at a time, each after the
answer to the one before (:meth:`Wire.request`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import weakref
from typing import Any

import aiohttp

from channels.base import ChannelError, TransientSendError, scrub

from .inbound import PING, SUBSCRIBE, obj

ACK_TIMEOUT = 5.0
"""Seconds WeCom is given to answer one of our frames (the official SDKs wait 5 s)."""
BUSY = frozenset({45009, 45033})
"""WeCom's "API frequency limit" errcodes: a subscription refused with one is tried again, never
taken for a wrong secret (nor is a negative errcode, "system busy", or one that is no integer)."""
MAX_EARLY = 64
EARLY_FRAME = 4 * 1024 * 1024
"""Frames kept from before the subscription's answer: at most this many, each at most this long
(the read loop skips longer ones all the same)."""
MAX_MISSED_PINGS = 2
"""Pings in a row without an answer before the connection counts as dead (the SDKs' rule)."""


class Refused(ChannelError):
    """WeCom refused the subscription (a wrong or revoked bot id / secret)."""

    def __init__(self, errcode: Any, errmsg: str) -> None:
        super().__init__(f"errcode {errcode}: {errmsg}"[:300])
        self.errcode = errcode


class SubscriptionBusy(ConnectionError):
    """WeCom answered the subscription with a busy or rate-limit errcode (not a refusal): the
    channel dials again after its usual pause (its trouble report names this class)."""


def new_req_id(prefix: str) -> str:
    """A fresh ``req_id`` in the SDKs' shape (``{cmd}_{ms}_{random}``)."""
    return f"{prefix}_{int(time.time() * 1000)}_{uuid.uuid4().hex[:8]}"


def dumps(frame: dict[str, Any]) -> str:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


class Wire:
    """Requests over one open websocket; the channel's read loop feeds answers to :meth:`answer`."""

    def __init__(
        self, ws: aiohttp.ClientWebSocketResponse, secret: str, ack_timeout: float = ACK_TIMEOUT
    ) -> None:
        self.ws = ws
        self._secret = secret
        self._ack_timeout = ack_timeout
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._send_lock = asyncio.Lock()
        self._pings: set[str] = set()
        self.missed_pings = 0
        self.closed = False
        self.early: list[str] = []
        """Frames read while waiting for the subscription's answer, in order, for the read loop."""

    async def subscribe(self, bot_id: str, wait: float = 15.0) -> None:
        """Send ``aibot_subscribe`` and read until its answer; :class:`Refused` on a non-zero
        errcode, ``ConnectionError`` when the socket closes or nothing answers in time."""
        req_id = new_req_id(SUBSCRIBE)
        await self._send({"cmd": SUBSCRIBE, "headers": {"req_id": req_id},
                          "body": {"bot_id": bot_id, "secret": self._secret}})  # fmt: skip
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionError("WeCom did not answer the subscription")
            msg = await self.ws.receive(timeout=left)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"WeCom closed the connection before subscribing ({msg.type.name})")
            try:
                frame = json.loads(msg.data)
            except (ValueError, RecursionError):  # nested past the decoder's depth: not the answer
                frame = None
            if obj(obj(frame).get("headers")).get("req_id") != req_id:
                self._keep_early(msg.data)
                continue
            errcode = frame.get("errcode")
            if errcode == 0:
                return
            errmsg = frame.get("errmsg")
            text = scrub(errmsg[:200] if isinstance(errmsg, str) else "", self._secret)
            if not isinstance(errcode, int) or isinstance(errcode, bool) or errcode in BUSY or errcode < 0:
                # WeCom being busy (-1, a rate limit) is no verdict on the secret: dial again later.
                code = errcode if isinstance(errcode, int) else "?"
                raise SubscriptionBusy(f"WeCom could not take the subscription now (errcode {code})")
            raise Refused(errcode, text)

    def _keep_early(self, raw: str) -> None:
        """A frame that came before the subscription's answer (a user's message, perhaps): kept
        for the read loop (:attr:`early`) rather than lost; one over :data:`EARLY_FRAME`
        characters is kept as a stand-in the read loop skips and counts."""
        if len(self.early) >= MAX_EARLY:
            raise ConnectionError("WeCom sent too many frames before answering the subscription")
        self.early.append(raw if len(raw) <= EARLY_FRAME else "\x00 (an oversized frame)")

    async def _send(self, frame: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_str(dumps(frame))

    async def request(self, cmd: str, req_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send one frame and return WeCom's answer to it (``errcode``, always an ``int``, and
        ``errmsg``).

        :class:`TransientSendError` when the connection fails: ``maybe_sent`` once the frame left
        (its answer was lost: WeCom may have shown it)."""
        lock = self._locks.get(req_id)
        if lock is None:
            lock = self._locks[req_id] = asyncio.Lock()
        async with lock:
            if self.closed:
                raise TransientSendError("the WeCom connection is closed")
            future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._pending[req_id] = future
            try:
                try:
                    await self._send({"cmd": cmd, "headers": {"req_id": req_id}, "body": body})
                except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                    raise TransientSendError(f"WeCom send failed: {type(exc).__name__}") from None
                try:
                    async with asyncio.timeout(self._ack_timeout):
                        answer = await future
                except (TimeoutError, ConnectionError):
                    raise TransientSendError("WeCom did not answer the frame", maybe_sent=True) from None
            finally:
                self._pending.pop(req_id, None)
            errcode = answer.get("errcode")
            if not isinstance(errcode, int) or isinstance(errcode, bool):
                # Missing, a string, a list: no verdict either way, and the frame may be shown.
                raise TransientSendError("WeCom answered the frame unreadably", maybe_sent=True)
            return answer

    async def ping(self) -> None:
        """One heartbeat; counted as missed until its answer comes (:meth:`answer`)."""
        req_id = new_req_id(PING)
        self._pings = {req_id}  # only the latest ping's answer counts
        self.missed_pings += 1
        await self._send({"cmd": PING, "headers": {"req_id": req_id}})

    def answer(self, frame: dict[str, Any]) -> bool:
        """Route an answer frame (no ``cmd``) to its waiter; False when it answers nothing of ours."""
        req_id = obj(frame.get("headers")).get("req_id")
        if not isinstance(req_id, str):
            return False
        if req_id in self._pings:
            self._pings.discard(req_id)
            self.missed_pings = 0
            return True
        future = self._pending.get(req_id)
        if future is None or future.done():
            return False
        future.set_result(frame)
        return True

    def fail_all(self) -> None:
        """The connection ended: every waiter learns its answer will not come."""
        self.closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("the WeCom connection closed"))
        self._pending.clear()
