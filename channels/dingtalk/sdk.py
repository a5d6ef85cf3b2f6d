"""DingTalk Stream mode: the ``dingtalk-stream`` SDK's frames, on a connection loop of our own.

What the SDK gives: the frame model (``SystemMessage`` / ``EventMessage`` / ``CallbackMessage``
``from_dict``, ``AckMessage`` with its ``Headers``), the robot message model (``ChatbotMessage``,
its topic) and the protocol's conventions (subscriptions, the ``ping`` and ``disconnect`` system
topics, an ack per frame carrying its ``messageId``). What it does not give a daemon, and so what
this module does instead of ``DingTalkStreamClient.start()``:

* ``open_connection`` is a blocking ``requests.post`` (it would stall the event loop) that turns
  every failure into ``None``: a revoked secret (401 ``authFailed``) retries every 10 s forever.
  Here the call is async, a refusal is asked once more and then stops the channel (``FatalChannelError``,
  shown in /readyz); other failures back off.
* ``start()`` hands every frame to its own task, so two messages of one chat could be journaled
  out of order; here frames are handled one after the other, each acknowledged only after the
  handler returned (the robot message is journaled by then).
* it logs the gateway's ticket and unknown frames whole (someone's message) at INFO/WARNING;
  here a frame is logged by ids only.
* it pings every 60 s and never notices a pong that does not come; here the websocket's own
  keepalive closes a silent (half-open) connection after ``ping_interval + ping_timeout``.

The address: the SDK reads ``DINGTALK_OPENAPI_ENDPOINT`` from the environment at import; we use
none of its network code, so the one address is ``channels.dingtalk.api_base`` (the
``connections/open`` call here and every OpenAPI call go to it). No private name of the SDK is
used, so this module needs no entry in compat/versions.py; pyproject pins the 0.24 series the
frame model was read from.
"""

from __future__ import annotations

import json
import logging
import platform
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus, urlsplit

import websockets
from dingtalk_stream import AckMessage, CallbackMessage, ChatbotMessage, EventMessage, SystemMessage
from dingtalk_stream.frames import Headers
from dingtalk_stream.version import VERSION_STRING

from .openapi import OpenApi, Refused

log = logging.getLogger(__name__)
WS_LOG = logging.getLogger("dingtalk_stream.websocket")
"""The websocket's own logger: at DEBUG, websockets logs every frame whole (someone's message), so it
is held at INFO whatever the daemon's level."""
WS_LOG.setLevel(logging.INFO)

OPEN_PATH = "/v1.0/gateway/connections/open"
ROBOT_TOPIC = ChatbotMessage.TOPIC
PING = "ping"
DISCONNECT = SystemMessage.TOPIC_DISCONNECT
MAX_FRAME = 64 * 1024 * 1024
"""The websocket refuses a frame above this: it closes with 1009 and the connection is made again
(counted as a malformed envelope). DingTalk's own messages are far smaller; a frame's data over
1 MiB (:data:`channels.dingtalk.inbound.MAX_DATA_BYTES`) is already skipped and acknowledged."""
TOO_BIG = 1009


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame read off the socket: its type, topic, message id and parsed data."""

    type: str
    topic: str
    message_id: str
    data: Any
    size: int


class Unreadable(ValueError):
    """A frame that is not a Stream frame at all (not JSON, not an object, no ``headers``)."""

    def __init__(self, reason: str, message_id: str = "") -> None:
        super().__init__(reason)
        self.message_id = message_id


def parse(raw: str | bytes, max_data: int) -> Frame:
    """A frame through the SDK's model. ``data`` is None when it is over ``max_data`` bytes (not
    parsed); :class:`Unreadable` when the frame cannot be read (its ``messageId`` if it has one)."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # nested deeper than the decoder goes is no frame either
        raise Unreadable("not JSON") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("headers"), dict):
        raise Unreadable("no headers")
    headers = obj["headers"]
    mid = headers.get("messageId")
    mid = mid if isinstance(mid, str) else ""
    kind = obj.get("type")
    data = obj.get("data", "")
    size = len(data.encode()) if isinstance(data, str) else 0
    if not isinstance(kind, str) or not isinstance(data, str):
        raise Unreadable("a frame without type or data", mid)
    if size > max_data:
        return Frame(kind, str(headers.get("topic") or ""), mid, None, size)
    model = {SystemMessage.TYPE: SystemMessage, EventMessage.TYPE: EventMessage,
             CallbackMessage.TYPE: CallbackMessage}.get(kind)  # fmt: skip
    if model is None:
        return Frame(kind, str(headers.get("topic") or ""), mid, {}, size)
    try:
        msg = model.from_dict(obj)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        raise Unreadable("data is not JSON", mid) from None
    topic = msg.headers.topic if isinstance(msg.headers.topic, str) else ""
    return Frame(kind, topic, mid, msg.data, size)


