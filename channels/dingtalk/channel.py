"""The DingTalk adapter: Stream mode in (channels/dingtalk/sdk.py), the robot OpenAPI out.

Durability: a robot message arrives as a ``CALLBACK`` frame; it is handed to ``sink`` (which
journals it) and only then acknowledged. DingTalk sends an unacknowledged frame again (to this or a
later connection), and the journal drops the copy (its key is the chat and ``msgId``). Frames are
handled one at a time in arrival order, so a chat's messages are journaled in the order they came.

Replies go through the robot OpenAPI (``/v1.0/robot/oToMessages/batchSend`` for a 1:1 chat,
``/v1.0/robot/groupMessages/send`` for a group) with the app's access token, not through the
message's ``sessionWebhook``: a webhook expires (``sessionWebhookExpiredTime``, about 90 minutes),
so a reply resumed after a restart, a scheduled message or ``chital send`` could not use it, and
the URL itself is a credential that would sit in the journal. The OpenAPI works for any chat at any
time. DingTalk cannot edit a robot's text message: without a card template ``can_edit`` is False
and an answer arrives as one final message, split at :data:`MAX_LEN`; with one
(``card_template_id``) every message is an interactive card the answer streams into
(channels/dingtalk/cards.py). A send has no idempotency key on DingTalk, so a send whose answer was
lost is not repeated blindly (the gateway's ``maybe_sent`` rule).

Files: in, a message's ``downloadCode`` is traded for a short-lived URL and streamed up to the
limit; out, an upload to the older API's ``/media/upload`` and a ``sampleImageMsg`` or
``sampleFile`` robot message carrying its ``media_id``.

Approvals and choices: with a button template (``button_template_id``) they are cards whose
buttons call back over the Stream connection (channels/dingtalk/buttons.py); the presser is the
callback's ``userId``, the refusal of a press goes to the presser alone as a 1:1 robot message.
Without one, the gateway's text fallback (``approve CODE``, a number) works as on Matrix.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
from collections.abc import Sequence
from typing import Any

import aiohttp
import websockets

from channels import malformed
from channels.base import (
    Action,
    Attachment,
    Button,
    Capabilities,
    Channel,
    ChannelError,
    FatalChannelError,
    InboundSink,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
)
from channels.limits import check_size, read_capped
from channels.textsplit import split_markdown, stream_text

from .buttons import CARD_TOPIC, PREFIX, ButtonCards, press_ids, read_press
from .cards import FINAL, Cards
from .inbound import GROUP_PREFIX, MAX_DATA_BYTES, recover_ids, to_inbound
from .openapi import OpenApi, Refused
from .sdk import DISCONNECT, MAX_FRAME, ROBOT_TOPIC, TOO_BIG, Frame, Stream, Unreadable, ack, parse
from .settings import DingTalkSettings

log = logging.getLogger(__name__)
DEFAULTS = DingTalkSettings()

MAX_LEN = 4000
"""Characters of one markdown message (DingTalk documents no exact limit for ``sampleMarkdown``;
4,000 stays well inside what clients show without cutting)."""
MAX_PARAM_BYTES = 14_000
"""UTF-8 bytes of one message's ``msgParam`` JSON: DingTalk refuses one over 15,000 bytes
(groupMessages/send), and 4,000 characters of CJK text or emoji are 12-16 kB; a part over this is
split again."""
RETRY_CAP = 30.0
UPLOAD_LIMIT = 20 * 1024 * 1024
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp")
DOWNLOAD_PATH = "/v1.0/robot/messageFiles/download"
GROUP_SEND = "/v1.0/robot/groupMessages/send"
DIRECT_SEND = "/v1.0/robot/oToMessages/batchSend"
PRESSES_KEPT = 1000
"""Press frames remembered, so a callback DingTalk sends again (its ack was lost) acts once."""


class DingTalkChannel(Channel):
    """DingTalk robot in Stream mode (docs/setup/dingtalk.md)."""

    name = "dingtalk"
    capabilities = Capabilities(
        max_message_len=MAX_LEN,
        edit_interval=60.0,
        can_edit=False,
        max_upload_bytes=UPLOAD_LIMIT,
        buttons=False,
    )

    def __init__(
        self,
        client_id: str,
        client_secret: str,
        *,
        robot_code: str = DEFAULTS.robot_code,
        api_base: str = DEFAULTS.api_base,
        oapi_base: str = DEFAULTS.oapi_base,
        card_template_id: str = DEFAULTS.card_template_id,
        card_content_key: str = DEFAULTS.card_content_key,
        button_template_id: str = DEFAULTS.button_template_id,
        button_list_key: str = DEFAULTS.button_list_key,
        keepalive: int = DEFAULTS.keepalive,
    ) -> None:
        super().__init__()
        self.robot_code = robot_code or client_id
        self._oapi = oapi_base
        self._api = OpenApi(api_base, client_id, client_secret)
        self._cards = (
            Cards(self._api, self.robot_code, card_template_id, card_content_key)
            if card_template_id
            else None
        )
        if self._cards is not None:  # a card can be edited: answers stream into it
            self.capabilities = dataclasses.replace(self.capabilities, can_edit=True, edit_interval=1.0)
        self._buttons = (
            ButtonCards(self._api, self.robot_code, button_template_id, card_content_key, button_list_key)
            if button_template_id
            else None
        )
        if self._buttons is not None:  # presses come as card callbacks on the same connection
            self.capabilities = dataclasses.replace(self.capabilities, buttons=True)
        self._presses: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._refusals = malformed.Refusals()
        self._quiet = malformed.LogLimit()
        """Log lines of malformed frames and presses, at most a few a minute per kind."""
        self._answers: set[asyncio.Task[None]] = set()
        self._stream = Stream(self._api, client_id, client_secret, ping_interval=keepalive,
                              ping_timeout=keepalive,
                              topics=(CARD_TOPIC,) if self._buttons else ())  # fmt: skip

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        await self._api.token()  # FatalChannelError when the secret is refused
        delay, refused = 0.0, 0
        while True:
            try:
                uri = await self._stream.open()
                refused = 0
                async for raw in self._stream.frames(uri, self._connected):
                    if await self._frame(raw, sink):
                        break  # DingTalk announced a disconnect: a new connection at once
                    if self._api.refused:  # a send found the secret revoked
                        raise FatalChannelError(self._api.refused)
                delay = 0.0
                continue
            except Refused as exc:
                if exc.status in (400, 401, 403) and not exc.throttled:
                    refused += 1
                    if refused >= 2:
                        raise FatalChannelError(
                            f"DingTalk refused the app's credentials ({exc.code or exc.status}) twice "
                            "in a row; the Client ID or Secret is revoked or wrong, set valid ones"
                        ) from None
                    self.report_trouble(
                        f"DingTalk refused the connection ({exc.code or exc.status}); asking again"
                    )
                    delay = 1.0
                else:
                    delay = exc.retry if exc.throttled else _backoff(delay)
                    self.report_trouble(f"DingTalk connections/open failed: {exc}")
            except (websockets.WebSocketException, aiohttp.ClientError, OSError, TimeoutError) as exc:
                if isinstance(exc, websockets.ConnectionClosed) and exc.sent and exc.sent.code == TOO_BIG:
                    self.count_malformed(malformed.ENVELOPE)
                    log.critical("dingtalk: a frame over %d bytes was refused unread", MAX_FRAME)
                delay = _backoff(delay)
                self.report_trouble(f"DingTalk stream lost: {type(exc).__name__}")
            await asyncio.sleep(delay)

    def _connected(self) -> None:
        log.info("dingtalk: stream connected as robot %s", self.robot_code)
        self.report_connected()

    async def close(self) -> None:
        for task in list(self._answers):
            task.cancel()
        await self._stream.close()
        await self._api.close()

    async def disconnect(self) -> None:
        """Drop the socket only: replies in flight use the OpenAPI session."""
        await self._stream.close()

    # -- inbound ------------------------------------------------------------------------------
    async def _frame(self, raw: str | bytes, sink: InboundSink) -> bool:
        """Handle one frame, then acknowledge it; True when the server asked us to reconnect."""
        try:
            frame = parse(raw, MAX_DATA_BYTES)
        except Unreadable as exc:
            self.count_malformed(malformed.ENVELOPE)
            if (more := self._quiet.allow("frame")) is not None:
                shown = exc.message_id if malformed.is_id(exc.message_id) else "?"
                log.critical("dingtalk: skipped an unreadable frame (message %s): %s%s", shown, exc, more)
            if malformed.is_id(exc.message_id):
                await self._stream.send(ack(Frame("", "", exc.message_id, None, 0)))
            return False
        if frame.type == "SYSTEM":
            await self._stream.send(ack(frame))
            if frame.topic == DISCONNECT:
                log.info("dingtalk: the server asked to reconnect")
                return True
            return False
        if frame.data is None:
            self.count_malformed(malformed.ENVELOPE)
            if (more := self._quiet.allow("oversized")) is not None:
                log.critical("dingtalk: skipped an oversized frame (%s, %d bytes, message %s)%s",
                             _safe(frame.topic), frame.size, _safe(frame.message_id), more)  # fmt: skip
        elif frame.type == "CALLBACK" and frame.topic == ROBOT_TOPIC:
            await self._robot(frame, sink)
        elif frame.type == "CALLBACK" and frame.topic == CARD_TOPIC and self._buttons is not None:
            await self._press(frame)
        elif frame.type != "EVENT":
            self.count_malformed(malformed.ENVELOPE)
            if (more := self._quiet.allow("topic")) is not None:
                log.warning(
                    "dingtalk: skipped a %s frame of topic %s%s", _safe(frame.type), _safe(frame.topic), more
                )
        await self._stream.send(ack(frame))
        return False

    async def _robot(self, frame: Frame, sink: InboundSink) -> None:
        ref = f"message {frame.message_id}" if malformed.is_id(frame.message_id) else "message ?"
        try:
            if not isinstance(frame.data, dict):
                raise TypeError("robot message data is no object")
            inbound = to_inbound(frame.data)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            await self.skip_unreadable(sink, exc, ref=ref, **recover_ids(frame.data))
            return
        if inbound is not None:
            await self.hand_over(sink, inbound, ref=ref)

    async def _press(self, frame: Frame) -> None:
        """A card button press: to the gateway once (a callback sent again is dropped here); a
        refusal is told to the presser alone. Never raises for the press's own sake, so a press
        can never stop the frame loop."""
        if malformed.is_id(frame.message_id):
            if frame.message_id in self._presses:
                return
            self._presses[frame.message_id] = None
            while len(self._presses) > PRESSES_KEPT:
                self._presses.popitem(last=False)
        try:
            press = read_press(frame.data)
        except (TypeError, ValueError) as exc:
            self.count_malformed(malformed.ACTION)
            user, card = press_ids(frame.data)
            if (more := self._quiet.allow("press")) is not None:
                log.critical("dingtalk: skipped an unreadable card callback (card %s, user %s): %s%s",
                             card or "?", user or "?", exc, more)  # fmt: skip
            if user:
                self._tell(user, malformed.ACTION_UNREADABLE)
            return
        action = Action(self.name, press.chat, press.user, press.value, press.card)
        try:
            answer = await self.hand_action(action)
        except ChannelError:  # shutting down: not acknowledged, so DingTalk sends it again
            self._presses.pop(frame.message_id, None)
            raise
        if answer.refused and answer.text:
            self._tell(press.user, answer.text)

    def _tell(self, user: str, text: str) -> None:
        """``text`` to ``user`` in their 1:1 chat with the robot, in the background (a slow send
        must not hold the frame loop), at most a few times a minute per user."""
        if not self._refusals.allow(user):
            return

        async def tell() -> None:
            target = ReplyTarget(self.name, user)
            try:
                await self._robot_send(target, "sampleMarkdown", {"title": _title(text), "text": text})
            except ChannelError as exc:
                log.info("dingtalk: the answer to a press was not sent: %s", exc)

        task = asyncio.get_running_loop().create_task(tell())
        self._answers.add(task)
        task.add_done_callback(self._answers.discard)

    # -- rendering ------------------------------------------------------------------------------
    def render(self, markdown: str) -> list[Rendered]:
        parts = [p for p in _fit(split_markdown(markdown, MAX_LEN), MAX_LEN) if p.strip()]
        return [Rendered(text=p, payload={FINAL: True}) for p in parts] or [Rendered(text="…")]

    def render_stream(self, markdown: str) -> Rendered:
        return Rendered(text=stream_text(markdown, MAX_LEN), payload={FINAL: False})

    # -- outbound -------------------------------------------------------------------------------
    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        text = part.text or "…"
        if self._cards is not None:
            out = await self._cards.create(target, text, idempotency_key)
            if part.payload.get(FINAL) is not False:  # not streamed into: finished at once
                try:
                    await self._cards.update(out, text, final=True)
                except ChannelError as exc:  # the card shows the text; only its state lags
                    log.warning("dingtalk: could not finish card %s: %s", out, exc)
            return out
        param = {"title": _title(text), "text": text}
        return await self._robot_send(target, "sampleMarkdown", param)

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        """Only a card can be edited (streamed); a robot's text message cannot."""
        if message_id.startswith(PREFIX) and self._buttons is not None:
            await self._buttons.close(message_id, part.text or "…")
            return
        if self._cards is None or not message_id.startswith("chital-"):
            raise PermanentSendError("DingTalk cannot edit a robot's text message")
        await self._cards.update(
            message_id, part.text or "…", final=part.payload.get(FINAL, True) is not False
        )

    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        """A buttons card (channels/dingtalk/buttons.py); without a template there are none and the
        gateway asks for a typed answer."""
        if self._buttons is None:
            raise PermanentSendError("DingTalk buttons need channels.dingtalk.button_template_id")
        return await self._buttons.send(target, part.text or "…", buttons, idempotency_key)

    async def close_buttons(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        """The card shows the decision and its buttons are gone; a plain message (the typed
        fallback) cannot change, and a late answer typed to it is told it was settled."""
        if message_id.startswith(PREFIX) and self._buttons is not None:
            await self._buttons.close(message_id, part.text or "…")
        elif message_id.startswith("chital-"):
            await self.edit(target, message_id, part)

    async def _robot_send(self, target: ReplyTarget, key: str, param: dict[str, Any]) -> str:
        body: dict[str, Any] = {"robotCode": self.robot_code, "msgKey": key,
                                "msgParam": json.dumps(param, ensure_ascii=False)}  # fmt: skip
        if target.chat_id.startswith(GROUP_PREFIX):
            body["openConversationId"] = target.chat_id
            answer = await self._api.call(GROUP_SEND, body)
        else:
            body["userIds"] = [target.chat_id]
            answer = await self._api.call(DIRECT_SEND, body)
            if answer.get("invalidStaffIdList"):
                raise PermanentSendError("DingTalk does not know that user (invalidStaffIdList)")
            if answer.get("flowControlledStaffIdList"):
                raise RetryAfter(5.0, "DingTalk is throttling messages to that user")
        key_ = answer.get("processQueryKey")
        return key_ if isinstance(key_, str) else ""

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        """Upload, then a ``sampleImageMsg`` (pictures) or ``sampleFile`` robot message pointing at
        the ``media_id``; a caption follows as its own message (robot files carry none)."""
        check_size(file.name, file.size, UPLOAD_LIMIT, "DingTalk takes files up to 20 MB")
        image = file.suffix in IMAGE_SUFFIXES
        media = await self._api.upload(self._oapi, file.data, file.name, "image" if image else "file")
        if image:
            sent = await self._robot_send(target, "sampleImageMsg", {"photoURL": media})
        else:
            kind = file.suffix[1:] or "file"
            sent = await self._robot_send(target, "sampleFile", {"mediaId": media, "fileName": file.name,
                                                                 "fileType": kind})  # fmt: skip
        if caption.strip():
            await self.send(target, Rendered(text=caption), idempotency_key=f"{idempotency_key}:caption")
        return sent

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """Trade the message's ``downloadCode`` for a short-lived URL, then stream it, stopping
        at ``limit`` (a server that announced less than it sends is cut off)."""
        check_size(attachment.name, attachment.size, limit, "")
        answer = await self._api.call(DOWNLOAD_PATH, {"downloadCode": attachment.file_id,
                                                      "robotCode": self.robot_code})  # fmt: skip
        url = answer.get("downloadUrl")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise PermanentSendError(f"{attachment.name}: DingTalk gave no download URL")
        try:
            async with self._api.session().get(url) as resp:
                if resp.status >= 400:
                    raise TransientSendError(f"{attachment.name}: download answered {resp.status}")
                check_size(attachment.name, resp.content_length, limit, "")
                data = await read_capped(resp, limit)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientSendError(f"{attachment.name}: download failed ({type(exc).__name__})") from None
        check_size(attachment.name, len(data), limit, "")
        return bytes(data)


def _param_bytes(text: str) -> int:
    return len(json.dumps({"title": _title(text), "text": text}, ensure_ascii=False).encode())


def _fit(parts: list[str], limit: int) -> list[str]:
    """``parts``, each one over :data:`MAX_PARAM_BYTES` split again at a smaller limit."""
    out: list[str] = []
    for part in parts:
        if _param_bytes(part) <= MAX_PARAM_BYTES or limit <= 250:
            out.append(part)
        else:
            out.extend(_fit(split_markdown(part, limit // 2), limit // 2))
    return out


def _title(text: str) -> str:
    """The notification title of a markdown message: its first words, no Markdown marks."""
    first = next((line for line in text.splitlines() if line.strip()), "Chital")
    return first.strip().lstrip("#>*-` ").strip()[:30] or "Chital"


def _backoff(delay: float) -> float:
    return 1.0 if delay == 0 else min(RETRY_CAP, delay * 2)


def _safe(value: str) -> str:
    return value if malformed.is_id(value) else "?"


__all__ = ["DingTalkChannel"]
