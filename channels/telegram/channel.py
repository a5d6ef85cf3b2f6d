"""The Telegram adapter: python-telegram-bot's ``Bot`` for every API call, our own long-poll loop.

Why not PTB's ``Updater``: it confirms a batch (moves the offset) as soon as it fetched it, before any
handler ran, so a crash loses those messages. Here an update is handed to ``sink`` (which journals
it) before the offset moves past it; after a crash Telegram serves it again and the journal drops the
duplicate.

Logging: PTB and httpx put the request URL, which contains the token, into DEBUG/INFO records. This
module raises the ``httpx`` logger to WARNING (httpx logs every request URL at INFO) and scrubs the
token from every error text it builds; PTB's own URL logging is DEBUG only.
"""

from __future__ import annotations

import asyncio
import datetime as dtm
import logging
import warnings
from collections.abc import Awaitable
from typing import Any, TypeVar

import telegram
from telegram import Bot, InputFile, LinkPreviewOptions, MessageEntity, ReplyParameters, Update
from telegram import error as tg
from telegram.constants import ChatAction, ReactionEmoji
from telegram.request import HTTPXRequest

from channels.base import (
    Attachment,
    Capabilities,
    Channel,
    ChannelError,
    ChannelState,
    FatalChannelError,
    InboundSink,
    NotModified,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
)
from channels.telegram.inbound import to_inbound
from channels.telegram.render import (
    MAX_CAPTION_UTF16,
    MAX_MESSAGE_UTF16,
    render_markdown,
    truncate,
)

log = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))

T = TypeVar("T")

TOKEN_REJECTED = "Telegram rejected the bot token (401)"
# Only new messages: an edit would re-run a turn the agent already answered (one inbound message, at
# most one reply thread), so edited_message is deliberately not requested.
ALLOWED_UPDATES = ("message",)
GETFILE_LIMIT = 20 * 1024 * 1024  # the Bot API serves bots files up to 20 MB
UPLOAD_LIMIT = 50 * 1024 * 1024  # and accepts uploads up to 50 MB
PHOTO_LIMIT = 10 * 1024 * 1024
_PHOTO_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp"})
# Reactions must come from Telegram's fixed list; common status emoji map to the nearest allowed one.
_REACTIONS = {e.value.replace("\ufe0f", ""): e.value for e in ReactionEmoji}
_REACTION_ALIASES = {"✅": "👌", "✔": "👌", "☑": "👌", "⏳": "👀", "⌛": "👀", "🔄": "👀", "❌": "👎",
                     "🚫": "👎", "💭": "🤔"}  # fmt: skip
_NO_PREVIEW = LinkPreviewOptions(is_disabled=True)