def ack(frame: Frame, code: int = AckMessage.STATUS_OK, message: str = "OK") -> str:
    """The acknowledgement of ``frame``: its ``messageId`` back with a status. A system frame's
    data goes back as it came (a ``ping``'s ``opaque``), as the SDK's ``SystemHandler`` does; a
    callback's ack carries ``{"response": ...}`` as ``CallbackHandler.raw_process`` builds it."""
    out = AckMessage()
    out.code = code
    out.message = message
    out.headers.message_id = frame.message_id
    out.headers.content_type = Headers.CONTENT_TYPE_APPLICATION_JSON
    if frame.type == SystemMessage.TYPE and isinstance(frame.data, dict):
        out.data = frame.data
    elif frame.type == CallbackMessage.TYPE:
        out.data = {"response": None}
    return json.dumps(out.to_dict())


def endpoint_allowed(api_base: str, endpoint: str) -> bool:
    """Whether the Stream ``endpoint`` from ``connections/open`` may be connected to: ``wss://``,
    or ``ws://`` only when the API itself is plain ``http://`` (a local fake or proxy). A plaintext
    socket under an https API would send the ticket and every message in the clear."""
    try:
        url, api = urlsplit(endpoint), urlsplit(api_base)
        host = url.hostname
    except ValueError:
        return False
    if not host or url.username is not None or url.password is not None:
        return False
    return url.scheme == "wss" or (url.scheme == "ws" and api.scheme == "http")


class Stream:
    """One app's Stream-mode connection: :meth:`open` asks the gateway for an endpoint and a
    ticket, :meth:`frames` yields the socket's frames until it ends."""

    def __init__(
        self,
        api: OpenApi,
        client_id: str,
        client_secret: str,
        *,
        ping_interval: float = 20.0,
        ping_timeout: float = 20.0,
        topics: tuple[str, ...] = (),
    ) -> None:
        self._api = api
        self._topics = (ROBOT_TOPIC, *topics)
        self._id = client_id
        self._secret = client_secret
        self._ping = (ping_interval, ping_timeout)
        self.ws: Any = None

    async def open(self) -> str:
        """The websocket address (with its one-time ticket; never logged). :class:`Refused` when
        the gateway refuses the credentials (401 ``authFailed``)."""
        body = {
            "clientId": self._id,
            "clientSecret": self._secret,
            "subscriptions": [{"type": CallbackMessage.TYPE, "topic": t} for t in self._topics],
            "ua": f"chital dingtalk-sdk-python/v{VERSION_STRING} Python/{platform.python_version()}",
            "localIp": "",
        }
        answer = await self._api.raw_post(OPEN_PATH, body)
        endpoint, ticket = answer.get("endpoint"), answer.get("ticket")
        if not isinstance(endpoint, str) or not isinstance(ticket, str):
            raise ConnectionError("connections/open answered without endpoint/ticket")
        if not endpoint_allowed(self._api.base, endpoint):
            log.warning("dingtalk: connections/open named an endpoint that is not wss:// (or carries "
                        "credentials) while the API is https; not connecting")  # fmt: skip
            raise ConnectionError("connections/open named a plaintext or unusable endpoint")
        return f"{endpoint}?ticket={quote_plus(ticket)}"

    async def frames(self, uri: str, on_open: Callable[[], None]) -> AsyncIterator[str | bytes]:
        """The raw frames of one connection, until it closes (``ConnectionClosed`` when it broke)."""
        interval, timeout = self._ping
        async with websockets.connect(
            uri,
            ping_interval=interval,
            ping_timeout=timeout,
            max_size=MAX_FRAME,
            open_timeout=30,
            logger=WS_LOG,
        ) as ws:
            self.ws = ws
            on_open()
            try:
                async for raw in ws:
                    yield raw
            finally:
                self.ws = None

    async def send(self, text: str) -> None:
        if self.ws is not None:
            await self.ws.send(text)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


Handler = Callable[[Frame], Awaitable[None]]
__all__ = ["DISCONNECT", "PING", "ROBOT_TOPIC", "Frame", "Refused", "Stream", "Unreadable", "ack",
           "endpoint_allowed", "parse"]  # fmt: skip
