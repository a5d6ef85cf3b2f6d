"""A fake Telegram Bot API server for tests and benchmarks.

It speaks the Bot API the way python-telegram-bot 22.8 uses it (``/bot<TOKEN>/<method>``, form,
multipart or JSON bodies, ``{"ok": true, "result": ...}`` answers, the real error codes), keeps every
piece of state itself (so a daemon in another process can be driven and observed), and records what
the bot did as the user would see it. Long polls wake on an :class:`asyncio.Event`, never by sleeping.

Usage::

    async with FakeTelegram() as fake:
        channel = TelegramChannel(fake.token, base_url=fake.base_url, base_file_url=fake.base_file_url)
        fake.inject_message(42, 42, "hello")
        await fake.wait_for(lambda: fake.bot_texts(42))
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from tests.fakes.telegram_methods import BotApiMethods
from tests.fakes.telegram_wire import (
    DESCRIPTIONS,
    ApiError,
    Call,
    Failure,
    Held,
    Seen,
    StoredFile,
    auto_entities,
    entity_text,
    file_ext,
    read_params,
    utf16_len,
)

__all__ = ["Call", "FakeTelegram", "Seen", "auto_entities", "entity_text", "utf16_len"]

T = TypeVar("T")


class FakeTelegram(BotApiMethods):
    """An aiohttp Bot API server on 127.0.0.1 with helpers to script users and inspect the bot."""

    platform = "telegram"
    """The channel name in the config and in user ids (``telegram:<id>``)."""

    def __init__(
        self,
        token: str = "123456789:TEST-fake-token_abcdefghijklmnopqrs",
        *,
        bot_id: int = 7000001,
        username: str = "chital_bot",
        first_name: str = "Chital",
    ) -> None:
        self.token = token
        self.bot_user = {"id": bot_id, "is_bot": True, "first_name": first_name, "username": username}
        self.calls: list[Call] = []
        self.poll_conflicts = 0
        """getUpdates calls cut short by a newer one (Telegram's 409 Conflict): two pollers."""
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._pending: list[dict[str, Any]] = []  # unconfirmed updates, ascending update_id
        self._forced: list[dict[str, Any]] = []  # redelivered: served whatever the offset
        self._update_ids = itertools.count(500_000_001)
        self._file_ids = itertools.count(1)
        self._chats: dict[int, dict[str, Any]] = {}
        self._next_mid: dict[int, int] = {}
        self._messages: dict[int, dict[int, Seen]] = {}
        self._files: dict[str, StoredFile] = {}
        self.voice_forbidden: set[int] = set()
        """Chats whose user's privacy settings refuse voice messages (``VOICE_MESSAGES_FORBIDDEN``)."""
        self._failures: dict[str, list[Failure]] = {}
        self._lost: dict[str, int] = {}
        self._held: list[Held] = []
        self.drafts: list[tuple[int, int, str]] = []
        self.answered_queries: dict[str, dict[str, Any]] = {}
        """answerCallbackQuery parameters by callback query id (the presser's toast or alert)."""
        self._query_ids = itertools.count(1)
        """(chat id, draft id, text) of every sendMessageDraft: previews that leave no message."""
        self.down_methods: set[str] = set()
        self.after_call: Callable[[str, dict[str, Any]], None] | None = None
        """Called once a call took effect, before its answer is sent (crash-window benchmarks)."""
        self.before_call: Callable[[str, dict[str, Any]], None] | None = None
        """Called when a call arrives, before it takes effect (kill the bot there, then
        ``fail_next(method, 0)``: the call never reached Telegram)."""
        """Methods answering 502 Bad Gateway until removed (an outage of part of the Bot API)."""
        self._blocked: set[int] = set()
        self._revoked = False
        self._stalled = False
        self._closing = False
        self._poll_gen = 0
        self._allowed: list[str] | None = None
        self.commands: list[Any] = []  # the default scope's
        self.my_commands: dict[tuple[str, int | None, str], list[dict[str, str]]] = {}
        """setMyCommands per (scope type, chat id, language code): the menus the bot published."""
        self._changed = asyncio.Event()
        self.webhook_deleted = 0

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    @property
    def base_file_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/file/bot"

    def channel_settings(self, poll_timeout: float = 2) -> dict[str, Any]:
        """``channels.telegram`` of a config that talks to this fake: the one factory the tests
        share (a token, this server's addresses, a short long-poll so a stop is quick)."""
        return {
            "enabled": True,
            "token": self.token,
            "base_url": self.base_url,
            "base_file_url": self.base_file_url,
            "poll_timeout": poll_timeout,
        }

    @property
    def username(self) -> str:
        return str(self.bot_user["username"])

    async def start(self) -> FakeTelegram:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/bot{token}/{method}", self._handle_api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._handle_file)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[union-attr]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._closing = False
        return self

    async def stop(self) -> None:
        """Stop serving; waiting polls answer at once. ``start()`` again reuses the port and state."""
        self._closing = True
        self._bump()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeTelegram:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- scripting users -------------------------------------------------------------------------
    def inject_message(
        self,
        chat_id: int,
        user_id: int,
        text: str,
        *,
        chat_type: str = "private",
        first_name: str = "U",
        entities: list[dict[str, Any]] | None = None,
        reply_to_bot: bool = False,
        reply_to_message_id: int | None = None,
        message_thread_id: int | None = None,
        is_topic: bool = False,
        document: dict[str, Any] | None = None,
        photo: list[dict[str, Any]] | None = None,
        voice: dict[str, Any] | None = None,
        chat_title: str = "Test group",
        from_bot: bool = False,
        quote: str | None = None,
        forwarded_from: str | None = None,
        media_group_id: str | None = None,
    ) -> dict[str, Any]:
        """Queue a user's message as an update and return that update.

        ``media_group_id`` makes it a member of an album (:meth:`inject_album` sends a whole one).

        ``forwarded_from`` makes it a forward of a message by a user of that name (a
        ``hidden_user`` origin, as Telegram sends when the author hides their account).

        ``entities=None`` lets the fake attach the mention / bot_command entities Telegram would.
        With ``document``, ``photo`` or ``voice`` (from :meth:`add_file` / :meth:`add_photo` /
        :meth:`add_voice`) ``text`` becomes the caption. ``is_topic`` puts the message in forum
        topic ``message_thread_id``.
        """
        chat = self._chat(chat_id, chat_type, first_name, chat_title, forum=is_topic)
        sender = {"id": user_id, "is_bot": from_bot, "first_name": first_name}
        mid = self._new_mid(chat_id)
        msg: dict[str, Any] = {"message_id": mid, "date": int(time.time()), "chat": chat, "from": sender}
        ents = auto_entities(text) if entities is None else entities
        if document is not None or photo is not None or voice is not None:
            if document is not None:
                msg["document"] = document
            if photo is not None:
                msg["photo"] = photo
            if voice is not None:
                msg["voice"] = voice
            if text:
                msg["caption"] = text
                if ents:
                    msg["caption_entities"] = ents
        else:
            msg["text"] = text
            if ents:
                msg["entities"] = ents
        if is_topic and message_thread_id is not None:
            msg["message_thread_id"] = message_thread_id
            msg["is_topic_message"] = True
        if media_group_id is not None:
            msg["media_group_id"] = media_group_id
        if forwarded_from is not None:
            msg["forward_origin"] = {"type": "hidden_user", "sender_user_name": forwarded_from,
                                     "date": int(time.time()) - 60}  # fmt: skip
        reply_id = reply_to_message_id
        if reply_to_bot and reply_id is None:
            reply_id = self._last_bot_message(chat_id, message_thread_id) or self._synthetic_bot_message(
                chat_id, message_thread_id if is_topic else None
            )
        if reply_id is not None:
            msg["reply_to_message"] = self._messages[chat_id][reply_id].raw
            if quote is not None:  # the part of it the user picked out (Bot API 7.0 TextQuote)
                msg["quote"] = {"text": quote, "position": 0}
        elif is_topic and message_thread_id is not None:
            # Telegram makes every topic message a reply to the topic's creation service message.
            msg["reply_to_message"] = {
                "message_id": message_thread_id,
                "date": int(time.time()),
                "chat": chat,
                "from": sender,
                "message_thread_id": message_thread_id,
                "forum_topic_created": {"name": "Topic", "icon_color": 7322096},
            }
        self._store(msg, from_bot=from_bot)
        return self.push_update({"message": msg})

    def inject_album(
        self, chat_id: int, user_id: int, items: list[dict[str, Any]], caption: str = "", **kw: Any
    ) -> list[dict[str, Any]]:
        """An album, as the Bot API sends one: a ``message`` update per item (``{"photo": [...]}``
        or ``{"document": {...}}``), consecutive message ids, one shared ``media_group_id``, the
        caption on the first item only. Returns the updates."""
        group = str(next(self._update_ids) * 7919 + 10**17)
        return [
            self.inject_message(
                chat_id, user_id, caption if i == 0 else "", media_group_id=group, **item, **kw
            )
            for i, item in enumerate(items)
        ]

    def inject_mention(self, chat_id: int, user_id: int, text: str, **kw: Any) -> dict[str, Any]:
        """A group message that starts with ``@<bot username>`` (a mention entity)."""
        kw.setdefault("chat_type", "supergroup")
        return self.inject_message(chat_id, user_id, f"@{self.username} {text}", **kw)

    def inject_command(
        self, chat_id: int, user_id: int, command: str, args: str = "", *, at: str | None = "", **kw: Any
    ) -> dict[str, Any]:
        """``/command[@bot] args`` with a bot_command entity at offset 0. ``at=""`` means our bot,
        ``at=None`` no suffix, any other value that bot's username."""
        kw.setdefault("chat_type", "supergroup")
        suffix = "" if at is None else f"@{at or self.username}"
        text = f"/{command.lstrip('/')}{suffix}" + (f" {args}" if args else "")
        return self.inject_message(chat_id, user_id, text, **kw)

    def inject_content(
        self,
        chat_id: int,
        user_id: int,
        content: dict[str, Any],
        *,
        chat_type: str = "private",
        first_name: str = "U",
    ) -> dict[str, Any]:
        """A message without text whose content is ``content`` (``{"sticker": {...}}``, see
        :mod:`tests.fakes.telegram_kinds`)."""
        chat = self._chat(chat_id, chat_type, first_name, "Test group", forum=False)
        msg: dict[str, Any] = {"message_id": self._new_mid(chat_id), "date": int(time.time()), "chat": chat,
                               "from": {"id": user_id, "is_bot": False, "first_name": first_name}, **content}  # fmt: skip
        self._store(msg, from_bot=False)
        return self.push_update({"message": msg})

    def message_template(
        self, chat_id: int, user_id: int, text: str, chat_type: str = "private"
    ) -> dict[str, Any]:
        """A well-formed user message in a registered chat, not queued: for tests to break and
        :meth:`push_update` themselves."""
        chat = self._chat(chat_id, chat_type, "U", "Test group", forum=False)
        return {"message_id": self._new_mid(chat_id), "date": int(time.time()), "chat": chat,
                "from": {"id": user_id, "is_bot": False, "first_name": "U"}, "text": text}  # fmt: skip

    def inject_malformed(
        self,
        chat_id: int,
        user_id: int,
        text: str = "secret words",
        *,
        drop: tuple[str, ...] = (),
        override: dict[str, Any] | None = None,
        chat_type: str = "private",
    ) -> dict[str, Any]:
        """An update PTB cannot parse: a normal message with the keys in ``drop`` removed and
        ``override`` merged in (``{"chat": "oops"}``, an old-shape ``poll`` ...). The chat is
        registered so the bot can answer into it; the message is not kept in its history."""
        chat = self._chat(chat_id, chat_type, "U", "Test group", forum=False)
        msg: dict[str, Any] = {"message_id": self._new_mid(chat_id), "date": int(time.time()), "chat": chat,
                               "from": {"id": user_id, "is_bot": False, "first_name": "U"}, "text": text}  # fmt: skip
        for key in drop:
            msg.pop(key, None)
        msg.update(override or {})
        return self.push_update({"message": msg})

    def press_button(
        self, chat_id: int, message_id: int, user_id: int, text: str, *, first_name: str = "U"
    ) -> dict[str, Any]:
        """A user presses the inline button labelled ``text`` (or containing it) under a bot
        message: a ``callback_query`` update carrying its ``callback_data``, as Telegram sends it."""
        seen = self._messages[chat_id][message_id]
        rows = (seen.raw.get("reply_markup") or {}).get("inline_keyboard") or []
        button = next((b for row in rows for b in row if text in b["text"]), None)
        if button is None:
            raise AssertionError(f"no button {text!r} under message {message_id}")
        return self.push_update({"callback_query": {
            "id": f"Q{next(self._query_ids)}",
            "from": {"id": user_id, "is_bot": False, "first_name": first_name},
            "message": seen.raw,
            "chat_instance": str(chat_id),
            "data": button["callback_data"],
        }})  # fmt: skip

    def buttons(self, chat_id: int, message_id: int) -> list[str]:
        """Labels of the inline buttons under a message now."""
        rows = (self._messages[chat_id][message_id].raw.get("reply_markup") or {}).get(
            "inline_keyboard"
        ) or []
        return [b["text"] for row in rows for b in row]

    def push_update(self, body: dict[str, Any]) -> dict[str, Any]:
        """Queue an arbitrary update (``{"edited_message": ...}`` etc.); the update_id is assigned."""
        update = {"update_id": next(self._update_ids), **body}
        self._pending.append(update)
        self._bump()
        return update

    def redeliver(self, update: dict[str, Any]) -> None:
        """Serve ``update`` again with its same update_id, as Telegram does when the bot's offset never
        moved past it (e.g. a crash between fetching and confirming). It is served to the next poll
        whatever offset that poll carries."""
        self._forced.append(update)
        self._bump()

    def add_file(
        self,
        data: bytes,
        *,
        file_name: str = "file.bin",
        mime_type: str = "application/octet-stream",
        declared_size: int | None = None,
    ) -> dict[str, Any]:
        """Store a file and return a Document dict for :meth:`inject_message`. ``declared_size``
        overrides the size the update announces (the real size is still served by getFile)."""
        f = self._new_file(data, file_name, mime_type, "documents")
        return {
            "file_id": f.file_id,
            "file_unique_id": f.unique_id,
            "file_name": file_name,
            "mime_type": mime_type,
            "file_size": len(data) if declared_size is None else declared_size,
        }

    def add_photo(self, data: bytes, *, width: int = 800, height: int = 600) -> list[dict[str, Any]]:
        """Store a photo and return its PhotoSize list (a small thumbnail, then the full size)."""
        thumb = self._new_file(data[: max(1, len(data) // 10)], "thumb.jpg", "image/jpeg", "photos")
        full = self._new_file(data, "photo.jpg", "image/jpeg", "photos")
        return [
            {"file_id": thumb.file_id, "file_unique_id": thumb.unique_id, "width": width // 10,
             "height": height // 10, "file_size": len(thumb.data)},
            {"file_id": full.file_id, "file_unique_id": full.unique_id, "width": width,
             "height": height, "file_size": len(full.data)},
        ]  # fmt: skip

    def add_voice(self, data: bytes, *, duration: int = 3) -> dict[str, Any]:
        """Store a voice note (Ogg Opus, as the app records it) and return its Voice dict."""
        f = self._new_file(data, "voice.ogg", "audio/ogg", "voice")
        return {"file_id": f.file_id, "file_unique_id": f.unique_id, "duration": duration,
                "mime_type": "audio/ogg", "file_size": len(data)}  # fmt: skip

    # -- failure injection -----------------------------------------------------------------------
    def fail_next(
        self,
        method: str,
        status: int,
        times: int = 1,
        retry_after: int | None = None,
        description: str | None = None,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` ("*" = any) with an error. ``status=0`` drops
        the connection without an answer (a network failure)."""
        self._failures.setdefault(method, []).append(Failure(status, times, retry_after, description))

    def lose_answer_next(self, method: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` take effect (a sent message is in the chat), then
        the connection drops before the answer: the bot cannot know the call succeeded."""
        self._lost[method] = self._lost.get(method, 0) + times

    def hold_answer(
        self, method: str, when: Callable[[dict[str, Any]], bool] = lambda params: True, *, skip: int = 0
    ) -> asyncio.Event:
        """The next call of ``method`` for which ``when(params)`` holds (after ``skip`` such calls)
        takes effect (a sent message is in the chat), but its answer is held until the returned
        event is set: the bot is caught between a call and its result for as long as the test needs
        (a /stop landing while approval buttons are being posted), with no timing guess."""
        held = Held(method, when, skip, asyncio.Event())
        self._held.append(held)
        return held.release

    @property
    def holding(self) -> int:
        """How many answers are held back right now."""
        return sum(1 for h in self._held if h.waiting)

    def revoke_token(self, revoked: bool = True) -> None:
        """From now on every call answers 401 Unauthorized (BotFather revoked the token)."""
        self._revoked = revoked
        self._bump()

    def stall_polls(self, stalled: bool = True) -> None:
        """Polls hang without an answer (a half-open connection) until ``stall_polls(False)``."""
        self._stalled = stalled
        self._bump()

    def block_chat(self, chat_id: int) -> None:
        """The user blocked the bot: sends into the chat answer 403."""
        self._blocked.add(chat_id)

    # -- observing the bot -----------------------------------------------------------------------
    def menu(self, scope: str, chat_id: int | None = None) -> list[str]:
        """The command names the bot published for ``scope`` (``all_private_chats``, ``chat``...)."""
        return [c["command"] for c in self.my_commands.get((scope, chat_id, ""), [])]

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def messages(self, chat_id: int, *, include_deleted: bool = False) -> list[Seen]:
        """Every message in the chat (users' and the bot's) in order, edits applied."""
        return [
            m for _, m in sorted(self._messages.get(chat_id, {}).items()) if include_deleted or not m.deleted
        ]

    def bot_messages(self, chat_id: int) -> list[Seen]:
        return [m for m in self.messages(chat_id) if m.from_bot]

    def bot_texts(self, chat_id: int) -> list[str]:
        return [m.text for m in self.bot_messages(chat_id)]

    def message(self, chat_id: int, message_id: int) -> Seen:
        return self._messages[chat_id][message_id]

    def file_bytes(self, file_id: str) -> bytes:
        return self._files[file_id].data

    @property
    def pending_updates(self) -> list[dict[str, Any]]:
        """Updates the bot has not confirmed yet."""
        return list(self._pending)

    async def wait_for(
        self,
        predicate: Callable[[], T],
        timeout: float = 10.0,
        what: str = "",
    ) -> T:
        """Wait until ``predicate()`` is truthy (re-checked on every change) and return its value."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._changed
            value = predicate()
            if value:
                return value
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, 1.0))

    # -- internals: state ------------------------------------------------------------------------
    def _bump(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def _chat(self, chat_id: int, chat_type: str, first_name: str, title: str, *, forum: bool) -> dict:
        chat = self._chats.get(chat_id)
        if chat is None:
            chat = {"id": chat_id, "type": chat_type}
            if chat_type == "private":
                chat["first_name"] = first_name
            else:
                chat["title"] = title
            self._chats[chat_id] = chat
            self._messages[chat_id] = {}
        if forum:
            chat["is_forum"] = True
        return chat

    def _new_mid(self, chat_id: int) -> int:
        mid = self._next_mid.get(chat_id, 1)
        self._next_mid[chat_id] = mid + 1
        return mid

    def _new_file(self, data: bytes, name: str, mime: str, folder: str) -> StoredFile:
        n = next(self._file_ids)
        f = StoredFile(f"FILE{n:06d}", f"U{n:06d}", data, name, mime, f"{folder}/file_{n}{file_ext(name)}")
        self._files[f.file_id] = f
        return f

    def _store(self, msg: dict[str, Any], *, from_bot: bool) -> Seen:
        chat_id = msg["chat"]["id"]
        reply = msg.get("reply_to_message")
        seen = Seen(
            chat_id=chat_id,
            message_id=msg["message_id"],
            text=msg.get("text", msg.get("caption", "")),
            entities=list(msg.get("entities", msg.get("caption_entities", []))),
            from_bot=from_bot,
            thread_id=msg.get("message_thread_id") if msg.get("is_topic_message") else None,
            reply_to=reply["message_id"] if reply and "forum_topic_created" not in reply else None,
            document=msg.get("document"),
            photo=msg.get("photo"),
            raw=msg,
        )
        self._messages.setdefault(chat_id, {})[seen.message_id] = seen
        self._bump()
        return seen

    def _last_bot_message(self, chat_id: int, thread_id: int | None) -> int | None:
        for m in reversed(self.messages(chat_id)):
            if m.from_bot and (thread_id is None or m.thread_id == thread_id):
                return m.message_id
        return None

    def _synthetic_bot_message(self, chat_id: int, thread_id: int | None) -> int:
        msg: dict[str, Any] = {
            "message_id": self._new_mid(chat_id),
            "date": int(time.time()),
            "chat": self._chats[chat_id],
            "from": self.bot_user,
            "text": "an earlier answer",
        }
        if thread_id is not None:
            msg["message_thread_id"], msg["is_topic_message"] = thread_id, True
        return self._store(msg, from_bot=True).message_id

    # -- internals: HTTP -------------------------------------------------------------------------
    async def _handle_file(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["token"] != self.token or self._revoked:
            return web.json_response({"ok": False, "error_code": 404, "description": "Not Found"}, status=404)
        path = request.match_info["path"]
        for f in self._files.values():
            if f.path == path:
                return web.Response(body=f.data, content_type=f.mime_type)
        return web.json_response({"ok": False, "error_code": 404, "description": "Not Found"}, status=404)

    async def _handle_api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params, files = await read_params(request)
        uploads = {k: {"filename": n, "mime_type": m, "size": len(d)} for k, (n, m, d) in files.items()}
        call = Call(method, {**params, **uploads}, time.monotonic())
        self.calls.append(call)
        self._bump()
        try:
            if request.match_info["token"] != self.token or self._revoked:
                raise ApiError(401, "Unauthorized")
            if method in self.down_methods:
                raise ApiError(502, "Bad Gateway")
            if self.before_call is not None:
                self.before_call(method, {**params, **uploads})
            failure = self._take_failure(method)
            if failure is not None:
                if failure.status == 0:
                    call.status = 0
                    if request.transport is not None:
                        request.transport.abort()
                    raise asyncio.CancelledError  # nothing to answer on an aborted connection
                desc = failure.description or DESCRIPTIONS.get(failure.status, "Error")
                desc = desc.format(retry_after=failure.retry_after)
                raise ApiError(failure.status, desc, failure.retry_after)
            handler = getattr(self, f"_m_{method.lower()}", None)
            if handler is None:
                raise ApiError(404, "Not Found")
            result = await handler(params, files)
            if self.after_call is not None:
                self.after_call(method, params)  # e.g. kill the bot before it reads the answer
            held = next((h for h in self._held if h.takes(method, params)), None)
            if held is not None:
                held.waiting = True
                self._bump()
                try:
                    await held.release.wait()
                finally:
                    held.waiting = False
                    self._held.remove(held)
            if self._lost.get(method, 0) > 0:  # it took effect; the answer never reaches the bot
                self._lost[method] -= 1
                call.status = 0
                if request.transport is not None:
                    request.transport.abort()
                raise asyncio.CancelledError
        except ApiError as err:
            call.status = err.status
            body: dict[str, Any] = {"ok": False, "error_code": err.status, "description": err.description}
            if err.retry_after is not None:
                body["parameters"] = {"retry_after": err.retry_after}
            self._bump()
            return web.json_response(body, status=err.status)
        self._bump()
        return web.json_response({"ok": True, "result": result})

    def _take_failure(self, method: str) -> Failure | None:
        for key in (method, "*"):
            queue = self._failures.get(key)
            if queue:
                failure = queue[0]
                failure.times -= 1
                if failure.times <= 0:
                    queue.pop(0)
                return failure
        return None
