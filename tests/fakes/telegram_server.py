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
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from telegram.constants import ReactionEmoji

T = TypeVar("T")

MAX_TEXT_UTF16 = 4096
MAX_CAPTION_UTF16 = 1024
GETFILE_LIMIT = 20 * 1024 * 1024
# Parameters that are plain strings on the wire; everything else PTB JSON-encodes (numbers, lists).
_STRING_PARAMS = frozenset(
    {"text", "caption", "action", "file_id", "parse_mode", "emoji", "description", "url", "name"}
)
_REACTIONS = frozenset(e.value for e in ReactionEmoji)
_MENTION = re.compile(r"(?<![\w@])@[A-Za-z][A-Za-z0-9_]{3,31}\b")
_COMMAND = re.compile(r"(?<!\S)/[A-Za-z0-9_]{1,32}(?:@[A-Za-z][A-Za-z0-9_]{3,31})?(?![\w@])")
_DESCRIPTIONS = {
    400: "Bad Request: something is wrong",
    401: "Unauthorized",
    403: "Forbidden: bot was blocked by the user",
    404: "Not Found",
    409: "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
    429: "Too Many Requests: retry after {retry_after}",
    500: "Internal Server Error",
    502: "Bad Gateway",
}


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def entity_text(text: str, entity: dict[str, Any]) -> str:
    """The part of ``text`` an entity covers (offsets are UTF-16 code units)."""
    raw = text.encode("utf-16-le")
    start = 2 * entity["offset"]
    return raw[start : start + 2 * entity["length"]].decode("utf-16-le")


def auto_entities(text: str) -> list[dict[str, Any]]:
    """The mention and bot_command entities Telegram itself would attach to ``text``."""
    found: list[tuple[int, int, str]] = []
    for kind, rx in (("mention", _MENTION), ("bot_command", _COMMAND)):
        for m in rx.finditer(text):
            found.append((m.start(), m.end(), kind))
    found.sort()
    return [
        {"type": kind, "offset": utf16_len(text[:s]), "length": utf16_len(text[s:e])}
        for s, e, kind in found
    ]


@dataclass(slots=True)
class Call:
    """One request the bot made (failed ones included, with the status it got)."""

    method: str
    params: dict[str, Any]
    time: float
    status: int = 200


@dataclass(slots=True)
class Seen:
    """A message as the chat's members see it now (edits applied)."""

    chat_id: int
    message_id: int
    text: str
    entities: list[dict[str, Any]]
    from_bot: bool
    thread_id: int | None = None
    reply_to: int | None = None
    edits: int = 0
    deleted: bool = False
    document: dict[str, Any] | None = None
    photo: list[dict[str, Any]] | None = None
    reactions: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def spans(self, kind: str) -> list[str]:
        """The text covered by each entity of type ``kind`` (e.g. "pre", "bold")."""
        return [entity_text(self.text, e) for e in self.entities if e["type"] == kind]


@dataclass(slots=True)
class _Failure:
    status: int
    times: int
    retry_after: int | None
    description: str | None


@dataclass(slots=True)
class _File:
    file_id: str
    unique_id: str
    data: bytes
    name: str
    mime_type: str
    path: str


class _ApiError(Exception):
    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status, self.description, self.retry_after = status, description, retry_after


