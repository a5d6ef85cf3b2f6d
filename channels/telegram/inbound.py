"""Telegram update → :class:`Inbound`: who is talking, was the bot addressed, what did they say.

Entity offsets are UTF-16 code units, so text surgery (stripping ``@bot``, ``/cmd@bot`` → ``/cmd``)
works on the UTF-16 encoding rather than on Python string indices.

What is not text becomes text where the agent can use it (a location, a contact, a poll, a die),
an attachment where it can be downloaded (voice, audio, video, video notes, GIFs), and otherwise an
``unsupported`` kind the gateway answers with a plain note (stickers, games, stories ...).
"""

from __future__ import annotations

import json
from typing import Any

from telegram import Message, MessageEntity, Update
from telegram.constants import ChatType

from channels import malformed
from channels.base import (
    FORWARDED,
    Action,
    Attachment,
    ContextItem,
    Inbound,
    clean_text,
    replied_extra,
    replied_file_extra,
)

PLATFORM = "telegram"
GETFILE_MAX = 20 * 1024 * 1024
"""The largest file the Bot API lets a bot download (getFile)."""


def to_inbound(update: Update, bot_id: int, bot_username: str) -> Inbound | None:
    """The :class:`Inbound` for ``update``, or ``None`` for what the agent never sees: updates
    without a new message (edits included), messages from bots, and service messages (joins,
    pins, topic changes). Raises ``ValueError`` when the ids or the text have the wrong type (PTB
    does not check types), so the caller skips the update as unreadable instead of keying the
    journal on ``"None"``."""
    msg = update.message
    if msg is None or msg.from_user is None or msg.from_user.is_bot:
        return None
    _check_types(msg)
    if msg.text is not None:
        text, entities = msg.text, msg.entities
    else:  # a caption under a file or photo is the message's text
        text, entities = msg.caption or "", msg.caption_entities
    text = clean_text(text)  # before the UTF-16 surgery below, which a lone surrogate would break
    attachments = _attachments(msg)
    unsupported = ""
    if not text.strip() and not attachments:
        text, unsupported = _not_text(msg)
        entities = ()
        if not text and not unsupported:
            return None  # a service message

    me = bot_username.lower()
    is_direct = msg.chat.type == ChatType.PRIVATE
    mentioned = command = other_bots_command = False
    cuts: list[tuple[int, int]] = []  # UTF-16 ranges to remove from the text
    for ent in entities:
        frag = _u16_slice(text, ent.offset, ent.length)
        if ent.type == MessageEntity.MENTION and frag[1:].lower() == me:
            mentioned = True
            cuts.append((ent.offset, ent.offset + ent.length))
        elif ent.type == MessageEntity.TEXT_MENTION and ent.user is not None and ent.user.id == bot_id:
            mentioned = True
            cuts.append((ent.offset, ent.offset + ent.length))
        elif ent.type == MessageEntity.BOT_COMMAND:
            name, _, at = frag.partition("@")
            if at and at.lower() == me:  # "/cmd@us args" → "/cmd args"
                command = True
                cuts.append((ent.offset + _u16_len(name), ent.offset + ent.length))
            elif at:
                other_bots_command = other_bots_command or ent.offset == 0
            elif ent.offset == 0:
                command = True
    reply = msg.reply_to_message
    # In forum topics every message "replies" to the topic's creation message: that is no reply.
    replied = (
        reply is not None
        and reply.forum_topic_created is None
        and reply.from_user is not None
        and reply.from_user.id == bot_id
    )
    addressed = is_direct or ((mentioned or command or replied) and not other_bots_command)
    extra = _replied(msg, bot_id)
    if reply is not None and reply.forum_topic_created is None:
        extra.update(_replied_file(reply))
    if msg.forward_origin is not None:  # someone else's words, forwarded by the sender
        extra[FORWARDED] = _origin_name(msg.forward_origin)

    chat = msg.chat
    thread_id = str(msg.message_thread_id) if msg.is_topic_message and msg.message_thread_id else None
    return Inbound(
        platform=PLATFORM,
        chat_id=str(chat.id),
        message_id=str(msg.message_id),
        sender_id=str(msg.from_user.id),
        text=_cut(text, cuts),
        is_direct=is_direct,
        addressed=addressed,
        thread_id=thread_id,
        sender_name=msg.from_user.full_name,
        chat_title=chat.effective_name or "",
        attachments=attachments,
        extra=extra,
        unsupported=unsupported,
    )


