"""Lark ``im.message.receive_v1`` → :class:`Inbound`, and ids recovered from an event that did not parse.

A message's ``content`` is a JSON *string* whose shape depends on ``message_type``. What the agent can
use becomes text (text, rich posts, a location, a poll, a calendar event, a meeting, a task) or files
(images, files, audio, video); what it cannot use gets a plain note through ``unsupported`` (stickers,
shared chats and contacts, forwarded chat histories, red packets ...). Content that is not valid JSON,
or not the shape its type promises, raises ``ValueError``: the adapter skips the event as unreadable
(and acks it) instead of answering its raw JSON back to the user.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable
from typing import Any

from lark_oapi.api.im.v1 import P2ImMessageReceiveV1
from lark_oapi.event.callback.model.p2_card_action_trigger import P2CardActionTrigger

from channels import malformed
from channels.base import Action, Attachment, ContextItem, Inbound

PLATFORM = "lark"

# msg_type -> what the note calls it (plural noun phrase, see Inbound.unsupported)
_UNSUPPORTED = {
    "sticker": "stickers", "share_chat": "shared group chats", "share_user": "shared contacts",
    "merge_forward": "forwarded chat histories", "hongbao": "red packets", "interactive": "cards",
    "folder": "shared folders",
}  # fmt: skip
_SERVICE = frozenset({"system"})  # group notices (joins, renames): not a person speaking


def attachment_id(message_id: str, kind: str, key: str) -> str:
    """The handle :meth:`LarkChannel.download` needs: resources are fetched per (message, key)."""
    return f"{message_id}|{kind}|{key}"


def parse_attachment_id(file_id: str) -> tuple[str, str, str]:
    message_id, kind, key = file_id.split("|", 2)
    return message_id, kind, key


BUTTON_VALUE_KEY = "chital"
"""Key of a card button's callback value that carries our :class:`~channels.base.Button` value."""


def to_action(data: P2CardActionTrigger) -> Action | None:
    """The :class:`Action` of a ``card.action.trigger`` callback (a press of one of our card
    buttons), or None when it is not ours or lacks the presser, message or chat."""
    event = data.event
    if event is None or event.action is None or event.operator is None or event.context is None:
        return None
    values = event.action.value
    value = values.get(BUTTON_VALUE_KEY) if isinstance(values, dict) else None
    open_id, chat_id = event.operator.open_id, event.context.open_chat_id
    message_id = event.context.open_message_id
    if not all(malformed.is_id(v) for v in (value, open_id, chat_id, message_id)):
        return None
    return Action(
        platform=PLATFORM,
        chat_id=str(chat_id),
        sender_id=str(open_id),
        value=str(value),
        message_id=str(message_id),
    )


def to_inbound(data: P2ImMessageReceiveV1, bot_open_id: str | None) -> Inbound | None:
    """The :class:`Inbound` of a person's message, or None for bots, our own echoes and service
    notices. Raises ``ValueError`` for an event without its ids or with unreadable content."""
    event = data.event
    msg = event.message if event else None
    sender = event.sender if event else None
    if msg is None or sender is None or not msg.message_id or not msg.chat_id:
        raise ValueError("an event without a message, sender, message id or chat id")
    sender_id = sender.sender_id.open_id if sender.sender_id else None
    # Only people: other bots (and our own echoes) must not start conversations or loops.
    if sender.sender_type not in (None, "user") or sender_id == bot_open_id:
        return None
    if not sender_id:
        raise ValueError("a user's message without a sender id")
    if not (isinstance(msg.message_type, str) and isinstance(msg.content, str)):
        raise ValueError("a message without a type or content string")
    msg_type = msg.message_type
    if msg_type in _SERVICE:
        return None
    text, attachments, unsupported = message_content(msg_type, msg.content or "", msg.message_id)
    mentions = [(m.key or "", m.name or "", (m.id.open_id if m.id else "") or "") for m in msg.mentions or []]
    is_direct = msg.chat_type == "p2p"
    mentioned = any(open_id == bot_open_id for _, _, open_id in mentions)
    return Inbound(
        platform=PLATFORM,
        chat_id=msg.chat_id,
        message_id=msg.message_id,
        sender_id=sender_id,
        text=resolve_mentions(text, mentions, bot_open_id or ""),
        is_direct=is_direct,
        addressed=is_direct or mentioned,
        # Topics (topic groups, "reply in thread") carry a thread_id and are their own
        # conversation; a plain quote-reply (root_id only) stays in the chat's conversation.
        thread_id=msg.thread_id or None,
        attachments=tuple(attachments),
        extra={"chat_type": msg.chat_type or "", **_thread_ids(msg)},
        unsupported=unsupported,
    )


