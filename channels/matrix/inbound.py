"""A Matrix room event -> :class:`Inbound`: pure functions, testable without a homeserver.

The sync loop (channels/matrix/sync.py) reads the raw JSON itself and hands each timeline event
here alone, so one event nio's parser would choke on never fails the whole batch. What an event
means:

* ``m.room.message`` from someone else with a string ``body`` is a message; its ``event_id`` is
  the journal's message id (stable across redelivery), the room id the chat id.
* a thread (``m.relates_to.rel_type == "m.thread"``) is its own conversation: the thread root's
  event id is the :attr:`Inbound.thread_id`, and the reply goes back into the thread.
* an edit (``m.replace``), a notice (``m.notice``: by convention what bots send, so two bots never
  answer each other forever), our own events and every other event type are not for the agent
  (``None``). Unknown types are normal in Matrix (reactions, redactions, state, custom types) and
  the spec tells clients to ignore them; they are not counted as malformed.
* an event of our kinds that lacks what the spec makes required (a string ``event_id``, ``sender``,
  ``type``, an object ``content``, a string ``body``) raises ``ValueError``/``TypeError``: the
  caller skips it as unreadable (counted, logged without its text, the sender told when known).
"""

from __future__ import annotations

import re
from typing import Any

from channels import malformed
from channels.base import Attachment, Inbound

PLATFORM = "matrix"
MESSAGE = "m.room.message"
ENCRYPTED = "m.room.encrypted"
MEMBER = "m.room.member"
UNSUPPORTED_TYPES = {
    "m.sticker": "stickers",
    "m.poll.start": "polls",
    "org.matrix.msc3381.poll.start": "polls",
}
"""Event types a person sends that the agent cannot use: answered with a note, not ignored."""
HANDLED = frozenset({MESSAGE, ENCRYPTED, *UNSUPPORTED_TYPES})
"""The event types :func:`to_inbound` reads; every other type is ignored (the spec says so)."""
FILE_TYPES = {"m.image": "image", "m.file": "", "m.audio": "audio", "m.video": ""}
TEXT_TYPES = frozenset({"m.text", "m.emote"})
ENCRYPTED_NOTE = (
    "end-to-end encrypted messages (I can't decrypt them: please talk to me in an unencrypted room)"
)
""":attr:`Inbound.unsupported` of an encrypted event: the gateway answers it with a note."""
REPLY_FALLBACK = re.compile(r"\A(?:>[^\n]*\n)+\n?")
COMMAND = re.compile(r"/[A-Za-z][\w-]*(?:\s|$)")
"""A command word at the start (``/status``, ``/new text``); a path (``/usr/bin``) is none."""


def is_sender(value: Any) -> bool:
    """A Matrix user id as the journal may key on it: ``@local:server``, short and printable."""
    return malformed.is_id(value) and value.startswith("@") and ":" in value


def check_event(event: Any) -> tuple[str, str, str, dict[str, Any]]:
    """``(type, event_id, sender, content)`` of a timeline event; ``ValueError``/``TypeError``
    when one of them is missing or of the wrong type (the spec makes all four required)."""
    if not isinstance(event, dict):
        raise TypeError("an event that is not an object")
    etype, event_id, sender, content = (event.get(k) for k in ("type", "event_id", "sender", "content"))
    if not isinstance(etype, str) or not etype:
        raise TypeError("an event without a type")
    if not malformed.is_id(event_id) or not is_sender(sender):
        raise ValueError("an event without a usable event_id or sender")
    if not isinstance(content, dict):
        raise TypeError("an event whose content is not an object")
    return etype, event_id, str(sender), content


