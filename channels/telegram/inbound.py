"""Telegram update → :class:`Inbound`: who is talking, was the bot addressed, what did they say.

Entity offsets are UTF-16 code units, so text surgery (stripping ``@bot``, ``/cmd@bot`` → ``/cmd``)
works on the UTF-16 encoding rather than on Python string indices.
"""

from __future__ import annotations

from telegram import Message, MessageEntity, Update
from telegram.constants import ChatType

from channels.base import Attachment, Inbound

PLATFORM = "telegram"


def to_inbound(update: Update, bot_id: int, bot_username: str) -> Inbound | None:
    """The :class:`Inbound` for ``update``, or ``None`` for what the agent never sees: updates
    without a new message (edits included), messages from bots, and service messages (joins,
    pins, topic changes) that carry neither text nor a file."""
    msg = update.message
    if msg is None or msg.from_user is None or msg.from_user.is_bot:
        return None
    if msg.text is not None:
        text, entities = msg.text, msg.entities
    else:  # a caption under a file or photo is the message's text
        text, entities = msg.caption or "", msg.caption_entities
    attachments = _attachments(msg)
    if not text.strip() and not attachments:
        return None

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
    )


def _attachments(msg: Message) -> tuple[Attachment, ...]:
    out: list[Attachment] = []
    if msg.document:
        d = msg.document
        out.append(Attachment(d.file_id, d.file_name or "document", d.mime_type, d.file_size))
    if msg.photo:
        p = max(msg.photo, key=lambda s: (s.file_size or 0, s.width * s.height))
        out.append(Attachment(p.file_id, f"photo_{p.file_unique_id}.jpg", "image/jpeg", p.file_size))
    if msg.audio:
        a = msg.audio
        name = a.file_name or "audio.mp3"
        out.append(Attachment(a.file_id, name, a.mime_type or "audio/mpeg", a.file_size))
    if msg.voice:
        v = msg.voice
        out.append(Attachment(v.file_id, f"voice_{v.file_unique_id}.ogg", v.mime_type or "audio/ogg",
                              v.file_size))  # fmt: skip
    if msg.video:
        v = msg.video
        out.append(Attachment(v.file_id, v.file_name or "video.mp4", v.mime_type or "video/mp4", v.file_size))
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