def _thread_ids(msg: Any) -> dict[str, str]:
    """The ids the adapter needs to fetch the thread's context (parent, root, creation time)."""
    ids = {"parent_id": msg.parent_id, "root_id": msg.root_id, "create_time": msg.create_time}
    return {k: v for k, v in ids.items() if isinstance(v, str) and v}


def context_item(message: Any, app_id: str, bot_open_id: str) -> ContextItem | None:
    """A message of the im/v1 message get/list API (``lark_oapi...Message``) as thread context,
    or None for a deleted message or a group notice. Names come from ``with_sender_name``;
    without it a person shows as the tail of their open_id."""
    if message is None or message.deleted or not message.message_id or message.msg_type in _SERVICE:
        return None
    sender = message.sender
    sender_id = (sender.id if sender else "") or ""
    is_app = sender is not None and sender.sender_type == "app"
    is_self = is_app and sender_id in (app_id, bot_open_id)
    name = (sender.sender_name if sender else "") or (f"user …{sender_id[-6:]}" if sender_id else "someone")
    content = message.body.content if message.body is not None else ""
    try:
        text, files, unsupported = message_content(message.msg_type or "", content or "", message.message_id)
    except (ValueError, TypeError, AttributeError):
        text, files, unsupported = "", [], "a message this bot cannot read"
    if message.msg_type == "interactive" and not text:
        text, unsupported = _card_text(content or ""), ""
    mentions = [(m.key or "", m.name or "", m.id or "") for m in message.mentions or []]
    text = resolve_mentions(text, mentions, "")
    if files:
        text = f"{text}\n({len(files)} file(s))" if text else f"({len(files)} file(s))"
    return ContextItem(str(name), text or f"({unsupported or 'a message without text'})",
                       message.message_id, is_self, is_app, replied_to=False)  # fmt: skip


def _card_text(content: str) -> str:
    """The text of a card (the bot's own answers are cards): its markdown elements joined."""
    try:
        card = json.loads(content)
    except ValueError:
        return ""
    card = card if isinstance(card, dict) else {}
    elements = _dict(card.get("body")).get("elements") or card.get("elements") or []
    parts = [str(e.get("content") or e.get("text") or "") for e in _list(elements) if isinstance(e, dict)]
    return "\n".join(p for p in parts if p).strip()


def message_content(msg_type: str, content: str, message_id: str) -> tuple[str, list[Attachment], str]:
    """(text, attachments, unsupported kind) of a received message's ``content`` JSON string."""
    data = json.loads(content or "{}")  # ValueError: the caller skips the event as unreadable
    if not isinstance(data, dict):
        raise ValueError("message content is not a JSON object")
    if msg_type == "text":
        if not isinstance(data.get("text", ""), str):
            raise ValueError("text content is not a string")
        return data.get("text", ""), [], ""
    if msg_type == "post":
        text, files = _post_text(data, message_id)
        return text, files, ""
    if msg_type == "image" and data.get("image_key"):
        key = str(data["image_key"])
        image = Attachment(attachment_id(message_id, "image", key), "image.png", "image/png", kind="image")
        return "", [image], ""
    if msg_type == "audio" and data.get("file_key"):
        # A voice message recorded in Lark: Opus in an Ogg container.
        key = str(data["file_key"])
        voice = Attachment(attachment_id(message_id, "file", key), str(data.get("file_name") or "audio.opus"),
                           "audio/ogg", kind="voice")  # fmt: skip
        return "", [voice], ""
    if msg_type in ("file", "media") and data.get("file_key"):
        key = str(data["file_key"])
        default = "video.mp4" if msg_type == "media" else "file"
        name = str(data.get("file_name") or default)
        return "", [Attachment(attachment_id(message_id, "file", key), name)], ""
    text = _as_text(msg_type, data)
    if text:
        return text, [], ""
    return "", [], _UNSUPPORTED.get(msg_type) or "messages of this kind"


def _as_text(msg_type: str, data: dict[str, Any]) -> str:
    """The message kinds that are not text but say something the agent can use."""
    if msg_type == "location":
        name = f" ({data['name']})" if data.get("name") else ""
        return f"📍 location: {data.get('latitude')}, {data.get('longitude')}{name}"
    if msg_type == "vote":
        options = _list(data.get("options"))
        return "\n".join([f"📊 poll: {data.get('topic', '')}", *(f"- {o}" for o in options)])
    if msg_type in ("share_calendar_event", "calendar", "general_calendar") and data.get("summary"):
        when = " – ".join(t for t in (_ms(data.get("start_time")), _ms(data.get("end_time"))) if t)
        return f"📅 event: {data['summary']}" + (f" ({when})" if when else "")
    if msg_type == "video_chat" and data.get("topic"):
        when = _ms(data.get("start_time"))
        return f"📹 meeting: {data['topic']}" + (f" ({when})" if when else "")
    if msg_type == "todo":
        summary = data.get("summary")
        text = _post_text(summary, "")[0] if isinstance(summary, dict) else str(summary or "")
        return f"☑️ task: {text}" if text else ""
    return ""


