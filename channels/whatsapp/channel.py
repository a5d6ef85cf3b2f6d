"""The WhatsApp adapter: Meta's Cloud API. Inbound by webhook, outbound through the Graph API.

Inbound is the one thing that differs from every other channel: Meta calls us. The adapter serves
two routes on the daemon's hooks listener (:meth:`web_routes`, mounted by the gateway under
``/channels/whatsapp/webhook``): ``GET`` answers Meta's verification handshake (``hub.mode=subscribe``,
``hub.verify_token`` compared in constant time, ``hub.challenge`` echoed); ``POST`` takes a
delivery, refused unless ``X-Hub-Signature-256`` is the HMAC-SHA256 of the raw body with the app
secret. Its body is capped before it is read in full and must arrive within ``read_seconds``.

Durability: each message of a delivery is handed to ``sink`` (which journals it) before the 200
goes out; Meta redelivers whatever was not answered 2xx (with growing delays, for a day or
more), and the journal drops a repeat (the key holds the ``wamid``). While the channel is not
running (a revoked token, a restart) a delivery gets 503, so Meta keeps it and tries again later:
nothing is lost.

No edits: WhatsApp cannot edit a business message, so ``can_edit`` is False and an answer goes out
once, whole, split at 4,096 characters. The 24-hour customer-service window: a free-form reply to
someone who last wrote more than 24 hours ago is refused (Graph error 131047, synchronously or
later as a ``failed`` status); it is not retried, it is logged and shown as the channel's notice in
/readyz and ``chital status``.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

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
    WebRoute,
)
from channels.limits import check_size

from .api import OUTSIDE_WINDOW, Graph, GraphError, OutsideWindow, send_error
from .inbound import (
    ACTION_PREFIX,
    SIGNATURE,
    changes,
    check_message,
    failed_status,
    is_group,
    press,
    recover_ids,
    signed,
    to_inbound,
)
from .render import MAX_LEN, render, render_stream
from .settings import WhatsAppSettings

log = logging.getLogger(__name__)
DEFAULTS = WhatsAppSettings()
UPLOAD_LIMIT = 100 * 1024 * 1024
"""Cloud API documents; images are at most 5 MB (a larger one goes as a document)."""
IMAGE_LIMIT = 5 * 1024 * 1024
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
MAX_BUTTONS, BUTTON_TITLE, MAX_ROWS, ROW_TITLE, BODY_LEN = 3, 20, 10, 24, 1024
"""Reply buttons: at most 3, titles of 20 characters; a list: 10 rows of 24; a body of 1,024."""
PRESSES_KEPT = 1024
BODIES_IN_FLIGHT = 4
"""Bytes of webhook bodies held at once, in largest bodies: the endpoint is on the internet and a
body is read whole before its signature can be checked, so many slow or parallel callers must not
hold more than this between them (one caller is bounded by ``max_body_bytes`` alone)."""
MAX_AGE_SECONDS = 7 * 86400 + 3600
"""Meta redelivers an unanswered delivery for at most 7 days: a message whose signed ``timestamp``
is older is a replay of a captured delivery (the journal that drops repeats is pruned after
``storage.retention_days``), acknowledged and not run again. An hour's slack for clock skew."""
REFUSAL_LOG_SECONDS = 60.0
"""A kind of refused webhook request is logged at most this often, with the count since the last
line: the endpoint is on the internet, and a line per forged request would let anyone grow the
operator's logs at wire speed."""


