"""Where the web chat's messages live: the daemon's database, seen through a narrow protocol.

Why a database and not the channel's memory: for every other channel the platform keeps the
messages, so a page reload, a daemon restart or a turn taken by another daemon of a cluster still
shows them. For the web chat the daemon *is* the platform. The gateway's store implements
:class:`Room` (gateway/store/webchat.py) and hands itself to the channel as one; the channel never
sees the rest of the store (imports point gateway -> channels).

Every write gives the message the next ``seq`` of its chat (an edit too), under a lock on the chat
on PostgreSQL, so an open page asks "what changed after seq N" and misses nothing, whichever
daemon wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from channels.messages import Button


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file attached to a chat message: its id in :class:`Room` (random, unguessable), name, size."""

    file_id: str
    name: str
    size: int


@dataclass(frozen=True, slots=True)
class WebMessage:
    seq: int
    """The chat's change counter at this message's last write (an edit raises it)."""
    msg_id: str
    chat_id: str
    role: str
    """``user`` (a person's message) or ``bot``."""
    author: str
    text: str
    buttons: tuple[Button, ...] = ()
    files: tuple[FileRef, ...] = ()
    created: float = 0.0


@dataclass(frozen=True, slots=True)
class StoredFile:
    name: str
    mime: str
    data: bytes


@dataclass(frozen=True, slots=True)
class ChatSummary:
    chat_id: str
    first_text: str
    """The chat's first message, for the list (cut by the page)."""
    updated: float
    messages: int


class Room(Protocol):
    """The web chat's messages and files (implemented by the gateway's store)."""

    async def web_add(
        self,
        chat_id: str,
        owner: str,
        msg_id: str,
        role: str,
        author: str,
        text: str,
        *,
        buttons: tuple[Button, ...] = (),
        files: tuple[FileRef, ...] = (),
        send_key: str | None = None,
    ) -> str:
        """Add a message; returns its id. A second add with the same ``msg_id`` or ``send_key``
        adds nothing and returns the first one's id (a retried send, a double-clicked form)."""
        ...

    async def web_edit(
        self, chat_id: str, msg_id: str, text: str, buttons: tuple[Button, ...] | None
    ) -> bool:
        """Replace a message's text (and its buttons, unless None); False when there is none."""
        ...

    async def web_by_key(self, send_key: str) -> str | None:
        """The id of the message sent for ``send_key``, if any."""
        ...

    async def web_message(self, chat_id: str, msg_id: str) -> WebMessage | None: ...

    async def web_since(self, chat_id: str, after: int, limit: int) -> list[WebMessage]:
        """The chat's messages written (or edited) after ``seq`` ``after``, oldest change first."""
        ...

    async def web_recent(self, chat_id: str, limit: int) -> tuple[list[WebMessage], int]:
        """The chat's last ``limit`` messages, oldest first, and the chat's highest ``seq``, read
        before the messages: every change up to it is in them (a later one may be too)."""
        ...

    async def web_chats(self, owner: str, limit: int) -> list[ChatSummary]:
        """``owner``'s chats, most recently active first."""
        ...

    async def web_file_put(self, chat_id: str, file_id: str, name: str, mime: str, data: bytes) -> None: ...

    async def web_file_get(self, chat_id: str, file_id: str) -> StoredFile | None:
        """The file, only if it belongs to ``chat_id`` (an id from another chat finds nothing)."""
        ...