def relation(content: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """``(rel_type, related event id, replied-to event id)`` of an event's ``m.relates_to``."""
    rel = content.get("m.relates_to")
    if rel is None:
        return None, None, None
    if not isinstance(rel, dict):
        raise TypeError("m.relates_to is not an object")
    rel_type, related = rel.get("rel_type"), rel.get("event_id")
    reply = rel.get("m.in_reply_to")
    replied = reply.get("event_id") if isinstance(reply, dict) else None
    if isinstance(rel_type, str) and rel_type == "m.thread" and rel.get("is_falling_back") is True:
        replied = None  # a plain message in a thread: the "reply" is only the fallback for old clients
    return (
        rel_type if isinstance(rel_type, str) else None,
        related if malformed.is_id(related) else None,
        replied if malformed.is_id(replied) else None,
    )


def names_me(content: dict[str, Any], body: str, me: str, display_name: str) -> bool:
    """The bot is mentioned: listed in ``m.mentions.user_ids`` (intentional mentions, spec v1.7),
    linked in the formatted body (a pill), or named by its user id or display name in the text."""
    mentions = content.get("m.mentions")
    if isinstance(mentions, dict):
        ids = mentions.get("user_ids")
        if isinstance(ids, list) and me in ids:
            return True
    formatted = content.get("formatted_body")
    if isinstance(formatted, str) and f"matrix.to/#/{me}" in formatted:
        return True
    low = body.lower()
    if me.lower() in low:
        return True
    name = display_name.strip().lower()
    return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", low) is not None


def strip_address(text: str, me: str, display_name: str) -> str:
    """``text`` without a leading ``Name:`` / ``@bot:server,`` address (how clients write a
    mention), so the agent reads what was said to it."""
    for who in (me, display_name.strip()):
        if who and text.lower().startswith(who.lower()):
            rest = text[len(who) :]
            if not rest or rest[0] in ":, \n":
                return rest.lstrip(":, \n")
    return text


def to_inbound(
    room_id: str,
    event: dict[str, Any],
    *,
    me: str,
    display_name: str,
    is_direct: bool,
    replies_to_me: bool,
) -> Inbound | None:
    """The :class:`Inbound` of an ``m.room.message`` event, or None when it is not for the agent
    (see the module docstring). ``replies_to_me``: the event it answers was sent by the bot."""
    etype, event_id, sender, content = check_event(event)
    if sender == me:
        return None
    rel_type, related, replied = relation(content)
    thread_id = related if rel_type == "m.thread" else None
    if etype == ENCRYPTED:
        return Inbound(platform=PLATFORM, chat_id=room_id, message_id=event_id, sender_id=sender,
                       text="", is_direct=is_direct, addressed=is_direct, thread_id=thread_id,
                       unsupported=ENCRYPTED_NOTE)  # fmt: skip
    if etype in UNSUPPORTED_TYPES:
        return Inbound(platform=PLATFORM, chat_id=room_id, message_id=event_id, sender_id=sender, text="",
                       is_direct=is_direct, addressed=is_direct or replies_to_me, thread_id=thread_id,
                       unsupported=UNSUPPORTED_TYPES[etype])  # fmt: skip
    if etype != MESSAGE or rel_type == "m.replace" or "m.new_content" in content:
        return None  # edits re-run nothing: one inbound message, at most one reply
    msgtype, body = content.get("msgtype"), content.get("body")
    if not isinstance(msgtype, str) or not isinstance(body, str):
        raise TypeError("a message without a string msgtype and body")
    if msgtype == "m.notice":
        return None
    if replied:  # the quoted original old clients put in front of a reply (spec: strip it)
        body = REPLY_FALLBACK.sub("", body, count=1)
    attachments: tuple[Attachment, ...] = ()
    unsupported = ""
    text = body
    if msgtype in FILE_TYPES:
        attachments, text, unsupported = _file(msgtype, content, body)
    elif msgtype not in TEXT_TYPES and msgtype not in ("m.location",):
        pass  # an unknown msgtype: the spec says show its body, so the body is the text
    elif msgtype == "m.location":
        geo = content.get("geo_uri")
        text = f"(shared a location: {geo if isinstance(geo, str) else body})"
    addressed = (
        is_direct
        or replies_to_me
        or names_me(content, body, me, display_name)
        or COMMAND.match(text.lstrip()) is not None
    )
    text = strip_address(text.lstrip(), me, display_name)
    extra: dict[str, Any] = {}
    if thread_id:
        extra["thread_root"] = thread_id
    return Inbound(
        platform=PLATFORM,
        chat_id=room_id,
        message_id=event_id,
        sender_id=sender,
        text=text,
        is_direct=is_direct,
        addressed=addressed,
        thread_id=thread_id,
        sender_name=sender,
        attachments=attachments,
        extra=extra,
        unsupported=unsupported,
    )


def _file(msgtype: str, content: dict[str, Any], body: str) -> tuple[tuple[Attachment, ...], str, str]:
    """A file event's attachment and caption. Spec v1.10: with a ``filename`` the body is a
    caption, without one the body is the file name. An encrypted file (``file`` instead of
    ``url``) cannot be read without keys."""
    url, info = content.get("url"), content.get("info")
    info = info if isinstance(info, dict) else {}
    if not isinstance(url, str):
        if isinstance(content.get("file"), dict):
            return (), "", "encrypted files"
        raise TypeError("a file message without a url")
    if not url.startswith("mxc://") or not malformed.is_id(url):
        raise ValueError("a file url that is not an mxc:// uri")
    filename = content.get("filename")
    name = filename if isinstance(filename, str) and filename else body
    caption = body if isinstance(filename, str) and filename and body != filename else ""
    size, mime = info.get("size"), info.get("mimetype")
    kind = FILE_TYPES[msgtype]
    if msgtype == "m.audio" and "org.matrix.msc3245.voice" in content:
        kind = "voice"
    attachment = Attachment(
        file_id=url,
        name=(name or "file")[:255],
        mime_type=mime if isinstance(mime, str) else None,
        size=size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None,
        kind=kind,
    )
    return (attachment,), caption, ""


def obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def own_join(event: Any, me: str) -> bool:
    """``event`` is the bot's own join (not a profile change, which is a membership event too)."""
    if not isinstance(event, dict) or event.get("type") != MEMBER or event.get("state_key") != me:
        return False
    prev = obj(obj(event.get("unsigned")).get("prev_content")).get("membership")
    return obj(event.get("content")).get("membership") == "join" and prev != "join"


def recover_ids(room_id: str, event: Any) -> dict[str, Any]:
    """The ids a malformed event still names, for :meth:`Channel.skip_unreadable` (only those that
    are usable; the sender only when it looks like a user id)."""
    raw = event if isinstance(event, dict) else {}
    event_id, sender = raw.get("event_id"), raw.get("sender")
    return {
        "ref": f"event {event_id}" if malformed.is_id(event_id) else "event ?",
        "chat_id": room_id,
        "message_id": event_id if malformed.is_id(event_id) else "",
        "sender_id": sender if is_sender(sender) else "",
    }
