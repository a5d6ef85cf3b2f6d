"""Lark / Feishu bot menu events: a person picked an entry of the bot's custom menu.

The operator builds the menu in the developer console (the bot's **Custom menu**, entries of type
"send an event" with an ``event_key``), and subscribes to ``application.bot.menu_v6``; lark-oapi's
websocket client delivers it like a message event (``register_p2_application_bot_menu_v6``). The
``event_key`` names the command: ``new`` (or ``/new``) means ``/new``; ``model gpt-4o`` means
``/model gpt-4o``. The event becomes an :class:`Inbound` with that text from the operator, so it
meets the same registry row, access policy and admin check as a typed command; a key no command
has gets the registry's "Unknown command" answer.

Where the answer goes. The event names the person, not a chat (the custom menu lives in the bot's
one-to-one chat). The adapter remembers each person's one-to-one chat from their messages
(:class:`DmChats`); until it has seen one (after a restart, before they wrote), the answer is sent
to the person by ``open_id`` (``receive_id_type=open_id``, which lands in the same chat) and the
command applies to a conversation keyed by their open_id.

Malformed: an event without its id, operator or key, a key that is not a command's shape, or an
event for another app is counted as ``command``; the person, when named, is told.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from channels import malformed
from channels.base import Inbound

PLATFORM = "lark"
EVENT = "application.bot.menu_v6"
MENU = "menu"
"""``Inbound.extra`` marker: a menu event (no message of the person's to reply to)."""
PREFIX = "menu-"
_KEY = re.compile(r"/?([A-Za-z][A-Za-z0-9_-]{0,31})(?:\s+(.{1,500}))?", re.DOTALL)


class DmChats:
    """open_id -> the chat id of that person's one-to-one chat with the bot, as last seen (written
    on the SDK's thread, read there too; bounded)."""

    def __init__(self, limit: int = 10_000) -> None:
        self._chats: dict[str, str] = {}
        self._events: dict[str, str] = {}
        """event id -> the chat its answer went to: a redelivery keeps the same journal key even
        if the person's chat became known in between."""
        self._lock = threading.Lock()
        self._limit = limit

    def learn(self, open_id: str, chat_id: str) -> None:
        with self._lock:
            self._chats.pop(open_id, None)
            self._chats[open_id] = chat_id
            while len(self._chats) > self._limit:
                self._chats.pop(next(iter(self._chats)))

    def get(self, open_id: str) -> str | None:
        with self._lock:
            return self._chats.get(open_id)

    def for_event(self, event_id: str, open_id: str) -> str:
        """The chat a menu event is answered in: the one chosen when it first came, else the
        person's one-to-one chat, else their open_id."""
        with self._lock:
            chat = self._events.pop(event_id, None) or self._chats.get(open_id) or open_id
            self._events[event_id] = chat
            while len(self._events) > self._limit:
                self._events.pop(next(iter(self._events)))
            return chat


def _fields(data: Any) -> tuple[str | None, str | None, Any, str | None]:
    header = getattr(data, "header", None)
    event = getattr(data, "event", None)
    operator = getattr(event, "operator", None)
    ids = getattr(operator, "operator_id", None)
    open_id = getattr(ids, "open_id", None)
    return getattr(header, "event_id", None), open_id, event, getattr(header, "app_id", None)


def recover_ids(data: Any, chats: DmChats) -> dict[str, Any]:
    """What an unusable menu event still tells: whom to answer, in which chat."""
    event_id, open_id, _, _ = _fields(data)
    if not (malformed.is_id(event_id) and malformed.is_id(open_id)):
        return {"ref": "menu event ?"}
    chat = chats.for_event(event_id, open_id)
    return {"ref": f"menu event {event_id}", "chat_id": chat, "sender_id": open_id,
            "message_id": f"{PREFIX}{event_id}", "is_direct": True, "extra": {MENU: True}}  # fmt: skip


def to_inbound(data: Any, chats: DmChats, app_id: str) -> Inbound:
    """The command a menu event stands for; ``ValueError`` when it cannot be read."""
    event_id, open_id, event, claimed = _fields(data)
    if not malformed.is_id(event_id) or not malformed.is_id(open_id):
        raise ValueError("a menu event without its id or operator")
    if claimed is not None and claimed != app_id:
        raise ValueError("a menu event for another app")
    key = getattr(event, "event_key", None)
    match = _KEY.fullmatch(key.strip()) if isinstance(key, str) else None
    if match is None:
        raise ValueError("an event_key that names no command")
    name = getattr(getattr(event, "operator", None), "operator_name", None)
    return Inbound(
        platform=PLATFORM,
        chat_id=chats.for_event(event_id, open_id),
        message_id=f"{PREFIX}{event_id}",
        sender_id=open_id,
        text=" ".join(filter(None, (f"/{match.group(1).lower()}", (match.group(2) or "").strip()))),
        is_direct=True,  # the custom menu is the bot's one-to-one chat's
        addressed=True,
        sender_name=name if isinstance(name, str) else "",
        extra={"chat_type": "p2p", MENU: True},
    )