def _ms(value: Any) -> str:
    """A Lark millisecond timestamp (often a string) as UTC ISO time, or ''."""
    try:
        return dt.datetime.fromtimestamp(int(value) / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return ""


def recover_ids(payload: Any, bot_open_id: str | None) -> dict[str, Any]:
    """What :meth:`Channel.skip_unreadable` needs, read defensively from the raw event payload
    (bytes of JSON, maybe not even that)."""
    try:
        body = json.loads(payload) if isinstance(payload, bytes | str) else payload
    except ValueError:
        return {"ref": "event ?"}
    body = body if isinstance(body, dict) else {}
    header = _dict(body.get("header"))
    event = _dict(body.get("event"))
    msg = _dict(event.get("message"))
    sender = _dict(event.get("sender"))
    sender_ids = _dict(sender.get("sender_id"))
    out: dict[str, Any] = {"ref": f"event {header.get('event_id', '?')}"}
    chat_id, message_id, open_id = msg.get("chat_id"), msg.get("message_id"), sender_ids.get("open_id")
    if not (isinstance(chat_id, str) and chat_id):
        return out
    person = (
        sender.get("sender_type") in (None, "user") and isinstance(open_id, str) and open_id != bot_open_id
    )
    is_direct = msg.get("chat_type") == "p2p"
    mentions = json.dumps(msg.get("mentions"), ensure_ascii=False)
    out.update(
        chat_id=chat_id,
        sender_id=open_id if person else "",
        message_id=message_id if isinstance(message_id, str) else "",
        is_direct=is_direct,
        addressed=is_direct or bool(bot_open_id and bot_open_id in mentions),
        thread_id=msg.get("thread_id")
        if isinstance(msg.get("thread_id"), str) and msg.get("thread_id")
        else None,
        extra={"chat_type": msg.get("chat_type") if isinstance(msg.get("chat_type"), str) else ""},
    )
    return out


def _post_text(data: dict[str, Any], message_id: str) -> tuple[str, list[Attachment]]:
    # A received post is {"title", "content": [[element, ...], ...]}; a sent one nests it per locale.
    if "content" not in data:
        data = next((v for v in data.values() if isinstance(v, dict) and "content" in v), {})
    lines: list[str] = [str(data["title"])] if data.get("title") else []
    attachments: list[Attachment] = []
    for paragraph in data.get("content") or []:
        chunks: list[str] = []
        for el in paragraph or []:
            if not isinstance(el, dict):
                continue
            tag = el.get("tag")
            if tag in ("text", "md"):
                chunks.append(str(el.get("text", "")))
            elif tag == "a":
                label, href = str(el.get("text") or ""), str(el.get("href") or "")
                chunks.append(f"{label} ({href})" if label and label != href else href)
            elif tag == "at":
                chunks.append(str(el.get("user_id") or el.get("user_name") or ""))
            elif tag == "code_block":
                lang = str(el.get("language") or "").lower()
                chunks.append(f"```{lang}\n{el.get('text', '')}\n```")
            elif tag == "img" and el.get("image_key"):
                key = str(el["image_key"])
                attachments.append(
                    Attachment(
                        attachment_id(message_id, "image", key), "image.png", "image/png", kind="image"
                    )
                )
            elif tag == "media" and el.get("file_key"):
                key = str(el["file_key"])
                attachments.append(Attachment(attachment_id(message_id, "file", key), "video.mp4"))
        line = "".join(chunks).strip()
        if line:
            lines.append(line)
    return "\n".join(lines), attachments


def resolve_mentions(text: str, mentions: list[tuple[str, str, str]], bot_open_id: str) -> str:
    """Replace ``@_user_N`` placeholders: the bot's are removed (with one adjacent space), others
    become ``@Name``. Other whitespace is left alone (users paste indented code)."""
    for key, name, open_id in sorted(mentions, key=lambda m: -len(m[0])):  # @_user_10 before @_user_1
        if not key:
            continue
        if open_id == bot_open_id:
            text = re.sub(re.escape(key) + r"(?![0-9])[ \t]?", "", text)
        else:
            text = re.sub(re.escape(key) + r"(?![0-9])", _literal(f"@{name or open_id}"), text)
    return text.strip()


def _dict(value: Any) -> dict[str, Any]:
    """``value`` when the payload has an object there, else an empty one (malformed events)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    """``value`` when the payload has an array there, else an empty one (malformed events)."""
    return value if isinstance(value, list) else []


def _literal(text: str) -> Callable[[re.Match[str]], str]:
    """A re.sub replacement that inserts ``text`` as it is (no backslash or group expansion)."""
    return lambda _m: text
