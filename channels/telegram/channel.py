"""The Telegram adapter: python-telegram-bot's ``Bot`` for every API call, our own long-poll loop.

Why not PTB's ``Updater``: it confirms a batch (moves the offset) as soon as it fetched it, before any
handler ran, so a crash loses those messages. Here an update is handed to ``sink`` (which journals
it) before the offset moves past it; after a crash Telegram serves it again and the journal drops the
duplicate.

Malformed updates: PTB's ``get_updates`` parses the whole batch at once, so one update it cannot
parse (an old-shape poll, a missing ``date``, a string where an object belongs) fails the batch, and
the offset never moves past it: polling wedged for every chat, across restarts. We fetch the batch
raw and parse each update alone; one that cannot be parsed or journaled is skipped through
:meth:`Channel.skip_unreadable` (counted, logged without its text, the sender told when the raw
JSON names them) and the offset moves past it.

Token errors: a 401/404 is confirmed before it is believed (see :meth:`TelegramChannel._get_me`).

Logging: PTB and httpx put the request URL, which contains the token, into DEBUG/INFO records:
gateway/ops/logs.py keeps both loggers at WARNING and redacts every record; the error texts this module
builds are scrubbed of the token (:func:`channels.base.scrub`).

Bot API parameters, reactions and the mapping of PTB's errors live in :mod:`channels.telegram.botapi`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import httpx
import telegram
from telegram import Bot, MessageEntity, ReplyParameters, Update
from telegram import error as tg
from telegram.constants import ChatAction
from telegram.request import HTTPXRequest

from channels import malformed
from channels.base import (
    ActionAnswer,
    Attachment,
    Button,
    Capabilities,
    Channel,
    ChannelError,
    ContextItem,
    FatalChannelError,
    Inbound,
    InboundSink,
    Menu,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    replied_item,
)

from . import botapi, menus, sdk, uploads
from .albums import ALBUM_POLL, Albums, group_of
from .botapi import NO_PREVIEW, TOKEN_REJECTED, check_download, post, retry_seconds, where
from .inbound import recover_ids, reject_nulls, to_action, to_inbound, update_body
from .render import MAX_MESSAGE_UTF16, render_markdown, truncate
from .settings import TelegramSettings

log = logging.getLogger(__name__)
DEFAULTS = TelegramSettings()

T = TypeVar("T")

START_RETRIES = 3
"""getMe answers that are errors (5xx, 429) retried inside one start before the supervisor's turn."""
# Only new messages: an edit would re-run a turn the agent already answered (one inbound message, at
# most one reply thread), so edited_message is deliberately not requested.
ALLOWED_UPDATES = ("message", "callback_query")  # callback_query: presses of our buttons
POLL_RETRY_CAP = 5.0


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
        max_upload_bytes=uploads.UPLOAD_LIMIT,
        buttons=True,
    )
    can_send_only = True

    def __init__(
        self,
        token: str,
        *,
        base_url: str = DEFAULTS.base_url,
        base_file_url: str = DEFAULTS.base_file_url,
        poll_timeout: int = DEFAULTS.poll_timeout,
        auth_recheck_delay: float = 1.0,
        auth_rechecks: int = 2,
        album_wait: float = DEFAULTS.album_wait,
    ) -> None:
        super().__init__()
        self._token = token
        self._poll_timeout = poll_timeout
        self._auth_recheck_delay = auth_recheck_delay
        self._auth_rechecks = auth_rechecks
        # Both clients verify with one TLS context, made as httpx makes its default one (certifi,
        # or SSL_CERT_FILE/SSL_CERT_DIR): each context holds its own copy of the CA store, ~0.7 MB.
        # Sharing is safe because both speak HTTP/1.1 only: httpcore sets the same ALPN list on
        # the context before every connection.
        tls = {"verify": httpx.create_ssl_context()}
        # Sends, edits, typing and downloads share one pool, big enough for many chats at once.
        self._request = HTTPXRequest(
            connection_pool_size=32, read_timeout=20.0, write_timeout=20.0, connect_timeout=10.0,
            pool_timeout=10.0, media_write_timeout=120.0, http_version="1.1", httpx_kwargs=tls,
        )  # fmt: skip
        # The long poll gets its own connection. PTB adds the poll timeout to this read timeout, so a
        # stalled poll is noticed after poll_timeout + 10 s.
        self._poll_request = HTTPXRequest(
            connection_pool_size=2, read_timeout=10.0, write_timeout=10.0, connect_timeout=10.0,
            pool_timeout=5.0, http_version="1.1", httpx_kwargs=tls,
        )  # fmt: skip
        self._bot: Bot | None = (
            Bot(token, base_url=base_url, base_file_url=base_file_url,
                request=self._request, get_updates_request=self._poll_request)
            if token else None
        )  # fmt: skip
        self._offset: int | None = None  # next update_id to ask for; kept across restarts of run()
        self._albums = Albums(quiet=album_wait)  # media groups being gathered (channels/telegram/albums.py)
        self.bot_id: int = 0
        self.bot_username: str = ""

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        await self._request.initialize()
        await self._poll_request.initialize()
        try:
            bot = self._require_bot()
            await self._start(bot)
            if not self.receive:  # a standby daemon: sends only; the leader polls (gateway/daemon/cluster.py)
                await asyncio.Event().wait()
            await self._poll(bot, sink)
        finally:
            await self._poll_request.shutdown()

    async def close(self) -> None:
        await self._poll_request.shutdown()
        await self._request.shutdown()

    async def disconnect(self) -> None:
        """Only the long poll's connection: sends in flight keep their pool across a restart."""
        await self._poll_request.shutdown()

    async def _start(self, bot: Bot) -> None:
        """getMe + deleteWebhook. Neither is retried by PTB. An error *answer* (5xx, 429) is
        retried here a few times with backoff: the server is reachable and such blips clear in
        seconds. A network failure, or errors that persist, propagate as an ordinary exception so
        the supervisor restarts the channel with its longer backoff."""
        delay = 0.5
        for attempt in range(START_RETRIES + 1):
            try:
                me = await self._get_me(bot)
                await bot.delete_webhook(drop_pending_updates=False)
                break
            except tg.InvalidToken:  # deleteWebhook after a good getMe: the token is fine
                reason = "Telegram start-up failed: deleteWebhook answered 401/404"
            except tg.RetryAfter as exc:
                reason, delay = "Telegram start-up rate limited", max(delay, retry_seconds(exc))
            except tg.TelegramError as exc:
                reason = f"Telegram start-up failed: {self._scrub(exc)}"
                if isinstance(exc, tg.TimedOut) or str(exc).startswith("httpx."):
                    attempt = START_RETRIES  # no answer at all: the supervisor's backoff
            self.report_trouble(reason)
            if attempt >= START_RETRIES:
                raise ConnectionError(reason) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
        self.bot_id, self.bot_username = me.id, me.username or ""
        self.report_connected()
        log.info("telegram: connected as @%s", self.bot_username)

    async def _get_me(self, bot: Bot) -> telegram.User:
        """getMe, believing a 401/404 only when it is confirmed.

        Why: a proxy or a self-hosted Bot API server being redeployed can answer 401 for a moment,
        and a FatalChannelError keeps the channel down until a human acts. A revoked token answers
        401 every time, so getMe is asked ``auth_rechecks`` more times, ``auth_recheck_delay`` s
        apart (doubling); only when every answer is 401/404 is the token declared rejected. Any
        other error propagates (transient, the caller retries)."""
        try:
            return await bot.get_me()
        except tg.InvalidToken:
            pass
        delay = self._auth_recheck_delay
        for _ in range(self._auth_rechecks):
            self.report_trouble("Telegram answered 401; checking the token again")
            await asyncio.sleep(delay)
            delay *= 2
            try:
                return await bot.get_me()
            except tg.InvalidToken:
                continue
        raise FatalChannelError(
            f"{TOKEN_REJECTED}: getMe answered 401 on {self._auth_rechecks + 1} checks in a row; "
            "the token is revoked or wrong, set a valid one"
        )

    async def _fetch(self, bot: Bot) -> list[Any]:
        """One getUpdates long poll, unparsed (see the module docstring for why; the raw call is
        channels/telegram/sdk.py's)."""
        # An open album holds the offset at its first member until journaled; the poll does not wait.
        held = self._albums.held_from()
        offset = self._offset if held is None else min(held, self._offset or held)
        timeout = 0 if self._albums else self._poll_timeout
        read_timeout = (self._poll_request.read_timeout or 0) + timeout
        params = {"offset": offset, "timeout": timeout, "allowed_updates": ALLOWED_UPDATES}
        result = await sdk.post(bot, "getUpdates", params, read_timeout=read_timeout)
        if not isinstance(result, list):
            raise tg.NetworkError("getUpdates answered something other than a list")
        return result

    async def _poll(self, bot: Bot, sink: InboundSink) -> None:
        """Long-poll forever. Backoff like PTB's network loop: a timed-out poll is retried at once,
        other failures after 1 s growing ×1.5 (up to 5 s for 5xx/network, 30 s otherwise), a 429
        after its retry_after."""
        delay = 0.0
        while True:
            try:
                updates = await self._fetch(bot)
            except tg.InvalidToken:
                # Fatal only when getMe confirms it; otherwise poll again after a pause.
                delay = 1.0 if delay == 0 else min(30.0, delay * 1.5)
                try:
                    await self._get_me(bot)
                except tg.TelegramError as exc:
                    reason = f"Telegram poll answered 401, then: {self._scrub(exc)}"
                else:
                    reason = "Telegram poll answered 401 once; the token checks out"
                self.report_trouble(reason)
            except tg.RetryAfter as exc:
                delay = retry_seconds(exc)
                self.report_trouble(f"Telegram rate limit; retrying in {delay:.0f}s")
            except tg.TimedOut:
                delay = 0.0
                self.report_trouble("Telegram poll timed out")
            except tg.Conflict:
                delay = 1.0 if delay == 0 else min(30.0, delay * 1.5)
                self.report_trouble("another poller is using this token")
            except tg.TelegramError as exc:
                # 5xx and network failures: capped at 5 s (not PTB's 30 s) so that after an outage
                # the waiting messages arrive, and the parked answers go out, within seconds.
                delay = 1.0 if delay == 0 else min(POLL_RETRY_CAP, delay * 1.5)
                self.report_trouble(f"Telegram poll failed: {self._scrub(exc)}")
            else:
                delay = 0.0
                self.report_connected()
                await self._deliver(updates, sink)
                if self._albums:  # gathering an album: look again shortly (the poll does not wait)
                    await asyncio.sleep(min(ALBUM_POLL, self._albums.wait()))
                    continue
                if updates or self._poll_timeout > 0:
                    continue
                delay = 1.0  # short polling (poll_timeout 0) must not spin

            if delay:
                await asyncio.sleep(delay)

    async def _deliver(self, updates: list[Any], sink: InboundSink) -> None:
        """Hand each update to ``sink`` in order, moving the offset only past the ones it accepted
        or skipped as unreadable. If the sink raises otherwise, the exception ends ``run``; the
        offset stays so the update comes again. An update that is not the shape it announces (a
        null ``message``, no body at all, no update id) is malformed: skipped and counted."""
        bot = self._require_bot()
        for raw in updates:
            uid = raw.get("update_id") if isinstance(raw, dict) else None
            if self._albums.handled(uid):
                continue  # served again because an open album holds the offset back
            body = update_body(raw)
            if body == "callback_query":
                await self._press(raw)
            elif body is None:
                ids = recover_ids(raw, self.bot_id, self.bot_username)
                await self.skip_unreadable(sink, ValueError("an update without a readable body"),
                                           kind=malformed.ENVELOPE, **ids)  # fmt: skip
            else:
                try:
                    reject_nulls(raw)
                    update = Update.de_json(raw, bot)
                    inbound = to_inbound(update, self.bot_id, self.bot_username)
                except Exception as exc:  # anything PTB or we cannot read: skip, never wedge
                    await self.skip_unreadable(sink, exc, **recover_ids(raw, self.bot_id, self.bot_username))
                else:
                    group = group_of(raw) if inbound is not None and inbound.attachments else None
                    if inbound is not None and group is not None and isinstance(uid, int):
                        self._albums.add(uid, inbound, group)  # handed over with its album
                    elif inbound is not None and not self._albums.behind(uid, inbound):
                        # (one behind an open album of its conversation is handed over after it)
                        await self.hand_over(sink, inbound, ref=f"update {uid}")
            if isinstance(uid, int) and not isinstance(uid, bool):
                self._offset = max(self._offset or 0, uid + 1)
                self._albums.mark(uid)
        await self._albums.hand_over_due(lambda album, ref: self.hand_over(sink, album, ref=ref))

    async def _press(self, raw: dict[str, Any]) -> None:
        """A button press: handed to the gateway (which journals it), then answered, so the
        presser's spinner stops with what the gateway said (an alert when it was refused). The
        offset moves on only after that; a ChannelError (shutdown) leaves it for redelivery. A
        press whose payload cannot be read is counted and answered with an alert saying so."""
        action = to_action(raw)
        if action is None:
            self.count_malformed(malformed.ACTION)
            log.warning("telegram: a button press without its data, sender or message; refused")
            answer = ActionAnswer(malformed.ACTION_UNREADABLE, refused=True)
        else:
            answer = await self.hand_action(action)
        query = raw.get("callback_query")
        query_id = query.get("id") if isinstance(query, dict) else None
        if not malformed.is_id(query_id):
            return
        params: dict[str, Any] = {"callback_query_id": query_id}
        if answer.text:
            params.update(text=answer.text[:200], show_alert=answer.refused)
        try:
            await self._api(post(self._require_bot(), "answerCallbackQuery", params))
        except ChannelError as exc:  # the press counted; only the toast is lost
            log.warning("telegram: could not answer a button press: %s", exc)

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
        kwargs: dict[str, Any] = {**where(target), "link_preview_options": NO_PREVIEW}
        if target.reply_to and target.reply_to.isdigit():  # unreadable messages may have none
            kwargs["reply_parameters"] = ReplyParameters(
                message_id=int(target.reply_to), allow_sending_without_reply=True
            )
        result = await self._with_entity_fallback(
            part, lambda text, ents: post(bot, "sendMessage", {**kwargs, "text": text, "entities": ents})
        )
        return str(result.get("message_id", "")) if isinstance(result, dict) else ""

    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        """The message with an inline keyboard (one row); presses come back as callback queries.
        ``close_buttons`` is a plain edit: editMessageText without ``reply_markup`` drops them."""
        bot = self._require_bot()
        markup = {"inline_keyboard": [[{"text": b.label, "callback_data": b.value} for b in buttons]]}
        kwargs: dict[str, Any] = {**where(target), "link_preview_options": NO_PREVIEW}
        kwargs["reply_markup"] = markup
        result = await self._with_entity_fallback(
            part, lambda text, ents: post(bot, "sendMessage", {**kwargs, "text": text, "entities": ents})
        )
        return str(result.get("message_id", "")) if isinstance(result, dict) else ""

    def can_preview(self, target: ReplyTarget) -> bool:
        """Drafts exist in private chats only (a user's id is its DM chat's id, always > 0)."""
        return target.chat_id.isdigit()

    async def preview(self, target: ReplyTarget, key: str, part: Rendered) -> None:
        """sendMessageDraft: an ephemeral, animated preview of the answer so far. Nothing of it
        stays in the chat, so a crash mid-stream leaves no half answer behind; the final answer
        is then sent as the one real message."""
        bot = self._require_bot()
        draft_id = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest()) % (2**31 - 1) + 1
        params = {**where(target), "draft_id": draft_id}
        await self._with_entity_fallback(
            part,
            lambda text, ents: post(bot, "sendMessageDraft", {**params, "text": text, "entities": ents}),
        )

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        bot = self._require_bot()
        await self._with_entity_fallback(
            part,
            lambda text, ents: post(bot, "editMessageText", {
                "text": text, "entities": ents, "chat_id": botapi.chat(target.chat_id),
                "message_id": int(message_id), "link_preview_options": NO_PREVIEW,
            }),
        )  # fmt: skip

    async def typing(self, target: ReplyTarget) -> None:
        """Best effort: a missing typing indicator must never fail a turn."""
        try:
            await self._require_bot().send_chat_action(action=ChatAction.TYPING, **where(target))
        except tg.TelegramError as exc:
            log.debug("telegram: typing failed: %s", self._scrub(exc))

    async def react(self, target: ReplyTarget, emoji: str) -> None:
        """Best effort, and only with the reactions Telegram allows (others map or are skipped)."""
        allowed = botapi.reaction(emoji)
        if not target.reply_to or not target.reply_to.isdigit() or allowed is None:
            return
        try:
            await self._require_bot().set_message_reaction(
                chat_id=botapi.chat(target.chat_id), message_id=int(target.reply_to), reaction=allowed
            )
        except tg.TelegramError as exc:
            log.debug("telegram: reaction failed: %s", self._scrub(exc))

    async def register_commands(self, menu: Menu) -> str:
        """setMyCommands per scope (channels/telegram/menus.py)."""
        return await self._api(menus.publish(self._require_bot(), menu))

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """Refuses before downloading when the announced size is over ``limit`` (or Telegram's 20 MB)."""
        check_download(attachment.name, attachment.size, limit)
        file = await self._api(self._require_bot().get_file(attachment.file_id))
        check_download(attachment.name, file.file_size, limit)
        try:
            data = bytes(await self._api(file.download_as_bytearray()))
        except FatalChannelError:
            # PTB maps any 404 to InvalidToken, but on the file server a 404 means the file path
            # expired (they live an hour) or the file is gone, not that the token was revoked.
            raise PermanentSendError(f"{attachment.name} could not be downloaded (not found)") from None
        check_download(attachment.name, len(data), limit)
        return data

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        """See :func:`.uploads.send_file` (photo, voice message or document)."""
        return await uploads.send_file(self._api, self._require_bot(), target, file, caption)

    async def thread_context(self, inbound: Inbound, limit: int, max_chars: int) -> Sequence[ContextItem]:
        """The message replied to, as the update carried it (bots cannot read a chat's history)."""
        item = replied_item(inbound)
        return (item,) if item is not None and limit > 0 else ()

    # -- helpers --------------------------------------------------------------------------------
    def _require_bot(self) -> Bot:
        if self._bot is None:
            raise FatalChannelError("no Telegram bot token is configured")
        return self._bot

    async def _with_entity_fallback(self, part: Rendered, call: Any) -> Any:
        """Send with entities; if Telegram refuses them (a bad link, an entity it cannot parse),
        send the same text once more without formatting rather than lose the message."""
        raw = part.payload.get("entities") or []
        entities = [MessageEntity.de_json(e, None) for e in raw] or None
        text = part.text if part.text.strip() else "…"
        try:
            return await self._api(call(text, entities))
        except PermanentSendError as exc:
            msg = str(exc).lower()
            if not entities or not ("entit" in msg or "url" in msg):
                raise
            log.warning("telegram: formatting refused (%s); resending as plain text", exc)
        return await self._api(call(text, None))

    async def _api(self, call: Awaitable[T]) -> T:
        """Await a PTB call, turning its errors into the contract's (without the token)."""
        try:
            return await call
        except tg.TelegramError as exc:
            raise botapi.map_error(exc, self._token) from None

    def _scrub(self, exc: BaseException | str) -> str:
        return botapi.error_text(exc, self._token)


__all__ = ["TelegramChannel"]