class TelegramChannel(Channel):
    """Telegram Bot API over long polling.

    ``base_url``/``base_file_url`` are PTB-style prefixes the token is appended to (a self-hosted Bot
    API server or a test fake). Pacing: Telegram allows about one message a second per chat sustained
    (20 a minute in groups) but tolerates short bursts, so sends are not spaced ahead of time (a
    reply to a message must not wait on the previous reply) and edits are spaced 1 s; anything faster
    is answered with 429 + retry_after, which :class:`RetryAfter` carries to delivery's pacer.
    """

    name = "telegram"
    capabilities = Capabilities(
        max_message_len=MAX_MESSAGE_UTF16,
        edit_interval=1.0,
        can_edit=True,
        min_send_interval=0.0,
        max_upload_bytes=UPLOAD_LIMIT,
    )

    def __init__(
        self,
        token: str,
        *,
        base_url: str = "https://api.telegram.org/bot",
        base_file_url: str = "https://api.telegram.org/file/bot",
        poll_timeout: int = 25,
    ) -> None:
        super().__init__()
        self._token = token
        self._poll_timeout = poll_timeout
        # Sends, edits, typing and downloads share one pool, big enough for many chats at once.
        self._request = HTTPXRequest(
            connection_pool_size=32, read_timeout=20.0, write_timeout=20.0, connect_timeout=10.0,
            pool_timeout=10.0, media_write_timeout=120.0,
        )  # fmt: skip
        # The long poll gets its own connection. PTB adds the poll timeout to this read timeout, so a
        # stalled poll is noticed after poll_timeout + 10 s.
        self._poll_request = HTTPXRequest(
            connection_pool_size=2, read_timeout=10.0, write_timeout=10.0, connect_timeout=10.0,
            pool_timeout=5.0,
        )  # fmt: skip
        self._bot: Bot | None = (
            Bot(token, base_url=base_url, base_file_url=base_file_url,
                request=self._request, get_updates_request=self._poll_request)
            if token else None
        )  # fmt: skip
        self._offset: int | None = None  # next update_id to ask for; kept across restarts of run()
        self.bot_id: int = 0
        self.bot_username: str = ""

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        self.set_state(ChannelState.STARTING)
        await self._request.initialize()
        await self._poll_request.initialize()
        try:
            bot = self._require_bot()
            await self._start(bot)
            await self._poll(bot, sink)
        except FatalChannelError as exc:
            self.set_state(ChannelState.FAILED, str(exc))
            raise
        except asyncio.CancelledError:
            self.set_state(ChannelState.STOPPED)
            raise
        except Exception as exc:
            if self.state is not ChannelState.RECONNECTING:
                self.set_state(ChannelState.RECONNECTING, f"telegram loop ended: {self._scrub(exc)}")
            raise
        finally:
            await self._poll_request.shutdown()

    async def close(self) -> None:
        await self._poll_request.shutdown()
        await self._request.shutdown()

    async def _start(self, bot: Bot) -> None:
        """getMe + deleteWebhook. Neither is retried by PTB: a network failure propagates as an
        ordinary exception so the supervisor retries the channel with backoff."""
        try:
            me = await bot.get_me()
            await bot.delete_webhook(drop_pending_updates=False)
        except tg.InvalidToken:
            raise FatalChannelError(TOKEN_REJECTED) from None
        except tg.TelegramError as exc:
            reason = f"Telegram start-up failed: {self._scrub(exc)}"
            self.set_state(ChannelState.RECONNECTING, reason)
            raise ConnectionError(reason) from None
        self.bot_id, self.bot_username = me.id, me.username or ""
        self.set_state(ChannelState.CONNECTED)
        log.info("telegram: connected as @%s", self.bot_username)

    async def _poll(self, bot: Bot, sink: InboundSink) -> None:
        """Long-poll forever. Backoff mirrors PTB's network loop: a timed-out poll is retried at once,
        other failures after 1 s growing ×1.5 up to 30 s, a 429 after its retry_after."""
        delay = 0.0
        while True:
            try:
                updates = await bot.get_updates(
                    offset=self._offset, timeout=self._poll_timeout, allowed_updates=ALLOWED_UPDATES
                )
            except tg.InvalidToken:
                raise FatalChannelError(TOKEN_REJECTED) from None
            except tg.RetryAfter as exc:
                delay = _retry_seconds(exc)
                self.set_state(ChannelState.RECONNECTING, f"Telegram rate limit; retrying in {delay:.0f}s")
            except tg.TimedOut:
                delay = 0.0
                self.set_state(ChannelState.RECONNECTING, "Telegram poll timed out")
            except tg.Conflict:
                delay = 1.0 if delay == 0 else min(30.0, delay * 1.5)
                self.set_state(ChannelState.RECONNECTING, "another poller is using this token")
            except tg.TelegramError as exc:
                delay = 1.0 if delay == 0 else min(30.0, delay * 1.5)
                self.set_state(ChannelState.RECONNECTING, f"Telegram poll failed: {self._scrub(exc)}")
            else:
                delay = 0.0
                self.touch()
                self.set_state(ChannelState.CONNECTED)
                await self._deliver(updates, sink)
                if updates or self._poll_timeout > 0:
                    continue
                delay = 1.0  # short polling (poll_timeout 0) must not spin

            if delay:
                await asyncio.sleep(delay)

    async def _deliver(self, updates: tuple[Update, ...], sink: InboundSink) -> None:
        """Hand each update to ``sink`` in order, moving the offset only past the ones it accepted.
        If the sink raises, the exception ends ``run``; the offset stays so the update comes again."""
        for update in updates:
            try:
                inbound = to_inbound(update, self.bot_id, self.bot_username)
            except Exception:  # one malformed update must not wedge the chat in a restart loop
                log.exception("telegram: skipping update %s that could not be read", update.update_id)
                inbound = None
            if inbound is not None:
                await sink(inbound)
            self._offset = max(self._offset or 0, update.update_id + 1)

    # -- rendering ------------------------------------------------------------------------------
    def render(self, markdown: str) -> list[Rendered]:
        return render_markdown(markdown, MAX_MESSAGE_UTF16)

    def render_stream(self, markdown: str) -> Rendered:
        """Plain text (half-written Markdown would flicker), cut to 4096 UTF-16 units."""
        return Rendered(truncate(markdown, MAX_MESSAGE_UTF16).rstrip() or "…")

    # -- outbound -------------------------------------------------------------------------------
    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        """Telegram has no idempotency key: exactly-once relies on the gateway's outbox."""
        bot = self._require_bot()
        kwargs: dict[str, Any] = {**self._where(target), "link_preview_options": _NO_PREVIEW}
        if target.reply_to:
            kwargs["reply_parameters"] = ReplyParameters(
                message_id=int(target.reply_to), allow_sending_without_reply=True
            )
        msg = await self._with_entity_fallback(
            part, lambda text, ents: bot.send_message(text=text, entities=ents, **kwargs)
        )
        return str(msg.message_id)

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        bot = self._require_bot()
        await self._with_entity_fallback(
            part,
            lambda text, ents: bot.edit_message_text(
                text=text, entities=ents, chat_id=_chat(target.chat_id), message_id=int(message_id),
                link_preview_options=_NO_PREVIEW,
            ),
        )  # fmt: skip

    async def typing(self, target: ReplyTarget) -> None:
        """Best effort: a missing typing indicator must never fail a turn."""
        try:
            await self._require_bot().send_chat_action(action=ChatAction.TYPING, **self._where(target))
        except tg.TelegramError as exc:
            log.debug("telegram: typing failed: %s", self._scrub(exc))

    async def react(self, target: ReplyTarget, emoji: str) -> None:
        """Best effort, and only with the reactions Telegram allows (others map or are skipped)."""
        key = emoji.replace("\ufe0f", "")
        allowed = _REACTIONS.get(key) or _REACTIONS.get(_REACTION_ALIASES.get(key, ""))
        if not target.reply_to or allowed is None:
            return
        try:
            await self._require_bot().set_message_reaction(
                chat_id=_chat(target.chat_id), message_id=int(target.reply_to), reaction=allowed
            )
        except tg.TelegramError as exc:
            log.debug("telegram: reaction failed: %s", self._scrub(exc))

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """Refuses before downloading when the announced size is over ``limit`` (or Telegram's 20 MB)."""
        self._check_size(attachment.name, attachment.size, limit)
        file = await self._api(self._require_bot().get_file(attachment.file_id))
        self._check_size(attachment.name, file.file_size, limit)
        try:
            data = bytes(await self._api(file.download_as_bytearray()))
        except FatalChannelError:
            # PTB maps any 404 to InvalidToken, but on the file server a 404 means the file path
            # expired (they live an hour) or the file is gone, not that the token was revoked.
            raise PermanentSendError(f"{attachment.name} could not be downloaded (not found)") from None
        self._check_size(attachment.name, len(data), limit)
        return data

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        """Images up to 10 MB go as photos (shown inline), anything else, or a photo Telegram
        refuses, as a document. (Telegram has no idempotency key; the gateway's outbox is all.)"""
        bot = self._require_bot()
        data, size = file.data, file.size
        if size > UPLOAD_LIMIT:
            raise PermanentSendError(f"{file.name} is {size} bytes; Telegram bots can upload at most 50 MB")
        kwargs: dict[str, Any] = {**self._where(target)}
        if caption:
            kwargs["caption"] = truncate(caption, MAX_CAPTION_UTF16)
        if target.reply_to:
            kwargs["reply_parameters"] = ReplyParameters(
                message_id=int(target.reply_to), allow_sending_without_reply=True
            )
        if file.suffix in _PHOTO_SUFFIXES and size <= PHOTO_LIMIT:
            try:
                msg = await self._api(bot.send_photo(photo=InputFile(data, filename=file.name), **kwargs))
                return str(msg.message_id)
            except PermanentSendError as exc:
                log.info("telegram: photo refused (%s); sending as a document", exc)
        msg = await self._api(bot.send_document(document=InputFile(data, filename=file.name), **kwargs))
        return str(msg.message_id)

    # -- helpers --------------------------------------------------------------------------------
    def _require_bot(self) -> Bot:
        if self._bot is None:
            raise FatalChannelError("no Telegram bot token is configured")
        return self._bot

    @staticmethod
    def _where(target: ReplyTarget) -> dict[str, Any]:
        where: dict[str, Any] = {"chat_id": _chat(target.chat_id)}
        if target.thread_id:
            where["message_thread_id"] = int(target.thread_id)
        return where

    async def _with_entity_fallback(self, part: Rendered, call: Any) -> telegram.Message:
        """Send with entities; if Telegram refuses them (a bad link, an entity it cannot parse),
        send the same text once more without formatting rather than lose the message."""
        raw = part.payload.get("entities") or []
        entities = [MessageEntity.de_json(e, None) for e in raw] or None
        text = part.text if part.text.strip() else "…"
        try:
            result: telegram.Message = await self._api(call(text, entities))
            return result
        except PermanentSendError as exc:
            msg = str(exc).lower()
            if not entities or not ("entit" in msg or "url" in msg):
                raise
            log.warning("telegram: formatting refused (%s); resending as plain text", exc)
        result = await self._api(call(text, None))
        return result

    async def _api(self, call: Awaitable[T]) -> T:
        """Await a PTB call, turning its errors into the contract's (without the token)."""
        try:
            return await call
        except tg.TelegramError as exc:
            raise self._map_error(exc) from None

    def _map_error(self, exc: tg.TelegramError) -> ChannelError:
        text = self._scrub(exc)
        if isinstance(exc, tg.RetryAfter):
            return RetryAfter(_retry_seconds(exc), "Telegram rate limit")
        if isinstance(exc, tg.InvalidToken):
            return FatalChannelError(TOKEN_REJECTED)
        if isinstance(exc, tg.BadRequest):  # before NetworkError: BadRequest subclasses it
            if "message is not modified" in text.lower():
                return NotModified(text)
            return PermanentSendError(text)
        if isinstance(exc, tg.Forbidden | tg.ChatMigrated):
            return PermanentSendError(text)
        return TransientSendError(text)

    def _scrub(self, exc: BaseException | str) -> str:
        text = str(exc) or type(exc).__name__
        return text.replace(self._token, "***") if self._token else text

    @staticmethod
    def _check_size(name: str, size: int | None, limit: int) -> None:
        if size is not None and size > limit:
            raise PermanentSendError(f"{name} is {size} bytes, over the {limit}-byte limit for attachments")
        if size is not None and size > GETFILE_LIMIT:
            raise PermanentSendError(f"{name} is {size} bytes; Telegram lets bots download at most 20 MB")


def _chat(chat_id: str) -> int | str:
    """Numeric chat ids as ints; ``@channelusername`` stays a string."""
    return int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id


def _retry_seconds(exc: tg.RetryAfter) -> float:
    value = getattr(exc, "_retry_after", None)  # PTB ≥22.2 keeps a timedelta here
    if isinstance(value, dtm.timedelta):
        return value.total_seconds()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ra = exc.retry_after
    return ra.total_seconds() if isinstance(ra, dtm.timedelta) else float(ra)


__all__ = ["TelegramChannel"]