class FakeTelegram:
    """An aiohttp Bot API server on 127.0.0.1 with helpers to script users and inspect the bot."""

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
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._pending: list[dict[str, Any]] = []  # unconfirmed updates, ascending update_id
        self._forced: list[dict[str, Any]] = []  # redelivered: served whatever the offset
        self._update_ids = itertools.count(500_000_001)
        self._file_ids = itertools.count(1)
        self._chats: dict[int, dict[str, Any]] = {}
        self._next_mid: dict[int, int] = {}
        self._messages: dict[int, dict[int, Seen]] = {}
        self._files: dict[str, _File] = {}
        self._failures: dict[str, list[_Failure]] = {}
        self._blocked: set[int] = set()
        self._revoked = False
        self._stalled = False
        self._closing = False
        self._poll_gen = 0
        self._allowed: list[str] | None = None
        self.commands: list[Any] = []
        self._changed = asyncio.Event()
        self.webhook_deleted = 0

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    @property
    def base_file_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/file/bot"

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
        chat_title: str = "Test group",
        from_bot: bool = False,
    ) -> dict[str, Any]:
        """Queue a user's message as an update and return that update.

        ``entities=None`` lets the fake attach the mention / bot_command entities Telegram would.
        With ``document`` or ``photo`` (from :meth:`add_file` / :meth:`add_photo`) ``text`` becomes
        the caption. ``is_topic`` puts the message in forum topic ``message_thread_id``.
        """
        chat = self._chat(chat_id, chat_type, first_name, chat_title, forum=is_topic)
        sender = {"id": user_id, "is_bot": from_bot, "first_name": first_name}
        mid = self._new_mid(chat_id)
        msg: dict[str, Any] = {"message_id": mid, "date": int(time.time()), "chat": chat, "from": sender}
        ents = auto_entities(text) if entities is None else entities
        if document is not None or photo is not None:
            if document is not None:
                msg["document"] = document
            if photo is not None:
                msg["photo"] = photo
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
        reply_id = reply_to_message_id
        if reply_to_bot and reply_id is None:
            reply_id = self._last_bot_message(chat_id, message_thread_id) or self._synthetic_bot_message(
                chat_id, message_thread_id if is_topic else None
            )
        if reply_id is not None:
            msg["reply_to_message"] = self._messages[chat_id][reply_id].raw
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
        self._failures.setdefault(method, []).append(_Failure(status, times, retry_after, description))

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

    async def wait_for(  # noqa: ASYNC109 - a deadline for the condition, not for one call
        self, predicate: Callable[[], T], timeout: float = 10.0, what: str = ""
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

    def _new_file(self, data: bytes, name: str, mime: str, folder: str) -> _File:
        n = next(self._file_ids)
        f = _File(f"FILE{n:06d}", f"U{n:06d}", data, name, mime, f"{folder}/file_{n}{_ext(name)}")
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
        params, files = await _read_params(request)
        call = Call(method, params, time.monotonic())
        self.calls.append(call)
        try:
            if request.match_info["token"] != self.token or self._revoked:
                raise _ApiError(401, "Unauthorized")
            failure = self._take_failure(method)
            if failure is not None:
                if failure.status == 0:
                    call.status = 0
                    if request.transport is not None:
                        request.transport.abort()
                    raise asyncio.CancelledError  # nothing to answer on an aborted connection
                desc = failure.description or _DESCRIPTIONS.get(failure.status, "Error")
                desc = desc.format(retry_after=failure.retry_after)
                raise _ApiError(failure.status, desc, failure.retry_after)
            handler = getattr(self, f"_m_{method.lower()}", None)
            if handler is None:
                raise _ApiError(404, "Not Found")
            result = await handler(params, files)
        except _ApiError as err:
            call.status = err.status
            body: dict[str, Any] = {"ok": False, "error_code": err.status, "description": err.description}
            if err.retry_after is not None:
                body["parameters"] = {"retry_after": err.retry_after}
            self._bump()
            return web.json_response(body, status=err.status)
        self._bump()
        return web.json_response({"ok": True, "result": result})

    def _take_failure(self, method: str) -> _Failure | None:
        for key in (method, "*"):
            queue = self._failures.get(key)
            if queue:
                failure = queue[0]
                failure.times -= 1
                if failure.times <= 0:
                    queue.pop(0)
                return failure
        return None

    def _target(self, params: dict[str, Any]) -> int:
        try:
            chat_id = int(params["chat_id"])
        except (KeyError, TypeError, ValueError):
            raise _ApiError(400, "Bad Request: chat not found") from None
        if chat_id not in self._chats:
            raise _ApiError(400, "Bad Request: chat not found")
        if chat_id in self._blocked:
            raise _ApiError(403, "Forbidden: bot was blocked by the user")
        return chat_id

    def _find(self, chat_id: int, params: dict[str, Any], what: str) -> Seen:
        seen = self._messages[chat_id].get(int(params.get("message_id", 0)))
        if seen is None or seen.deleted:
            raise _ApiError(400, f"Bad Request: message to {what} not found")
        return seen

    # -- internals: Bot API methods --------------------------------------------------------------
    async def _m_getme(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        return {**self.bot_user, "can_join_groups": True, "can_read_all_group_messages": True,
                "supports_inline_queries": False}  # fmt: skip

    async def _m_deletewebhook(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        self.webhook_deleted += 1
        if p.get("drop_pending_updates"):
            self._pending.clear()
        return True

    async def _m_setmycommands(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        self.commands = p.get("commands", [])
        return True

    async def _m_getupdates(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        offset = int(p.get("offset") or 0)
        timeout = float(p.get("timeout") or 0)
        limit = int(p.get("limit") or 100)
        if "allowed_updates" in p:  # sticky, as on Telegram: omitted means "as last time"
            self._allowed = p["allowed_updates"] or None
        allowed = self._allowed
        if offset > 0:
            self._pending = [u for u in self._pending if u["update_id"] >= offset]
        elif offset < 0:
            self._pending = self._pending[offset:]
        self._poll_gen += 1
        gen = self._poll_gen
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._changed
            if self._closing:
                return []
            if self._revoked:
                raise _ApiError(401, "Unauthorized")
            if gen != self._poll_gen:
                raise _ApiError(409, _DESCRIPTIONS[409])
            if not self._stalled:
                batch = self._ready(allowed, limit)
                if batch or loop.time() >= deadline:
                    return batch
                wait = deadline - loop.time()
            else:
                wait = 3600.0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait)

    def _ready(self, allowed: list[str] | None, limit: int) -> list[dict[str, Any]]:
        forced, self._forced = self._forced[:limit], self._forced[limit:]
        wanted = [u for u in self._pending if not allowed or any(k in u for k in allowed)]
        # Updates of kinds the bot did not ask for are confirmed silently, as Telegram does.
        if allowed:
            self._pending = [u for u in self._pending if any(k in u for k in allowed)]
        return forced + wanted[: limit - len(forced)]

    async def _m_sendmessage(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        chat_id = self._target(p)
        text = str(p.get("text", ""))
        entities = list(p.get("entities") or [])
        _check_text(text, entities, MAX_TEXT_UTF16, "message text")
        return self._bot_message(chat_id, p, {"text": text, "entities": entities})

    async def _m_editmessagetext(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        chat_id = self._target(p)
        seen = self._find(chat_id, p, "edit")
        if not seen.from_bot:
            raise _ApiError(400, "Bad Request: message can't be edited")
        text = str(p.get("text", ""))
        entities = list(p.get("entities") or [])
        _check_text(text, entities, MAX_TEXT_UTF16, "message text")
        if text == seen.text and entities == seen.entities:
            raise _ApiError(
                400,
                "Bad Request: message is not modified: specified new message content and reply markup "
                "are exactly the same as a current content and reply markup of the message",
            )
        seen.text, seen.entities = text, entities
        seen.edits += 1
        seen.raw = {**seen.raw, "text": text, "entities": entities, "edit_date": int(time.time())}
        if not entities:
            seen.raw.pop("entities")
        return seen.raw

    async def _m_sendchataction(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        self._target(p)
        return True

    async def _m_setmessagereaction(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        chat_id = self._target(p)
        seen = self._find(chat_id, p, "react")
        emojis = [r.get("emoji", "") for r in p.get("reaction") or []]
        if any(e not in _REACTIONS for e in emojis):
            raise _ApiError(400, "Bad Request: REACTION_INVALID")
        seen.reactions = emojis
        return True

    async def _m_deletemessage(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        chat_id = self._target(p)
        self._find(chat_id, p, "delete").deleted = True
        return True

    async def _m_getfile(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        stored = self._files.get(str(p.get("file_id", "")))
        if stored is None:
            raise _ApiError(400, "Bad Request: invalid file_id")
        if len(stored.data) > GETFILE_LIMIT:
            raise _ApiError(400, "Bad Request: file is too big")
        return {"file_id": stored.file_id, "file_unique_id": stored.unique_id,
                "file_size": len(stored.data), "file_path": stored.path}  # fmt: skip

    async def _m_senddocument(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        return self._send_media(p, f, "document")

    async def _m_sendphoto(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        return self._send_media(p, f, "photo")

    def _send_media(self, p: dict[str, Any], files: dict[str, Any], kind: str) -> Any:
        chat_id = self._target(p)
        caption = str(p.get("caption", ""))
        entities = list(p.get("caption_entities") or [])
        if caption:
            _check_text(caption, entities, MAX_CAPTION_UTF16, "caption")
        upload = files.get(kind)
        if upload is None:
            stored = self._files.get(str(p.get(kind, "")))
            if stored is None:
                raise _ApiError(400, f"Bad Request: there is no {kind} in the request")
        else:
            name, mime, data = upload
            stored = self._new_file(data, name, mime, "documents" if kind == "document" else "photos")
        body: dict[str, Any] = {}
        if kind == "document":
            body["document"] = {"file_id": stored.file_id, "file_unique_id": stored.unique_id,
                                "file_name": stored.name, "mime_type": stored.mime_type,
                                "file_size": len(stored.data)}  # fmt: skip
        else:
            body["photo"] = [{"file_id": stored.file_id, "file_unique_id": stored.unique_id,
                              "width": 800, "height": 600, "file_size": len(stored.data)}]  # fmt: skip
        if caption:
            body["caption"] = caption
            if entities:
                body["caption_entities"] = entities
        return self._bot_message(chat_id, p, body)

    def _bot_message(self, chat_id: int, p: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        chat = self._chats[chat_id]
        msg: dict[str, Any] = {"message_id": self._new_mid(chat_id), "date": int(time.time()),
                               "chat": chat, "from": self.bot_user}  # fmt: skip
        msg.update({k: v for k, v in body.items() if v not in (None, [], "")})
        thread = p.get("message_thread_id")
        if thread is not None and chat.get("is_forum"):
            msg["message_thread_id"], msg["is_topic_message"] = int(thread), True
        reply = p.get("reply_parameters")
        if isinstance(reply, dict) and reply.get("message_id") is not None:
            target = self._messages[chat_id].get(int(reply["message_id"]))
            if target is not None and not target.deleted:
                msg["reply_to_message"] = target.raw
            elif not reply.get("allow_sending_without_reply"):
                raise _ApiError(400, "Bad Request: message to be replied not found")
        return self._store(msg, from_bot=True).raw


def _check_text(text: str, entities: list[dict[str, Any]], limit: int, what: str) -> None:
    if not text.strip():
        raise _ApiError(400, f"Bad Request: {what} is empty")
    size = utf16_len(text)
    if size > limit:
        raise _ApiError(400, f"Bad Request: {what} is too long")
    for e in entities:
        if e.get("offset", -1) < 0 or e.get("length", 0) <= 0 or e["offset"] + e["length"] > size:
            raise _ApiError(400, f"Bad Request: can't parse entities: entity {e} is out of the text")


async def _read_params(request: web.Request) -> tuple[dict[str, Any], dict[str, tuple[str, str, bytes]]]:
    """Decode a Bot API request the way Telegram does: query string, urlencoded or multipart form
    (values JSON-encoded unless they are strings), or a JSON body."""
    params: dict[str, Any] = {k: _decode(k, v) for k, v in request.query.items()}
    files: dict[str, tuple[str, str, bytes]] = {}
    if request.content_type == "application/json":
        body = await request.json() if request.can_read_body else {}
        params.update(body or {})
    elif request.can_read_body:
        form = await request.post()
        for key, value in form.items():
            if isinstance(value, web.FileField):
                files[key] = (value.filename, value.content_type, value.file.read())
            else:
                params[key] = _decode(key, str(value))
    return params, files


def _decode(key: str, value: str) -> Any:
    if key in _STRING_PARAMS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _ext(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:] if dot > 0 else ""
