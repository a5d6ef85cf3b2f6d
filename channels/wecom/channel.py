"""The WeCom adapter: an intelligent robot (智能机器人) over its long connection.

Inbound: the read loop hands each ``aibot_msg_callback`` to ``sink`` (which journals it) before
it reads the next frame, so messages keep their order. WeCom's protocol has no acknowledgement of
a callback (there is nothing to hold back until the journal has it): a message that arrives while
the daemon dies before journaling it is lost unless WeCom sends it again, and a callback sent again
is dropped by the journal (its key is the chat and the ``msgid``).

Replies: WeCom's answer to a message is a *stream* (``aibot_respond_msg`` with the callback's
``req_id`` and ``msgtype: stream``): the first frame shows a message, each later frame with the
same stream id replaces its content, and ``finish: true`` ends it. That is this adapter's
``send`` / ``edit`` for the first part of an answer. WeCom takes stream updates for 6 minutes after
the message (errcode 846608 after that; 846605 for a ``req_id`` it no longer knows). What comes
later, or has no message to answer (a schedule, a background task, a turn resumed after the window,
parts after the first of a long answer), goes out as a proactive ``aibot_send_msg`` markdown
message, which cannot be edited: a snapshot of an answer being streamed outside the window is not
shown, only the final text.

Buttons (approvals, choices): ``button_interaction`` template cards, their presses and their
updates (channels/wecom/cards.py). Files out: the long connection's chunked temporary-media upload
(channels/wecom/upload.py).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from channels import malformed
from channels.base import (
    Attachment,
    Button,
    Capabilities,
    Channel,
    FatalChannelError,
    InboundSink,
    NotModified,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
    scrub,
)

from . import cards, media, upload
from .inbound import (
    AT,
    EVENT_CALLBACK,
    MSG_CALLBACK,
    REQ_ID,
    RESPOND,
    RESPOND_UPDATE,
    SEND,
    event_of,
    ids_of,
    req_id_of,
    to_inbound,
)
from .presses import Presses
from .render import MAX_LEN, defang, is_final, render, render_stream
from .settings import DEFAULT_WS_URL, WeComSettings
from .wire import Refused, Wire, new_req_id

log = logging.getLogger(__name__)
DEFAULTS = WeComSettings()

EXPIRED = frozenset({846605, 846608})
"""Errcodes of a reply WeCom no longer takes: an unknown ``req_id``, a stream past its 6 minutes."""
RATE_LIMITED = frozenset({45009, 45033})
"""WeCom's "API frequency limit" errcodes."""
MAX_FRAME = 64 * 1024 * 1024
"""A frame larger than this closes the connection (aiohttp's own limit)."""
SOFT_FRAME = 4 * 1024 * 1024
"""A frame larger than this is skipped and counted: WeCom caps a text at a few kB, so such a frame
is no message of ours, and refusing it here keeps the connection (and the chats behind it) alive."""
REMEMBERED = 4096
RETRY_CAP = 30.0


class _Bounded(collections.OrderedDict[str, str]):
    def add(self, key: str, value: str = "") -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > REMEMBERED:
            self.popitem(last=False)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class _Expired(Exception):
    """WeCom no longer takes a reply for this ``req_id``."""