def to_action(raw: Any) -> Action | None:
    """The :class:`Action` of a ``callback_query`` update (a press of an inline keyboard button
    under one of our messages), or None when it carries no data or no message we can answer on."""
    query = _dict(_dict(raw).get("callback_query"))
    sender, msg = _dict(query.get("from")), _dict(query.get("message"))
    chat = _dict(msg.get("chat"))
    data, qid = query.get("data"), query.get("id")
    if not (malformed.is_id(data) and malformed.is_id(qid) and _is_int(sender.get("id"))):
        return None  # callback_data is at most 64 bytes; a query id is short
    if not _is_int(chat.get("id")) or not _is_int(msg.get("message_id")):
        return None
    name = " ".join(str(sender[k]) for k in ("first_name", "last_name") if isinstance(sender.get(k), str))
    thread = msg.get("message_thread_id") if msg.get("is_topic_message") else None
    return Action(
        platform=PLATFORM,
        chat_id=str(chat["id"]),
        sender_id=str(sender["id"]),
        value=data,
        message_id=str(msg["message_id"]),
        sender_name=name or str(sender["id"]),
        thread_id=str(thread) if _is_int(thread) else None,
    )


BODIES = ("message", "callback_query")
"""The update kinds the bot asks for (``allowed_updates``)."""


def update_body(raw: Any) -> str | None:
    """Which of :data:`BODIES` ``raw`` carries, ``"other"`` for a well-formed update of another
    kind (ignored), or None when it is malformed: not an object, no integer ``update_id``, one of
    our kinds present but not an object (``"message": null``), or no body at all."""
    if not isinstance(raw, dict) or not _is_int(raw.get("update_id")):
        return None
    for key in BODIES:
        if key in raw:
            return key if isinstance(raw[key], dict) else None
    bodies = [v for k, v in raw.items() if k != "update_id"]
    return "other" if bodies and all(isinstance(v, dict) for v in bodies) else None


