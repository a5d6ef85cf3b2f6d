"""discord.py ``Message`` → :class:`Inbound`, and ids recovered from a MESSAGE_CREATE that did not parse.

Kept apart from :mod:`channels.discord.channel` (the gateway connection and REST) so that what a
user's post means reads in one place. What is not text becomes text where the agent can use it (a
poll, an embed, a forwarded message), attachments stay files (voice messages included), and stickers
get a plain note.
"""

from __future__ import annotations

import json
import re
from typing import Any

import discord

from channels.base import FORWARDED, Action, Attachment, ContextItem, Inbound, replied_extra

PLATFORM = "discord"


def to_inbound(message: discord.Message, me: int) -> Inbound | None:
    """The :class:`Inbound` of a person's post, or None for guild chatter with nothing in it."""
    channel = message.channel
    is_dm = message.guild is None
    if isinstance(channel, discord.Thread):
        chat_id, thread_id = str(channel.parent_id), str(channel.id)
    else:
        chat_id, thread_id = str(channel.id), None
    bot_roles = [r.id for r in message.role_mentions if r.tags is not None and r.tags.bot_id == me]
    mentioned = (any(u.id == me for u in message.mentions) or bool(bot_roles)
                 or re.search(rf"<@!?{me}>", message.content) is not None)  # fmt: skip
    text = _strip_mentions(message, me, bot_roles)
    files = list(message.attachments)
    for snap in message.message_snapshots:  # a forwarded message carries its own content and files
        files += snap.attachments
    attachments = tuple(_attachment(a) for a in files)
    extras = [t for t in (_forwarded(message), _poll(message), _embeds(message.embeds)) if t]
    text = "\n\n".join([text, *extras] if text else extras)
    addressed = is_dm or mentioned or _replies_to(message, me)
    unsupported = "stickers" if not text and not attachments and message.stickers else ""
    if not text and not attachments and not addressed:
        return None  # sticker- or embed-only chatter in a guild: not for the bot
    extra: dict[str, Any] = {"guild_id": str(message.guild.id)} if message.guild else {}
    extra.update(_replied(message, me))
    if message.message_snapshots:  # a forward: someone else's words (a snapshot names no author)
        extra[FORWARDED] = ""
    return Inbound(
        platform=PLATFORM,
        chat_id=chat_id,
        message_id=str(message.id),
        sender_id=str(message.author.id),
        text=text,
        is_direct=is_dm,
        addressed=addressed,
        thread_id=thread_id,
        sender_name=message.author.display_name,
        chat_title=_chat_title(message),
        attachments=attachments,
        received_at=message.created_at.timestamp(),
        extra=extra,
        unsupported=unsupported,
    )


def to_action(interaction: discord.Interaction[Any]) -> Action | None:
    """The :class:`Action` of a component interaction (a press of one of our buttons), or None for
    any other interaction or one whose fields are missing or mistyped. In a thread, ``chat_id`` is
    the parent channel, as for messages."""
    try:
        return _action(interaction)
    except (AttributeError, TypeError, ValueError):
        return None


def _action(interaction: discord.Interaction[Any]) -> Action | None:
    if interaction.type is not discord.InteractionType.component or interaction.channel_id is None:
        return None
    data: dict[str, Any] = dict(interaction.data or {})
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None
    channel, chat_id, thread_id = interaction.channel, str(interaction.channel_id), None
    parent = getattr(channel, "parent_id", None)
    if isinstance(channel, discord.Thread) and parent:
        chat_id, thread_id = str(parent), str(interaction.channel_id)
    user = interaction.user
    return Action(
        platform=PLATFORM,
        chat_id=chat_id,
        sender_id=str(user.id),
        value=custom_id,
        message_id=str(interaction.message.id) if interaction.message else "",
        sender_name=user.display_name or user.name,
        thread_id=thread_id,
    )


def _attachment(a: discord.Attachment) -> Attachment:
    """A voice message (recorded in the app: waveform and duration) is a voice note."""
    kind = "voice" if a.is_voice_message() else ""
    return Attachment(file_id=a.url, name=a.filename, mime_type=a.content_type, size=a.size, kind=kind)


def _forwarded(message: discord.Message) -> str:
    parts = []
    for snap in message.message_snapshots:
        body = "\n\n".join(t for t in (snap.content.strip(), _embeds(snap.embeds)) if t)
        if body:
            parts.append(f"(forwarded message) {body}")
    return "\n\n".join(parts)


