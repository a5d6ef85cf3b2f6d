"""The values that cross the adapter contract (channels/base.py): a message in (:class:`Inbound`, its
attachments, the thread context around it), where a reply goes (:class:`ReplyTarget`), buttons and
their presses, files out, rendered text, and what a platform can do (:class:`Capabilities`).

Plain frozen dataclasses with no behaviour beyond cleaning what a platform sent: separate from the
:class:`~channels.base.Channel` class so the contract's data and its one abstract class each read in
one sitting; ``channels.base`` re-exports them, so adapters and the gateway import the contract
from one place.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

UNREADABLE = "unreadable"
""":attr:`Inbound.unsupported` of an event the adapter could not parse or journal (see
:meth:`Channel.skip_unreadable`)."""

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with every lone UTF-16 surrogate replaced by U+FFFD.

    JSON may carry ``"\\ud800"``; Python decodes it into a str that SQLite (the journal), logging
    streams and every HTTP client refuse to encode. Replacing it keeps the message answerable (the
    user sees one odd character, not silence); a split pair is joined back into its character."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_words(text: str) -> str:
    """:func:`clean_text`, and every NUL replaced by U+FFFD too. JSON and a web form may carry a
    NUL; PostgreSQL refuses it in text columns and in ``jsonb`` (the agent's checkpoints), so on
    that engine a message holding one failed its turn ("something went wrong") where SQLite took
    it. For words (texts, names) only: an id with a control character is malformed
    (channels/malformed.py), not repaired."""
    text = clean_text(text)
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clean(v) for v in value)
    return value


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file a user sent. ``file_id`` is the adapter's own handle for :meth:`Channel.download`."""

    file_id: str
    name: str
    mime_type: str | None = None
    size: int | None = None
    kind: str = ""
    """What the platform says the file is, where it says it: ``image`` (a photo, a pasted
    screenshot), ``voice`` (a recorded voice note), ``audio`` (a music or audio file), or ``""``
    (a file: the gateway goes by ``mime_type`` and the name; docs/media.md)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", clean_words(self.name))


@dataclass(frozen=True, slots=True)
class Inbound:
    """One user message, platform-neutral.

    ``message_id`` must be stable across redelivery and reconnect replay: the gateway journals on
    ``(platform, chat_id, message_id)`` so a second delivery of the same post is a no-op (Slack: the
    message ``ts``, not the event id).

    Every string is cleaned of lone surrogates when the value is built (see :func:`clean_text`),
    and the text and names of NUL (:func:`clean_words`): that is parse time for every adapter, so
    no platform can hand the journal or the agent's checkpoints a string they refuse.
    """

    platform: str
    chat_id: str
    message_id: str
    sender_id: str
    text: str
    is_direct: bool
    addressed: bool
    """True when the bot was mentioned, replied to or addressed by command (always True in DMs)."""
    thread_id: str | None = None
    """Topic / thread inside the chat that forms its own conversation (Telegram forum topic, Slack
    thread ts, Discord thread channel). ``None`` when the chat is one conversation."""
    sender_name: str = ""
    chat_title: str = ""
    attachments: tuple[Attachment, ...] = ()
    received_at: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)
    """Adapter-private data the adapter needs again to reply (e.g. Slack's thread ts). JSON-safe."""
    unsupported: str = ""
    """Names what the user sent that the agent cannot use (plural noun: "stickers", "games"), or
    :data:`UNREADABLE` for an event that could not be parsed. The gateway answers such a message
    with a journaled note instead of running a turn; ``text`` is then empty."""

    def __post_init__(self) -> None:
        for name in ("chat_id", "message_id", "sender_id", "text", "thread_id", "sender_name",
                     "chat_title", "unsupported"):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, str) and _SURROGATE.search(value):
                object.__setattr__(self, name, clean_text(value))
        for name in ("text", "sender_name", "chat_title"):
            value = getattr(self, name)
            if isinstance(value, str) and "\x00" in value:
                object.__setattr__(self, name, clean_words(value))
        if self.extra:
            object.__setattr__(self, "extra", _clean(self.extra))

    @property
    def unreadable(self) -> bool:
        """The adapter could not parse this event; only the ids it recovered are set."""
        return self.unsupported == UNREADABLE

    @property
    def conversation(self) -> str:
        """The key of the conversation this message belongs to (one agent thread per key)."""
        base = f"{self.platform}:{self.chat_id}"
        return f"{base}:{self.thread_id}" if self.thread_id else base

    @property
    def key(self) -> str:
        """Idempotency key of this message: redeliveries share it."""
        return f"{self.platform}:{self.chat_id}:{self.message_id}"

    @property
    def user(self) -> str:
        """The platform-qualified user id used for access control and memory."""
        return f"{self.platform}:{self.sender_id}"

    @property
    def target(self) -> ReplyTarget:
        return ReplyTarget(
            platform=self.platform,
            chat_id=self.chat_id,
            thread_id=self.thread_id,
            reply_to=self.message_id,
            extra=dict(self.extra),
        )


@dataclass(frozen=True, slots=True)
class ReplyTarget:
    """Where a reply goes. Built from an :class:`Inbound`; survives a restart as JSON."""

    platform: str
    chat_id: str
    thread_id: str | None = None
    reply_to: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ContextItem:
    """An earlier message of the thread an inbound message was written in, or the message it
    replies to (:meth:`Channel.thread_context`). Plain platform-neutral values: the gateway bounds
    them and hands them to the agent as context, never as requests."""

    author: str
    text: str
    message_id: str = ""
    """The platform's id of this message (the journal tells which ones are turns of their own)."""
    is_self: bool = False
    """Written by this bot (its earlier answers)."""
    is_bot: bool = False
    """Written by another bot or an integration."""
    replied_to: bool = False
    """The message the user replied to (rather than an earlier message of the thread)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "author", clean_words(self.author))
        object.__setattr__(self, "text", clean_words(self.text))


FORWARDED = "forwarded"
""":attr:`Inbound.extra` key of a message that carries text someone else wrote (a forwarded or
shared message): who wrote it, as the platform names them ("" when it does not). The agent is
told its words are not the sender's own (agent/provenance.py)."""
REPLIED = "replied"
""":attr:`Inbound.extra` key of the message a reply answers, as the platform's event carried it
(Telegram, Discord): journaled with the message, so a resumed turn gets the same context."""
REPLIED_MAX_CHARS = 4000
"""A replied-to message's text is cut to this when the event is read (the journal holds it)."""


def replied_extra(item: ContextItem) -> dict[str, Any]:
    """``{REPLIED: ...}`` for :attr:`Inbound.extra`: the replied-to message, JSON-safe, bounded."""
    text = item.text if len(item.text) <= REPLIED_MAX_CHARS else item.text[: REPLIED_MAX_CHARS - 1] + "…"
    return {REPLIED: {"author": item.author[:200], "text": text, "id": item.message_id,
                      "self": item.is_self, "bot": item.is_bot}}  # fmt: skip


REPLIED_FILE = "replied_file"
""":attr:`Inbound.extra` key of the file the replied-to message carries, where the platform's event
includes it (Telegram's ``reply_to_message.document``): ``/skills install`` sent as a reply to an
archive installs that archive. Never a turn's attachment: only a command that asks reads it."""


def replied_file_extra(attachment: Attachment, sender: str, *, from_bot: bool) -> dict[str, Any]:
    """``{REPLIED_FILE: ...}`` for :attr:`Inbound.extra`: the replied-to file, JSON-safe, bounded;
    ``sender``: who sent that message (platform-qualified), for the installer's provenance;
    ``from_bot``: a bot (this one included) or an unknown sender sent it."""
    return {REPLIED_FILE: {"file_id": attachment.file_id[:512], "name": attachment.name[:255],
                           "mime": attachment.mime_type, "size": attachment.size,
                           "sender": sender[:100], "bot": from_bot}}  # fmt: skip


def replied_file(inbound: Inbound) -> tuple[Attachment, str] | None:
    """The file and its sender an adapter stored with :func:`replied_file_extra` (the sender is
    ``"bot"`` when a bot or no known person sent it); None when there is none or it is not shaped
    as stored (the journal is read back, so check the types)."""
    data = inbound.extra.get(REPLIED_FILE)
    if not isinstance(data, dict):
        return None
    file_id, name, mime, size = data.get("file_id"), data.get("name"), data.get("mime"), data.get("size")
    if not (isinstance(file_id, str) and file_id and isinstance(name, str)):
        return None
    size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
    mime = mime if isinstance(mime, str) else None
    sender = data.get("sender")
    sender = "bot" if data.get("bot") is not False else sender if isinstance(sender, str) else ""
    return Attachment(file_id, name or "document", mime, size), sender


def replied_item(inbound: Inbound) -> ContextItem | None:
    """The replied-to message an adapter stored with :func:`replied_extra`, if any."""
    data = inbound.extra.get(REPLIED)
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        return None
    return ContextItem(
        author=str(data.get("author") or ""),
        text=data["text"],
        message_id=str(data.get("id") or ""),
        is_self=data.get("self") is True,
        is_bot=data.get("bot") is True,
        replied_to=True,
    )


@dataclass(frozen=True, slots=True)
class Button:
    """A button under a bot message (:meth:`Channel.send_buttons`); ``value`` comes back in the
    :class:`Action` of a press. ``style``: ``primary``, ``danger`` or ``""``."""

    label: str
    value: str
    style: str = ""


@dataclass(frozen=True, slots=True)
class Action:
    """A user pressed a :class:`Button` (Telegram callback query, Slack block action, Discord
    component interaction, Lark card action). ``value`` is the button's; ``message_id`` the message
    carrying it. Handed to the gateway through :meth:`Channel.hand_action`."""

    platform: str
    chat_id: str
    sender_id: str
    value: str
    message_id: str = ""
    sender_name: str = ""
    thread_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sender_name", clean_text(self.sender_name))

    @property
    def user(self) -> str:
        return f"{self.platform}:{self.sender_id}"


@dataclass(frozen=True, slots=True)
class ActionAnswer:
    """What the presser alone is told (a Telegram callback answer, a Slack ephemeral message, a
    Discord ephemeral reply, a Lark toast); ``refused`` marks a press that changed nothing."""

    text: str = ""
    refused: bool = False


ActionSink = Callable[[Action], Awaitable[ActionAnswer]]
"""The gateway's handler of button presses; it returns once the press is journaled."""


@dataclass(frozen=True, slots=True)
class OutFile:
    """A file to upload into a conversation: its name and bytes, already read and checked.

    Adapters get bytes, never a path: the gateway reads files the agent made through the agent's
    symlink-safe reader, so no adapter ever opens a path that sandboxed code could redirect."""

    name: str
    data: bytes
    voice: bool = False
    """A spoken answer (OGG/Opus) for a platform with voice messages (Telegram's ``sendVoice``);
    an adapter without them ignores it and uploads the audio like any file."""

    @property
    def suffix(self) -> str:
        dot = self.name.rfind(".")
        return self.name[dot:].lower() if dot > 0 else ""

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True, slots=True)
class Rendered:
    """One platform-ready message part: text plus whatever the adapter needs to send it
    (parse mode, entities, blocks, a card)."""

    text: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The platform facts shared delivery code paces and splits by."""

    max_message_len: int
    edit_interval: float
    """Minimum seconds between two edits of one message (streaming cadence)."""
    can_edit: bool = True
    min_send_interval: float = 0.0
    """Sustained spacing of sends into one chat (seconds per message); 0: only 429s slow us down."""
    send_burst: int = 1
    """Sends allowed back to back before ``min_send_interval`` spacing applies (a token bucket)."""
    picked_up_reaction: str | None = None
    """Emoji put on the user's message when its turn starts, or None."""
    done_reaction: str | None = None
    """Emoji put on the user's message once the answer is delivered (Slack's habit), or None."""
    max_upload_bytes: int = 20 * 1024 * 1024
    dedupes_sends: bool = False
    """The platform returns the earlier message for a repeated ``idempotency_key`` (Discord's nonce,
    Lark's uuid): a send whose result a crash lost can simply be repeated."""
    finds_orphans: bool = False
    """:meth:`Channel.recover` can tell whether a message was sent for a key (Slack's metadata):
    when it finds none, none was sent."""
    buttons: bool = False
    """:meth:`Channel.send_buttons` works and presses arrive as :class:`Action` values."""