class WeComChannel(Channel):
    """WeCom intelligent robot, long-connection API mode (docs/setup/wecom.md)."""

    name = "wecom"
    capabilities = Capabilities(max_message_len=MAX_LEN, edit_interval=1.0, can_edit=True, buttons=True,
                                max_upload_bytes=upload.FILE_BYTES)  # fmt: skip

    def __init__(
        self,
        bot_id: str,
        secret: str,
        *,
        ws_url: str = DEFAULT_WS_URL,
        heartbeat_interval: float = DEFAULTS.heartbeat_interval,
        reply_window: float = DEFAULTS.reply_window,
        ack_timeout: float = 5.0,
    ) -> None:
        super().__init__()
        self.bot_id = bot_id
        self._secret = secret
        self._url = ws_url
        self._heartbeat = heartbeat_interval
        self._window = reply_window
        self._ack_timeout = ack_timeout
        self._session: aiohttp.ClientSession | None = None
        self._wire: Wire | None = None
        self._live = asyncio.Event()
        self._finished = _Bounded()
        """Stream ids this process ended (``finish: true``; WeCom takes no more updates of them) ->
        the digest of their last text."""
        self._expired = _Bounded()
        """``req_id``s WeCom said it no longer takes replies for."""
        self._streams: dict[str, str] = {}
        """``req_id`` -> the stream this process opened for it (one stream per message)."""
        self._delivered = _Bounded()
        """Proactive parts (``m|…``, and ``p|…`` ids whose final text went out) -> the digest of
        the text that went out."""
        self._presses = Presses(self.name, self.hand_action, self._say, self.count_malformed)
        self._quiet = malformed.LogLimit()
        self._unsure = _Bounded()
        """Stream ids whose final frame went out without an answer -> the digest of its text."""

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        refusals = 0
        delay = 0.0
        while True:
            subscribed = False
            try:
                subscribed = await self._connect_once(sink)
                reason = "WeCom closed the connection"
            except Refused as exc:
                refusals += 1
                if refusals >= 2:
                    raise FatalChannelError(
                        f"WeCom refused the subscription twice in a row ({exc}); the bot id or "
                        "secret is wrong or was reset: set valid ones"
                    ) from None
                reason = f"WeCom refused the subscription ({exc}); trying once more"
            except (aiohttp.ClientError, TimeoutError, ConnectionError, OSError) as exc:
                reason = f"WeCom connection lost: {type(exc).__name__}"
            if subscribed:
                refusals, delay = 0, 0.0
            delay = 1.0 if delay == 0 else min(RETRY_CAP, delay * 1.5)
            self.report_trouble(scrub(reason, self._secret))
            log.info("wecom: %s; connecting again in %.1f s", scrub(reason, self._secret), delay)
            await asyncio.sleep(delay)

    async def _connect_once(self, sink: InboundSink) -> bool:
        """One connection: subscribe, then read until it ends. True once it was subscribed."""
        session = self._http()
        timeout = aiohttp.ClientWSTimeout(ws_receive=None, ws_close=3.0)
        connect = session.ws_connect(self._url, heartbeat=None, max_msg_size=MAX_FRAME, timeout=timeout)
        async with connect as ws:
            wire = Wire(ws, self._secret, self._ack_timeout)
            await wire.subscribe(self.bot_id)
            self._wire = wire
            self._live.set()
            self.report_connected()
            log.info("wecom: subscribed as robot %s", self.bot_id)
            try:
                for raw in wire.early:  # frames that came before the subscription's answer
                    await self._frame(raw, wire, sink)
                await self._read(wire, sink)
            except (aiohttp.ClientError, TimeoutError, ConnectionError, OSError) as exc:
                log.warning("wecom: connection lost: %s", scrub(str(exc), self._secret)[:200])
            finally:
                self._drop(wire)
            return True  # it was live: the caller dials again at once

    def _drop(self, wire: Wire) -> None:
        if self._wire is wire:
            self._wire = None
            self._live.clear()
        wire.fail_all()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._wire is not None:
            self._drop(self._wire)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def disconnect(self) -> None:
        """Replies travel over the same websocket, so there is nothing to keep open: ``run`` being
        cancelled closed it."""

    # -- inbound ------------------------------------------------------------------------------
    async def _read(self, wire: Wire, sink: InboundSink) -> None:
        """Frames until the connection ends, a ``ping`` every heartbeat interval; two unanswered
        pings mean the connection is half-open: ``ConnectionError`` (the caller dials again)."""
        next_ping = time.monotonic() + self._heartbeat
        while True:
            now = time.monotonic()
            if now >= next_ping:
                if wire.missed_pings >= 2:
                    raise ConnectionError("no answer to two pings (a half-open connection)")
                await wire.ping()
                next_ping = now + self._heartbeat
            try:
                msg = await wire.ws.receive(timeout=max(0.05, next_ping - time.monotonic()))
            except TimeoutError:
                continue
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED):
                return
            if msg.type == aiohttp.WSMsgType.ERROR:
                raise ConnectionError(f"websocket error: {type(msg.data).__name__}")
            data = msg.data
            if msg.type == aiohttp.WSMsgType.BINARY:
                data = bytes(data).decode("utf-8", errors="replace")
            await self._frame(str(data), wire, sink)

    async def _frame(self, raw: str, wire: Wire, sink: InboundSink) -> None:
        if len(raw) > SOFT_FRAME:
            self._skip_envelope(f"a frame of {len(raw)} characters")
            return
        try:
            frame = json.loads(raw)
        except (ValueError, RecursionError):
            self._skip_envelope("a frame that is not JSON")
            return
        if not isinstance(frame, dict):
            self._skip_envelope("a frame that is not an object")
            return
        cmd = frame.get("cmd")
        if cmd == MSG_CALLBACK:
            await self._message(frame, sink)
        elif cmd == EVENT_CALLBACK:
            await self._event(frame)
        elif cmd in (None, ""):
            if not wire.answer(frame):
                log.debug("wecom: an answer to no frame of ours")
        else:
            name = cmd if isinstance(cmd, str) and cmd.isprintable() and len(cmd) <= 64 else "?"
            self._skip_envelope(f"a frame of unknown cmd {name!r}")

    def _skip_envelope(self, what: str) -> None:
        """Counted every time; logged a few times a minute (a flood of bad frames is the sender's
        pace, not the log's: channels/malformed.py ``LogLimit``)."""
        self.count_malformed(malformed.ENVELOPE)
        if (more := self._quiet.allow(malformed.ENVELOPE)) is not None:
            log.critical("wecom: skipped %s%s", what, more)

    async def _message(self, frame: dict[str, Any], sink: InboundSink) -> None:
        req_id, body = req_id_of(frame), frame.get("body")
        now = time.time()
        try:
            if not req_id:
                raise ValueError("a callback without a usable req_id")
            inbound = to_inbound(req_id, body, now=now)
        except (TypeError, ValueError) as exc:
            extra = {REQ_ID: req_id, AT: now} if req_id else None
            await self.skip_unreadable(sink, exc, extra=extra, **ids_of(body))
            return
        await self.hand_over(sink, inbound, ref=f"msg {inbound.message_id}")

    async def _event(self, frame: dict[str, Any]) -> None:
        try:
            etype, _ = event_of(frame.get("body"))
        except TypeError:
            self._skip_envelope("an event callback without an eventtype")
            return
        if etype == cards.EVENT:
            await self._presses.handle(req_id_of(frame), frame.get("body"))
            return
        # enter_chat (no welcome text is configured), feedback_event and event types WeCom adds
        # later need nothing from us.
        log.debug("wecom: event %s ignored", etype if etype.isprintable() else "?")

    async def _say(self, chat_id: str, text: str) -> None:
        """What a presser is told (channels/wecom/presses.py), as a markdown message in the chat."""
        await self._proactive(chat_id, render(text)[0].text)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """An image, file or video a user sent, decrypted (channels/wecom/media.py)."""
        return await media.download(attachment, limit, home=self._url)

    # -- rendering ------------------------------------------------------------------------------
    def render(self, markdown: str) -> Sequence[Rendered]:
        return render(markdown)

    def render_stream(self, markdown: str) -> Rendered:
        return render_stream(markdown)

    # -- outbound -------------------------------------------------------------------------------
    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        """The first part of a reply opens the message's stream while its window is open; every
        other part is a proactive message, sent when it is final (see the module docstring). The
        stream id comes from ``idempotency_key``: a repeat after a lost answer refreshes the same
        stream instead of making a second message."""
        final = is_final(part)
        sid = "s" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
        req_id = self._open_req(target)
        if req_id and self._streams.get(req_id, sid) == sid:
            try:
                await self._stream(req_id, sid, part.text, final)
                return f"s|{req_id}|{sid}"
            except _Expired:
                pass
        if not final:
            return f"p|{sid}"  # shown when the final text comes (edit), as a message of its own
        await self._proactive(target.chat_id, part.text)
        self._delivered.add(f"m|{sid}", _digest(part.text))
        return f"m|{sid}"

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        """A stream is updated while it is open and its window lasts. A message WeCom cannot
        change any more (a finished stream, a proactive message) gets a final text that differs
        from what it shows as a new proactive message; the same text again changes nothing."""
        kind, _, rest = message_id.partition("|")
        final = is_final(part)
        if kind == "s":
            req_id, _, sid = rest.rpartition("|")
            if sid not in self._finished:
                if req_id and self._window_open(target, req_id):
                    try:
                        await self._stream(req_id, sid, part.text, final)
                        return
                    except _Expired:
                        pass
                if not final:
                    raise NotModified("the reply window is closed; only the final text is sent")
            await self._replace(target, sid, self._finished, part)
            return
        if kind not in ("p", "m") or not final:
            raise NotModified("a proactive WeCom message shows only final text")
        await self._replace(target, message_id, self._delivered, part)

    async def _replace(self, target: ReplyTarget, key: str, shown: _Bounded, part: Rendered) -> None:
        digest = _digest(part.text)
        if shown.get(key) == digest:
            raise NotModified("WeCom shows this text already")
        await self._proactive(target.chat_id, part.text)
        shown.add(key, digest)

    def _open_req(self, target: ReplyTarget) -> str:
        req_id = target.extra.get(REQ_ID)
        return req_id if isinstance(req_id, str) and self._window_open(target, req_id) else ""

    def _window_open(self, target: ReplyTarget, req_id: str) -> bool:
        at = target.extra.get(AT)
        if req_id in self._expired or not isinstance(at, int | float):
            return False
        return time.time() - float(at) < self._window

    async def _stream(self, req_id: str, sid: str, text: str, final: bool) -> None:
        """One stream frame. A final frame whose answer was lost may have finished the stream: the
        same final text again is then taken as shown when WeCom refuses it (it refuses updates of a
        finished stream), instead of failing the edit into a second, proactive copy."""
        body = {"msgtype": "stream", "stream": {"id": sid, "finish": final, "content": defang(text)}}
        try:
            answer = await self._request(RESPOND, req_id, body)
        except TransientSendError as exc:
            if final and exc.maybe_sent:
                self._unsure.add(sid, _digest(text))
            raise
        if answer.get("errcode") in EXPIRED:
            self._expired.add(req_id)
            raise _Expired
        if (
            final
            and answer.get("errcode") not in (0, *RATE_LIMITED)
            and self._unsure.get(sid) == _digest(text)
        ):
            log.info("wecom: a final stream frame sent again was refused; its first sending finished it")
            answer = {"errcode": 0}
        self._check(answer)
        self._streams.setdefault(req_id, sid)
        if len(self._streams) > REMEMBERED:
            self._streams.pop(next(iter(self._streams)))
        if final:
            self._finished.add(sid, _digest(text))

    async def _proactive(self, chat_id: str, text: str) -> None:
        # defang again: a part the gateway built without render() must not ping anyone either
        body = {"chatid": chat_id, "msgtype": "markdown", "markdown": {"content": defang(text)}}
        self._check(await self._request(SEND, new_req_id(SEND), body))

    # -- buttons and files (channels/wecom/cards.py, upload.py) ------------------------------------
    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        """A ``button_interaction`` card, sent proactively; a text longer than a card shows goes
        first as a markdown message. A repeat of one key in this process sends nothing again."""
        task = cards.task_id(idempotency_key, target.chat_id)
        mid = cards.message_id(task)
        if mid in self._delivered:
            return mid
        text = part.text
        card = cards.card_body(task, text if cards.fits(text) else text.strip().split("\n")[0], buttons)
        if not cards.fits(text):
            await self._proactive(target.chat_id, text)
        body = {"chatid": target.chat_id, "msgtype": cards.CARD, cards.CARD: card}
        self._check(await self._request(SEND, new_req_id(SEND), body))
        self._delivered.add(mid, _digest(text))
        return mid

    async def close_buttons(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        """Within seconds of a press the card itself is replaced by the decision (no buttons);
        later WeCom takes no update, so the decision goes out as a message of its own and the
        buttons stay (a later press is answered "already settled" by the gateway)."""
        task = cards.task_of(message_id)
        if not task:
            await self.edit(target, message_id, part)
            return
        self._presses.closed(task)
        req_id = self._presses.update_req_id(task)
        if req_id:
            card = cards.closed_card(task, part.text)
            body = {"response_type": "update_template_card", "template_card": card}
            answer = await self._request(RESPOND_UPDATE, req_id, body)
            if answer.get("errcode") == 0:
                self._delivered.add(f"{message_id}|closed", _digest(part.text))
                return
            log.info("wecom: card update refused (errcode %s); the decision is sent", answer.get("errcode"))
        await self._replace(target, f"{message_id}|closed", self._delivered, part)

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        """Upload ``file`` as temporary media, then a ``file`` or ``image`` message naming it
        (proactive; the caption, when there is one, goes first as markdown)."""
        mid = "f|" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
        if mid in self._delivered:
            return mid
        kind, media_id = await upload.upload(lambda cmd, b: self._request(cmd, new_req_id(cmd), b), file)
        if caption.strip():
            await self._proactive(target.chat_id, render(caption)[0].text)
        body = {"chatid": target.chat_id, "msgtype": kind, kind: {"media_id": media_id}}
        self._check(await self._request(SEND, new_req_id(SEND), body))
        self._delivered.add(mid)
        return mid

    async def _request(self, cmd: str, req_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """One frame over the live connection (waiting up to 15 s for one while it reconnects)."""
        try:
            async with asyncio.timeout(15.0):
                await self._live.wait()
        except TimeoutError:
            raise TransientSendError("WeCom is not connected") from None
        wire = self._wire
        if wire is None:
            raise TransientSendError("WeCom is not connected")
        return await wire.request(cmd, req_id, body)

    def _check(self, answer: dict[str, Any]) -> None:
        errcode = answer.get("errcode")
        if errcode == 0:
            return
        errmsg = answer.get("errmsg")
        text = scrub(str(errmsg)[:200] if isinstance(errmsg, str) else "", self._secret)
        if errcode in RATE_LIMITED:
            raise RetryAfter(5.0, f"WeCom rate limit ({errcode})")
        if isinstance(errcode, int) and errcode < 0:  # -1: "system busy"
            raise TransientSendError(f"WeCom busy ({errcode}: {text})")
        raise PermanentSendError(f"WeCom refused the message ({errcode}: {text})")


__all__ = ["WeComChannel"]