def _poll(message: discord.Message) -> str:
    poll = message.poll
    if poll is None:
        return ""
    return "\n".join([f"📊 poll: {poll.question}", *(f"- {a.text}" for a in poll.answers)])


def _embeds(embeds: list[discord.Embed]) -> str:
    """Link previews and bot cards as text: title, description, link."""
    lines = []
    for e in embeds:
        head = " — ".join(str(x) for x in (e.title, e.description) if x)
        if e.url:
            head = f"{head} ({e.url})" if head else str(e.url)
        if head:
            lines.append(f"(embed) {head}")
    return "\n".join(lines)


def recover_ids(data: Any, me: int) -> dict[str, Any]:
    """What :meth:`Channel.skip_unreadable` needs, read defensively from a MESSAGE_CREATE payload
    discord.py could not parse (any field may be missing or of the wrong type)."""
    if not isinstance(data, dict):
        return {"ref": "MESSAGE_CREATE ?"}
    mid, cid, author = data.get("id"), data.get("channel_id"), data.get("author")
    out: dict[str, Any] = {"ref": f"message {mid if _is_id(mid) else '?'}"}
    if not _is_id(cid):
        return out
    author = author if isinstance(author, dict) else {}
    is_dm = not _is_id(data.get("guild_id"))
    mentions = _list(data.get("mentions"))
    said = json.dumps(data.get("content"), ensure_ascii=False)
    out.update(
        chat_id=str(cid),
        sender_id=str(author["id"]) if _is_id(author.get("id")) and author.get("bot") is not True else "",
        message_id=str(mid) if _is_id(mid) else "",
        is_direct=is_dm,
        addressed=is_dm or f"<@{me}>" in said or f"<@!{me}>" in said
        or any(isinstance(m, dict) and str(m.get("id")) == str(me) for m in mentions),
    )  # fmt: skip
    if not is_dm:
        out["extra"] = {"guild_id": str(data["guild_id"])}
    return out


def _is_id(value: Any) -> bool:
    """A Discord snowflake: digits, as a string or an int."""
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, str) and value.isdigit()
    )


def _replies_to(message: discord.Message, me: int) -> bool:
    ref = message.reference
    if ref is None or ref.message_id is None:
        return False
    resolved = ref.resolved if isinstance(ref.resolved, discord.Message) else ref.cached_message
    return resolved is not None and resolved.author.id == me


def _replied(message: discord.Message, me: int) -> dict[str, Any]:
    """The message this one replies to, from the payload's ``referenced_message`` (for the agent's
    context, channels.base.replied_extra); nothing when Discord did not include it."""
    ref = message.reference
    if ref is None or ref.message_id is None:
        return {}
    resolved = ref.resolved if isinstance(ref.resolved, discord.Message) else ref.cached_message
    return replied_extra(context_item(resolved, me, replied_to=True)) if resolved is not None else {}


def context_item(message: discord.Message, me: int, *, replied_to: bool = False) -> ContextItem:
    """An earlier message as thread context: mentions shown as @name, embeds as text."""
    body = "\n\n".join(t for t in (message.clean_content.strip(), _embeds(message.embeds)) if t)
    if not body:
        count = len(message.attachments)
        body = f"({count} attachment(s) without text)" if count else "(a message without text)"
    author = message.author
    return ContextItem(author.display_name, body, str(message.id), author.id == me, author.bot,
                       replied_to=replied_to)  # fmt: skip


def _strip_mentions(message: discord.Message, me: int, bot_roles: list[int]) -> str:
    """Remove the bot's own mention (user or managed role); show other mentions as @name."""
    text = re.sub(rf"<@!?{me}>", "", message.content)
    for rid in bot_roles:
        text = text.replace(f"<@&{rid}>", "")
    for user in message.mentions:
        if user.id != me:
            text = re.sub(rf"<@!?{user.id}>", f"@{user.display_name}", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def _chat_title(message: discord.Message) -> str:
    channel = message.channel
    if message.guild is None:
        return f"DM with {message.author.display_name}"
    name = getattr(channel, "name", None) or str(channel.id)
    if isinstance(channel, discord.Thread) and channel.parent is not None:
        return f"{message.guild.name} #{channel.parent.name} › {name}"
    return f"{message.guild.name} #{name}"


def _list(value: Any) -> list[Any]:
    """``value`` when the payload has an array there, else an empty one (malformed events)."""
    return value if isinstance(value, list) else []