class WhatsAppChannel(Channel):
    """WhatsApp Business Cloud API (docs/setup/whatsapp.md)."""

    name = "whatsapp"
    capabilities = Capabilities(
        max_message_len=MAX_LEN,
        edit_interval=3600.0,
        can_edit=False,
        max_upload_bytes=UPLOAD_LIMIT,
        buttons=True,
    )

    def __init__(
        self,
        phone_number_id: str,
        access_token: str,
        app_secret: str,
        verify_token: str,
        *,
        graph_url: str = DEFAULTS.graph_url,
        api_version: str = DEFAULTS.api_version,
        max_body_bytes: int = DEFAULTS.max_body_bytes,
        read_seconds: float = DEFAULTS.read_seconds,
    ) -> None:
        super().__init__()
        self.phone_number_id = phone_number_id
        self._graph = Graph(graph_url, api_version, phone_number_id, access_token)
        self._app_secret = app_secret
        self._verify_token = verify_token
        self._max_body = max_body_bytes
        self._read_seconds = read_seconds
        self._held = 0
        """Bytes of unverified webhook bodies being read now, across callers (``BODIES_IN_FLIGHT``)."""
        self._sink: InboundSink | None = None
        self._refused = asyncio.Event()
        """Set when Graph refused the token on a send: :meth:`run` checks it again."""
        self._order = asyncio.Lock()
        self._presses: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.ignored: collections.Counter[str] = collections.Counter()
        """Events read and deliberately not handed on (statuses, reactions), by type."""
        self.outside_window = 0
        self.refused: collections.Counter[str] = collections.Counter()
        """Webhook requests refused (forged, oversized, slow, busy, wrong verification), by kind."""
        self._refusal_noted: dict[str, tuple[float, int]] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        """Check the token, then take webhook deliveries until cancelled or the token is refused."""
        await self._whoami()
        self._sink = sink
        self.report_connected()
        try:
            while True:
                await self._refused.wait()
                self._refused.clear()
                await self._whoami()  # raises FatalChannelError when the token is really gone
        finally:
            self._sink = None  # deliveries get 503 and Meta redelivers them later

    async def close(self) -> None:
        await self._graph.close()

    async def disconnect(self) -> None:
        """Nothing to drop: inbound is the hooks listener's; replies share the Graph session."""

    async def _whoami(self) -> None:
        for attempt in range(2):
            try:
                body = await self._graph.whoami()
            except GraphError as exc:
                if not exc.token:
                    raise ConnectionError(f"WhatsApp phone number check failed: {exc}") from None
                if attempt == 0:
                    self.report_trouble("Graph refused the token; checking it again")
                    await asyncio.sleep(1.0)
                    continue
                self._graph.refused = True
                raise send_error(exc) from None
            log.info("whatsapp: connected as %s", body.get("display_phone_number") or self.phone_number_id)
            return

    def web_routes(self) -> Sequence[WebRoute]:
        return (WebRoute("GET", "/webhook", self._verify), WebRoute("POST", "/webhook", self._deliver))

    # -- inbound --------------------------------------------------------------------------------
    async def _verify(self, request: web.Request) -> web.Response:
        """Meta's subscription handshake: the verify token compared in constant time."""
        query = request.query
        given = query.get("hub.verify_token", "")
        same = hmac.compare_digest(given.encode(errors="replace"), self._verify_token.encode())
        if query.get("hub.mode") != "subscribe" or not same or not self._verify_token:
            self._refuse("verification")
            return web.Response(status=403, text="forbidden")
        challenge = query.get("hub.challenge", "")
        if not challenge or len(challenge) > 256 or not challenge.isprintable():
            return web.Response(status=400, text="bad challenge")
        log.info("whatsapp: webhook verified")
        return web.Response(text=challenge, content_type="text/plain")

    async def _read(self, request: web.Request) -> bytes | web.Response:
        """The body, capped per caller (``max_body_bytes``) and across callers (``BODIES_IN_FLIGHT``
        largest bodies): a caller that would pass the shared budget gets 503 (Meta redelivers), so a
        flood of unsigned bodies cannot hold the daemon's memory, while small deliveries still fit."""
        cap = self._max_body
        if request.content_length is not None and request.content_length > cap:
            return self._too_large()
        chunks: list[bytes] = []
        total = 0
        try:
            async with asyncio.timeout(self._read_seconds):
                while total <= cap:
                    chunk = await request.content.read(min(64 * 1024, cap + 1 - total))
                    if not chunk:
                        break
                    if self._held + len(chunk) > cap * BODIES_IN_FLIGHT:
                        self._refuse("busy")
                        return web.Response(
                            status=503, text="busy; retry later", headers={"Retry-After": "5"}
                        )
                    chunks.append(chunk)
                    total += len(chunk)
                    self._held += len(chunk)
        except TimeoutError:
            self._refuse("slow body")
            return web.Response(status=408, text="timeout")
        finally:
            self._held -= total
        return self._too_large() if total > cap else b"".join(chunks)

    def _too_large(self) -> web.Response:
        self.count_malformed(malformed.ENVELOPE)
        self._refuse("too large")
        return web.Response(status=413, text="too large")

    async def _deliver(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        if isinstance(body, web.Response):
            return body
        given = request.headers.get(SIGNATURE)
        if not signed(self._app_secret, body, given):
            self._refuse("bad signature" if given else "unsigned")
            return web.Response(status=403 if given else 401, text="forbidden")
        sink = self._sink
        if sink is None:
            return web.Response(status=503, text="not running; retry later")
        try:
            payload: Any = json.loads(body)
        except (ValueError, RecursionError):
            self.count_malformed(malformed.ENVELOPE)
            log.critical("whatsapp: skipped a signed delivery that is not JSON")
            return web.Response(text="ok")  # signed, so Meta's: a redelivery would not parse either
        try:
            async with self._order:  # deliveries journaled in the order they came
                await self._changes(payload, sink)
        except ChannelError as exc:  # shutting down: not acknowledged, so Meta redelivers
            log.info("whatsapp: delivery not taken (%s); Meta will redeliver", type(exc).__name__)
            return web.Response(status=503, text="retry later")
        except Exception as exc:  # the store is down: the same
            log.error("whatsapp: delivery not journaled (%s); Meta will redeliver", type(exc).__name__)
            return web.Response(status=503, text="retry later")
        return web.Response(text="ok")

    def _refuse(self, kind: str) -> None:
        """Count a refused webhook request; log the kind at most once per ``REFUSAL_LOG_SECONDS``."""
        self.refused[kind] += 1
        now = time.monotonic()
        last, seen = self._refusal_noted.get(kind, (None, 0))
        if last is None or now - last >= REFUSAL_LOG_SECONDS:
            self._refusal_noted[kind] = (now, self.refused[kind])
            log.warning("whatsapp: refused a webhook delivery (%s); %d such request(s) since the last "
                        "note, logged at most once a minute", kind, self.refused[kind] - seen)  # fmt: skip

    async def _changes(self, payload: Any, sink: InboundSink) -> None:
        for change in changes(payload, self.phone_number_id):
            if change is None:
                self.count_malformed(malformed.ENVELOPE)
                log.critical("whatsapp: skipped a delivery entry that cannot be read")
                continue
            for status in change.statuses:
                self._status(status)
            for message in change.messages:
                await self._message(message, change.names, change.me, sink)

    def _status(self, status: Any) -> None:
        failed = failed_status(status)
        if failed is None:
            self.ignored["status"] += 1
            return
        recipient, code = failed
        if code == OUTSIDE_WINDOW:
            self._outside_window(recipient)
        else:
            log.warning("whatsapp: a message to %s was not delivered (Graph error %s)", recipient, code)

    def _outside_window(self, recipient: str) -> None:
        self.outside_window += 1
        self.notice = (
            f"{self.outside_window} repl{'y' if self.outside_window == 1 else 'ies'} refused: the user "
            f"(last {recipient}) wrote more than 24 hours ago; WhatsApp takes no free-form message "
            "until they write again"
        )
        log.warning("whatsapp: reply to %s refused outside the 24-hour customer-service window "
                    "(error 131047); not retried", recipient)  # fmt: skip

    async def _message(self, message: Any, names: dict[str, str], me: str, sink: InboundSink) -> None:
        try:
            mtype, wamid, sender = check_message(message)
            if _expired(message.get("timestamp")):
                self.ignored["expired"] += 1
                log.warning("whatsapp: skipped message %s: older than Meta's 7-day redelivery window "
                            "(a replayed delivery)", wamid)  # fmt: skip
                return
            pressed = press(message)
            if pressed is not None and pressed[0].startswith(ACTION_PREFIX):
                await self._press(message, wamid, sender, pressed[0], names)
                return
            inbound = to_inbound(message, names, me)
        except (TypeError, ValueError, KeyError) as exc:
            await self.skip_unreadable(sink, exc, **recover_ids(message))
            return
        if inbound is None:
            self.ignored[mtype] += 1
            return
        await self.hand_over(sink, inbound, ref=f"message {wamid}")

    async def _press(self, message: Any, wamid: str, sender: str, bid: str, names: dict[str, str]) -> None:
        """A press of one of the bot's buttons: to the gateway once (a redelivery is dropped
        here), and its answer sent back to the presser as a reply."""
        if wamid in self._presses:
            return
        self._presses[wamid] = None
        while len(self._presses) > PRESSES_KEPT:
            self._presses.popitem(last=False)
        context = message.get("context")
        on = context.get("id") if isinstance(context, dict) and malformed.is_id(context.get("id")) else ""
        action = Action(self.name, sender, sender, bid.removeprefix(ACTION_PREFIX), str(on),
                        names.get(sender, ""))  # fmt: skip
        answer = await self.hand_action(action)
        if answer.text:
            target = ReplyTarget(self.name, sender, reply_to=wamid)
            try:
                await self.send(target, Rendered(text=answer.text), idempotency_key=f"press-{wamid}")
            except ChannelError as exc:
                log.info("whatsapp: the answer to a press was not sent: %s", exc)

    # -- rendering ------------------------------------------------------------------------------
    def render(self, markdown: str) -> list[Rendered]:
        return render(markdown)

    def render_stream(self, markdown: str) -> Rendered:
        return render_stream(markdown)

    # -- outbound -------------------------------------------------------------------------------
    async def _send(self, target: ReplyTarget, payload: dict[str, Any]) -> str:
        if target.reply_to and malformed.is_id(target.reply_to):
            payload = {**payload, "context": {"message_id": target.reply_to}}
        kind = "group" if is_group(target.chat_id) else "individual"
        try:
            return await self._graph.send({"recipient_type": kind, "to": target.chat_id, **payload})
        except OutsideWindow:
            self._outside_window(target.chat_id)
            raise
        except FatalChannelError:
            self._refused.set()
            raise

    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        body = {"preview_url": False, "body": (part.text or "…")[:MAX_LEN]}
        return await self._send(target, {"type": "text", "text": body})

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        raise PermanentSendError("WhatsApp messages cannot be edited")

    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        """Up to 3 buttons as reply buttons (titles cut to 20 characters), up to 10 as a list
        message; a text over the 1,024 characters an interactive body holds goes first on its own."""
        if is_group(target.chat_id):  # the Groups API takes no interactive messages
            raise PermanentSendError("WhatsApp groups take no buttons")
        if not buttons or len(buttons) > MAX_ROWS:
            raise PermanentSendError(f"WhatsApp shows 1 to {MAX_ROWS} choices, not {len(buttons)}")
        text = part.text or "…"
        if len(text) > BODY_LEN:
            await self.send(target, part, idempotency_key=f"{idempotency_key}-text")
            text = "⬆️"
        ids = [f"{ACTION_PREFIX}{b.value}"[:256] for b in buttons]
        if len(buttons) <= MAX_BUTTONS:
            action: dict[str, Any] = {"buttons": [
                {"type": "reply", "reply": {"id": i, "title": _cut(b.label, BUTTON_TITLE)}}
                for i, b in zip(ids, buttons, strict=True)
            ]}  # fmt: skip
            kind = "button"
        else:
            rows = [{"id": i, "title": _cut(b.label, ROW_TITLE)} for i, b in zip(ids, buttons, strict=True)]
            action = {"button": "Choose", "sections": [{"title": "Choices", "rows": rows}]}
            kind = "list"
        interactive = {"type": kind, "body": {"text": text}, "action": action}
        return await self._send(target, {"type": "interactive", "interactive": interactive})

    async def close_buttons(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        """WhatsApp cannot take buttons off a message: they stay, and a late press is refused by
        the gateway as already decided (its answer goes to the presser)."""

    async def typing(self, target: ReplyTarget) -> None:
        """Marks the user's message read and shows the typing indicator (up to 25 s); best effort."""
        if not target.reply_to or is_group(target.chat_id):
            return
        body = {"status": "read", "message_id": target.reply_to, "typing_indicator": {"type": "text"}}
        try:
            await self._graph.send(body)
        except ChannelError as exc:
            log.debug("whatsapp: typing failed: %s", exc)

    async def react(self, target: ReplyTarget, emoji: str) -> None:
        if not target.reply_to:
            return
        try:
            await self._send(ReplyTarget(self.name, target.chat_id), {
                "type": "reaction", "reaction": {"message_id": target.reply_to, "emoji": emoji}})  # fmt: skip
        except ChannelError as exc:
            log.debug("whatsapp: reaction failed: %s", exc)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """The media id's URL (from Graph) fetched with the bearer; the announced size is checked
        before the download and the body is cut off past ``limit`` whatever was announced."""
        check_size(attachment.name, attachment.size, limit, "")
        data, announced = await self._graph.download(attachment.file_id, limit)
        check_size(attachment.name, announced, limit, "")
        check_size(attachment.name, len(data), limit, "")
        return data

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        """Upload (``/media``), then an image or document message naming the media id."""
        check_size(file.name, file.size, UPLOAD_LIMIT, "WhatsApp takes documents of at most 100 MB")
        mime = IMAGE_TYPES.get(file.suffix)
        image = mime is not None and file.size <= IMAGE_LIMIT
        mime = mime or "application/octet-stream"
        media_id = await self._graph.upload(file.data, mime, file.name)
        media: dict[str, Any] = {"id": media_id}
        if caption:
            media["caption"] = caption[:BODY_LEN]
        if not image:
            media["filename"] = file.name
        kind = "image" if image else "document"
        return await self._send(target, {"type": kind, kind: media})


def _expired(timestamp: Any) -> bool:
    """Whether a message's unix ``timestamp`` is past Meta's redelivery window; one that cannot be
    read is not (the signature already says Meta sent it)."""
    try:
        sent = int(timestamp)
    except (TypeError, ValueError, OverflowError):
        return False
    return time.time() - sent > MAX_AGE_SECONDS


def _cut(label: str, limit: int) -> str:
    label = " ".join(label.split()) or "?"
    return label if len(label) <= limit else label[: limit - 1] + "…"


__all__ = ["WhatsAppChannel"]