def reject_nulls(value: Any, depth: int = 0) -> None:
    """Raise ``ValueError`` for a ``null`` anywhere in an update: the Bot API leaves out a field it
    has no value for and never sends null, and PTB would take a null ``text`` for a service
    message and drop it without a word. Objects nested deeper than 32 levels are refused too."""
    if value is None:
        raise ValueError("a null in the update")
    if depth > 32:
        raise ValueError("an update nested too deep")
    if isinstance(value, dict):
        for item in value.values():
            reject_nulls(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            reject_nulls(item, depth + 1)


def _replied(msg: Message, bot_id: int) -> dict[str, Any]:
    """The message ``msg`` replies to, for the agent's context (channels.base.replied_extra): the
    update carries it, and a bot cannot fetch history. A forum topic's creation notice, which
    every topic message "replies" to, is none. ``quote`` is the part the user picked out."""
    reply = msg.reply_to_message
    quote = msg.quote.text if msg.quote is not None and isinstance(msg.quote.text, str) else ""
    if reply is None or reply.forum_topic_created is not None:
        if not quote:
            return {}
        item = ContextItem("a message elsewhere", quote, replied_to=True)
        return replied_extra(item)
    sender = reply.from_user
    author = sender.full_name if sender else ""
    if not author and reply.sender_chat is not None:
        author = reply.sender_chat.effective_name or ""
    text = next((t for t in (reply.text, reply.caption) if isinstance(t, str) and t.strip()), "")
    if not text:
        kind = next((k for k in _REPLY_KINDS if getattr(reply, k, None)), "a message")
        text = f"({kind} without text)"
    if quote:
        text += f"\n(the part quoted in the reply: {quote})"
    is_self = sender is not None and sender.id == bot_id
    item = ContextItem(author or "someone", text, str(reply.message_id), is_self,
                       sender is not None and sender.is_bot, replied_to=True)  # fmt: skip
    return replied_extra(item)


def _replied_file(reply: Message) -> dict[str, Any]:
    """The replied-to message's document, for ``/skills install`` sent as a reply to an archive
    (channels/messages.py ``REPLIED_FILE``); nothing when it has none or its fields have the wrong
    types (PTB does not check them)."""
    d, by = reply.document, reply.from_user
    if d is None or not isinstance(d.file_id, str) or not isinstance(d.file_name, str | None):
        return {}
    size = d.file_size if isinstance(d.file_size, int) else None
    mime = d.mime_type if isinstance(d.mime_type, str) else None
    found = Attachment(d.file_id, d.file_name or "document", mime, size)
    sender = f"{PLATFORM}:{by.id}" if by is not None else ""
    return replied_file_extra(found, sender, from_bot=by is None or by.is_bot is not False)


_REPLY_KINDS = ("photo", "document", "voice", "audio", "video", "sticker", "poll", "location")


def _origin_name(origin: Any) -> str:
    """Who wrote a forwarded message, as far as Telegram says (a hidden user gives only a name)."""
    user = getattr(origin, "sender_user", None)
    chat = getattr(origin, "sender_chat", None) or getattr(origin, "chat", None)
    name = (
        (user.full_name if user is not None else "")
        or getattr(origin, "sender_user_name", "")
        or (getattr(chat, "title", "") if chat is not None else "")
    )
    return str(name or "")


def _check_types(msg: Message) -> None:
    ints = (msg.message_id, msg.chat.id, msg.from_user.id if msg.from_user else 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
        raise ValueError("message, chat or sender id is not an integer")
    if not all(v is None or isinstance(v, str) for v in (msg.text, msg.caption)):
        raise ValueError("text or caption is not a string")


# Content the agent cannot use yet, by the Message attribute that carries it (checked in order).
_UNSUPPORTED = (
    ("sticker", "stickers"), ("game", "games"), ("story", "stories"), ("paid_media", "paid media"),
    ("giveaway", "giveaways"), ("giveaway_winners", "giveaways"), ("invoice", "invoices"),
    ("checklist", "checklists"),
)  # fmt: skip


def _not_text(msg: Message) -> tuple[str, str]:
    """(text, unsupported kind) of a message with neither text, caption nor a file."""
    if msg.venue is not None:  # a venue carries its location too: say both
        v = msg.venue
        return f"📍 location: {v.location.latitude}, {v.location.longitude} ({v.title}, {v.address})", ""
    if msg.location is not None:
        loc = msg.location
        live = " (live)" if loc.live_period else ""
        return f"📍 location: {loc.latitude}, {loc.longitude}{live}", ""
    if msg.contact is not None:
        c = msg.contact
        name = " ".join(p for p in (c.first_name, c.last_name) if p)
        return f"👤 contact: {name}, phone {c.phone_number}", ""
    if msg.poll is not None:
        p = msg.poll
        kind = "quiz" if p.type == "quiz" else "poll"
        return "\n".join([f"📊 {kind}: {p.question}", *(f"- {o.text}" for o in p.options)]), ""
    if msg.dice is not None:
        return f"{msg.dice.emoji} rolled {msg.dice.value}", ""
    for attr, kind in _UNSUPPORTED:
        if getattr(msg, attr, None):
            return "", kind
    # A field newer than this PTB knows lands in api_kwargs: in a DM that is most likely content
    # a newer Bot API added, and the user deserves a word rather than silence.
    if msg.api_kwargs and msg.chat.type == ChatType.PRIVATE:
        return "", "messages of this kind"
    return "", ""


def recover_ids(raw: Any, bot_id: int, bot_username: str) -> dict[str, Any]:
    """What :meth:`Channel.skip_unreadable` needs, read defensively from an update PTB could not
    parse: every field may be missing or of the wrong type. A sender is only named when it is a
    person (in a private chat the chat id is the user id); a message without an id gets one made
    from the update id, so the note is still journaled once per update."""
    out: dict[str, Any] = {"ref": "?"}
    if not isinstance(raw, dict):
        return out
    uid = raw.get("update_id")
    out["ref"] = f"update {uid}" if _is_int(uid) else "update ?"
    msg = raw.get("message")
    if not isinstance(msg, dict):
        return out
    chat = _dict(msg.get("chat"))
    sender = _dict(msg.get("from"))
    chat_id, sender_id, mid = chat.get("id"), sender.get("id"), msg.get("message_id")
    is_direct = chat.get("type") == "private"
    if not _is_int(chat_id) or sender.get("is_bot") is True:
        return out
    if not _is_int(sender_id):
        sender_id = chat_id if is_direct else None
    out.update(chat_id=str(chat_id), sender_id=str(sender_id) if sender_id is not None else "",
               is_direct=is_direct)  # fmt: skip
    out["message_id"] = str(mid) if _is_int(mid) else (f"u{uid}" if _is_int(uid) else "")
    thread = msg.get("message_thread_id")
    if msg.get("is_topic_message") is True and _is_int(thread):
        out["thread_id"] = str(thread)
    reply = _dict(msg.get("reply_to_message"))
    replier = _dict(reply.get("from"))
    said = json.dumps([msg.get("text"), msg.get("caption")], ensure_ascii=False).lower()
    out["addressed"] = (
        is_direct or f"@{bot_username.lower()}" in said or replier.get("id") == bot_id
        or (isinstance(msg.get("text"), str) and msg["text"].startswith("/"))
    )  # fmt: skip
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _attachments(msg: Message) -> tuple[Attachment, ...]:
    out: list[Attachment] = []
    if msg.document:
        d = msg.document
        out.append(Attachment(d.file_id, d.file_name or "document", d.mime_type, d.file_size))
    if msg.photo:
        # The largest size a bot may download (getFile serves 20 MB at most); sizes whose file
        # size is not stated count as fitting (Telegram compresses photos to a few MB anyway).
        fits = [s for s in msg.photo if (s.file_size or 0) <= GETFILE_MAX] or list(msg.photo)
        p = max(fits, key=lambda s: (s.width * s.height, s.file_size or 0))
        out.append(Attachment(p.file_id, f"photo_{p.file_unique_id}.jpg", "image/jpeg", p.file_size,
                              kind="image"))  # fmt: skip
    if msg.audio:
        a = msg.audio
        name = a.file_name or "audio.mp3"
        out.append(Attachment(a.file_id, name, a.mime_type or "audio/mpeg", a.file_size, kind="audio"))
    if msg.voice:
        v = msg.voice
        out.append(Attachment(v.file_id, f"voice_{v.file_unique_id}.ogg", v.mime_type or "audio/ogg",
                              v.file_size, kind="voice"))  # fmt: skip
    if msg.video:
        vid = msg.video
        name = vid.file_name or "video.mp4"
        out.append(Attachment(vid.file_id, name, vid.mime_type or "video/mp4", vid.file_size))
    if msg.video_note:
        n = msg.video_note
        out.append(Attachment(n.file_id, f"video_note_{n.file_unique_id}.mp4", "video/mp4", n.file_size))
    # A GIF arrives as an animation and as a document of the same file: take it once.
    if msg.animation and not (msg.document and msg.document.file_id == msg.animation.file_id):
        gif = msg.animation
        out.append(Attachment(gif.file_id, gif.file_name or "animation.mp4", gif.mime_type or "video/mp4",
                              gif.file_size))  # fmt: skip
    return tuple(out)


def _u16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _u16_slice(text: str, offset: int, length: int) -> str:
    raw = text.encode("utf-16-le")
    return raw[2 * offset : 2 * (offset + length)].decode("utf-16-le", "ignore")


def _cut(text: str, cuts: list[tuple[int, int]]) -> str:
    """``text`` without the UTF-16 ranges in ``cuts``, with the whitespace they leave tidied."""
    if not cuts:
        return text
    raw = text.encode("utf-16-le")
    for start, end in sorted(cuts, reverse=True):
        left = raw[: 2 * start].decode("utf-16-le", "ignore").rstrip(" ")
        right = raw[2 * end :].decode("utf-16-le", "ignore").lstrip(" ")
        glue = " " if left and right and not left.endswith("\n") and right[0] not in ",.:;!?\n" else ""
        raw = (left + glue + right).encode("utf-16-le")
    return raw.decode("utf-16-le").strip()


def _dict(value: Any) -> dict[str, Any]:
    """``value`` when the payload has an object there, else an empty one (malformed events)."""
    return value if isinstance(value, dict) else {}
