"""The Bot API methods the fake Telegram server implements, as a mixin over its state.

Split from :mod:`tests.fakes.telegram_server` (which owns the state and the HTTP side) to keep each
module small. Each ``_m_<method>`` takes the decoded parameters and uploaded files and returns the
``result`` of the answer, or raises :class:`ApiError` with Telegram's status and description.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import TYPE_CHECKING, Any

from telegram.constants import ReactionEmoji

from tests.fakes.telegram_wire import (
    DESCRIPTIONS,
    GETFILE_LIMIT,
    MAX_CAPTION_UTF16,
    MAX_TEXT_UTF16,
    ApiError,
    Seen,
    StoredFile,
    check_text,
)

_REACTIONS = frozenset(e.value for e in ReactionEmoji)
SCOPES = frozenset({"default", "all_private_chats", "all_group_chats", "all_chat_administrators",
                    "chat", "chat_administrators", "chat_member"})  # fmt: skip
COMMAND_NAME = re.compile(r"[a-z0-9_]{1,32}")


class BotApiMethods:
    """Bot API behaviour; the state it reads and writes is declared here and set up by the server."""

    if TYPE_CHECKING:
        bot_user: dict[str, Any]
        commands: list[Any]
        my_commands: dict[tuple[str, int | None, str], list[dict[str, str]]]
        webhook_deleted: int
        _pending: list[dict[str, Any]]
        _forced: list[dict[str, Any]]
        _allowed: list[str] | None
        _chats: dict[int, dict[str, Any]]
        drafts: list[tuple[int, int, str]]
        _messages: dict[int, dict[int, Seen]]
        answered_queries: dict[str, dict[str, Any]]
        _files: dict[str, StoredFile]
        voice_forbidden: set[int]
        _blocked: set[int]
        _revoked: bool
        _stalled: bool
        _closing: bool
        _poll_gen: int
        poll_conflicts: int
        _changed: asyncio.Event

        def _new_mid(self, chat_id: int) -> int: ...
        def _new_file(self, data: bytes, name: str, mime: str, folder: str) -> StoredFile: ...
        def _store(self, msg: dict[str, Any], *, from_bot: bool) -> Seen: ...

    def _target(self, params: dict[str, Any]) -> int:
        try:
            chat_id = int(params["chat_id"])
        except (KeyError, TypeError, ValueError):
            raise ApiError(400, "Bad Request: chat not found") from None
        if chat_id not in self._chats:
            raise ApiError(400, "Bad Request: chat not found")
        if chat_id in self._blocked:
            raise ApiError(403, "Forbidden: bot was blocked by the user")
        return chat_id

    def _find(self, chat_id: int, params: dict[str, Any], what: str) -> Seen:
        seen = self._messages[chat_id].get(int(params.get("message_id", 0)))
        if seen is None or seen.deleted:
            raise ApiError(400, f"Bad Request: message to {what} not found")
        return seen

    # -- methods --------------------------------------------------------------
    async def _m_getme(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        return {**self.bot_user, "can_join_groups": True, "can_read_all_group_messages": True,
                "supports_inline_queries": False}  # fmt: skip

    async def _m_deletewebhook(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        self.webhook_deleted += 1
        if p.get("drop_pending_updates"):
            self._pending.clear()
        return True

    # -- command menus: setMyCommands / getMyCommands / deleteMyCommands, per scope -------------
    def _scope_key(self, p: dict[str, Any]) -> tuple[str, int | None, str]:
        """(scope type, chat id or None, language code), checked as Telegram checks them."""
        scope = p.get("scope") or {"type": "default"}
        kind = scope.get("type") if isinstance(scope, dict) else None
        if kind not in SCOPES:
            raise ApiError(400, "Bad Request: wrong parameter scope")
        chat: int | None = None
        if kind in ("chat", "chat_administrators", "chat_member"):
            try:
                chat = int(scope["chat_id"])
            except (KeyError, TypeError, ValueError):
                raise ApiError(400, "Bad Request: chat not found") from None
            if chat not in self._chats:
                raise ApiError(400, "Bad Request: chat not found")
        return kind, chat, str(p.get("language_code") or "")

    async def _m_setmycommands(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        commands = p.get("commands", [])
        if not isinstance(commands, list):
            raise ApiError(400, "Bad Request: can't parse commands JSON object")
        if len(commands) > 100:
            raise ApiError(400, "Bad Request: BOT_COMMANDS_TOO_MUCH")
        for c in commands:
            name = c.get("command") if isinstance(c, dict) else None
            about = c.get("description") if isinstance(c, dict) else None
            if not isinstance(name, str) or not COMMAND_NAME.fullmatch(name):
                raise ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
            if not isinstance(about, str) or not 1 <= len(about.strip()) <= 256:
                raise ApiError(400, "Bad Request: BOT_COMMAND_DESCRIPTION_INVALID")
        key = self._scope_key(p)
        self.my_commands[key] = [{"command": c["command"], "description": c["description"]} for c in commands]
        if key == ("default", None, ""):
            self.commands = self.my_commands[key]
        return True

    async def _m_getmycommands(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        return self.my_commands.get(self._scope_key(p), [])

    async def _m_deletemycommands(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        self.my_commands.pop(self._scope_key(p), None)
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
                raise ApiError(401, "Unauthorized")
            if gen != self._poll_gen:
                self.poll_conflicts += 1  # two pollers on one bot (several daemons without a leader)
                raise ApiError(409, DESCRIPTIONS[409])
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
        check_text(text, entities, MAX_TEXT_UTF16, "message text")
        markup = _inline_keyboard(p.get("reply_markup"))
        return self._bot_message(chat_id, p, {"text": text, "entities": entities, "reply_markup": markup})

    async def _m_sendmessagedraft(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        """An ephemeral preview: shown to the user for ~30 s, never stored as a message."""
        chat_id = self._target(p)
        if chat_id <= 0:
            raise ApiError(400, "Bad Request: message drafts can be sent only to private chats")
        draft_id = int(p.get("draft_id") or 0)
        if draft_id == 0:
            raise ApiError(400, "Bad Request: draft_id must be non-zero")
        text = str(p.get("text", ""))
        check_text(text, list(p.get("entities") or []), MAX_TEXT_UTF16, "message text")
        self.drafts.append((chat_id, draft_id, text))
        return True

    async def _m_editmessagetext(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        chat_id = self._target(p)
        seen = self._find(chat_id, p, "edit")
        if not seen.from_bot:
            raise ApiError(400, "Bad Request: message can't be edited")
        text = str(p.get("text", ""))
        entities = list(p.get("entities") or [])
        check_text(text, entities, MAX_TEXT_UTF16, "message text")
        markup = _inline_keyboard(p.get("reply_markup"))
        if text == seen.text and entities == seen.entities and markup == seen.raw.get("reply_markup"):
            raise ApiError(
                400,
                "Bad Request: message is not modified: specified new message content and reply markup "
                "are exactly the same as a current content and reply markup of the message",
            )
        seen.text, seen.entities = text, entities
        seen.edits += 1
        seen.raw = {**seen.raw, "text": text, "entities": entities, "edit_date": int(time.time())}
        if not entities:
            seen.raw.pop("entities")
        # An edit without reply_markup removes the inline keyboard, as Telegram does.
        if markup:
            seen.raw["reply_markup"] = markup
        else:
            seen.raw.pop("reply_markup", None)
        return seen.raw

    async def _m_answercallbackquery(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        """Stops the presser's spinner (a toast, or an alert with ``show_alert``); once per query."""
        query_id = str(p.get("callback_query_id") or "")
        if not query_id or query_id in self.answered_queries:
            raise ApiError(
                400, "Bad Request: query is too old and response timeout expired or query ID is invalid"
            )
        self.answered_queries[query_id] = p
        return True

    async def _m_sendchataction(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        self._target(p)
        return True

    async def _m_setmessagereaction(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        chat_id = self._target(p)
        seen = self._find(chat_id, p, "react")
        emojis = [r.get("emoji", "") for r in p.get("reaction") or []]
        if any(e not in _REACTIONS for e in emojis):
            raise ApiError(400, "Bad Request: REACTION_INVALID")
        seen.reactions = emojis
        return True

    async def _m_deletemessage(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        chat_id = self._target(p)
        self._find(chat_id, p, "delete").deleted = True
        return True

    async def _m_getfile(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        stored = self._files.get(str(p.get("file_id", "")))
        if stored is None:
            raise ApiError(400, "Bad Request: invalid file_id")
        if len(stored.data) > GETFILE_LIMIT:
            raise ApiError(400, "Bad Request: file is too big")
        return {"file_id": stored.file_id, "file_unique_id": stored.unique_id,
                "file_size": len(stored.data), "file_path": stored.path}  # fmt: skip

    async def _m_senddocument(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        return self._send_media(p, f, "document")

    async def _m_sendphoto(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        return self._send_media(p, f, "photo")

    async def _m_sendvoice(self, p: dict[str, Any], f: dict[str, Any]) -> Any:
        """A voice message: Telegram shows it as one only when it is OGG/Opus (else it refuses)."""
        if self._target(p) in self.voice_forbidden:
            raise ApiError(400, "Bad Request: VOICE_MESSAGES_FORBIDDEN")
        upload = f.get("voice")
        if upload is not None and not (upload[2].startswith(b"OggS") and b"OpusHead" in upload[2][:128]):
            raise ApiError(400, "Bad Request: wrong file type of the voice message")
        return self._send_media(p, f, "voice")

    def _send_media(self, p: dict[str, Any], files: dict[str, Any], kind: str) -> Any:
        chat_id = self._target(p)
        caption = str(p.get("caption", ""))
        entities = list(p.get("caption_entities") or [])
        if caption:
            check_text(caption, entities, MAX_CAPTION_UTF16, "caption")
        upload = files.get(kind)
        if upload is None:
            stored = self._files.get(str(p.get(kind, "")))
            if stored is None:
                raise ApiError(400, f"Bad Request: there is no {kind} in the request")
        else:
            name, mime, data = upload
            stored = self._new_file(
                data, name, mime, {"document": "documents", "voice": "voice"}.get(kind, "photos")
            )
        body: dict[str, Any] = {}
        if kind == "document":
            body["document"] = {"file_id": stored.file_id, "file_unique_id": stored.unique_id,
                                "file_name": stored.name, "mime_type": stored.mime_type,
                                "file_size": len(stored.data)}  # fmt: skip
        elif kind == "voice":
            body["voice"] = {"file_id": stored.file_id, "file_unique_id": stored.unique_id, "duration": 1,
                             "mime_type": "audio/ogg", "file_size": len(stored.data)}  # fmt: skip
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
                raise ApiError(400, "Bad Request: message to be replied not found")
        return self._store(msg, from_bot=True).raw


def _inline_keyboard(markup: Any) -> dict[str, Any] | None:
    """An inline keyboard as Telegram checks it: rows of buttons with text and callback_data of
    1-64 bytes; anything else is a 400."""
    if markup is None:
        return None
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise ApiError(400, "Bad Request: can't parse reply keyboard markup JSON object")
    for button in (b for row in rows for b in row):
        data = button.get("callback_data") if isinstance(button, dict) else None
        if not isinstance(button.get("text"), str) or not isinstance(data, str):
            raise ApiError(400, "Bad Request: can't parse inline keyboard button")
        if not 1 <= len(data.encode()) <= 64:
            raise ApiError(400, "Bad Request: BUTTON_DATA_INVALID")
    return markup
