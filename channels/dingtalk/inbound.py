"""A robot message frame's data (topic ``/v1.0/im/bot/messages/get``) -> :class:`Inbound`.

The SDK's ``ChatbotMessage.from_dict`` reads the fields; what it does not check (types, ids) is
checked here, so a frame of any shape becomes either a message, a marker of an unreadable one, or
nothing. Ids: ``msgId`` is the message id (stable across redelivery: the journal's key);
``conversationType`` ``"1"`` is a 1:1 chat, ``"2"`` a group. A 1:1 chat's id is the sender's
``senderStaffId`` (the robot's 1:1 send API addresses users by it); a group's is its
``conversationId`` (an ``openConversationId``, always starting ``cid``). A group message is
``addressed`` when the robot is in its ``isInAtList`` (DingTalk delivers a group robot only the
messages that @-mention it, so this is normally every group message).
"""

from __future__ import annotations

from typing import Any

from dingtalk_stream import ChatbotMessage

from channels import malformed
from channels.base import Attachment, Inbound

PLATFORM = "dingtalk"
DIRECT, GROUP = "1", "2"
GROUP_PREFIX = "cid"
"""DingTalk's open conversation ids start with it; a chat id without it is a user's staff id."""
MAX_DATA_BYTES = 1024 * 1024
"""A frame whose data is larger than this is skipped unread (a robot message is a few kB)."""


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def recover_ids(data: Any) -> dict[str, Any]:
    """The ids a malformed frame still has (for the marker the gateway may answer)."""
    d = data if isinstance(data, dict) else {}
    direct = d.get("conversationType") == DIRECT
    staff = _str(d.get("senderStaffId"))
    chat = staff if direct else _str(d.get("conversationId"))
    return {"chat_id": chat, "sender_id": staff or _str(d.get("senderId")),
            "message_id": _str(d.get("msgId")), "is_direct": direct}  # fmt: skip


def to_inbound(data: dict[str, Any]) -> Inbound | None:
    """The message, or None for a frame that is no user message. Raises ``ValueError`` /
    ``TypeError`` / ``KeyError`` for one that cannot be read (the caller skips it)."""
    msg = ChatbotMessage.from_dict(data)
    kind = data.get("conversationType")
    if kind not in (DIRECT, GROUP):
        raise ValueError("unknown conversationType")
    direct = kind == DIRECT
    staff, sender = _str(msg.sender_staff_id), _str(msg.sender_id)
    chat = staff if direct else _str(msg.conversation_id)
    if not malformed.is_id(msg.message_id) or not chat or not (staff or sender):
        raise ValueError("a robot message without msgId, chat or sender")
    text, attachments, unsupported = _content(msg, data)
    return Inbound(
        platform=PLATFORM,
        chat_id=chat,
        message_id=msg.message_id,
        sender_id=staff or sender,
        text=text,
        is_direct=direct,
        addressed=direct or msg.is_in_at_list is True,
        sender_name=_str(msg.sender_nick),
        chat_title="" if direct else _str(msg.conversation_title),
        attachments=attachments,
        unsupported=unsupported,
    )


def _content(msg: ChatbotMessage, data: dict[str, Any]) -> tuple[str, tuple[Attachment, ...], str]:
    """Text, files and what is unsupported, by ``msgtype``."""
    kind = data.get("msgtype")
    if not isinstance(kind, str):
        raise TypeError("msgtype is no string")
    content = data.get("content")
    content = content if isinstance(content, dict) else {}
    if kind == "text":
        body = msg.text.content if msg.text is not None else None
        if not isinstance(body, str):
            raise TypeError("text without content")
        return body.strip(), (), ""
    if kind == "richText":
        parts = content.get("richText")
        if not isinstance(parts, list):
            raise TypeError("richText without parts")
        texts: list[str] = []
        files: list[Attachment] = []
        for part in parts[: malformed.MAX_ATTACHMENTS]:
            if not isinstance(part, dict):
                raise TypeError("a richText part is no object")
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            code = part.get("downloadCode")
            if isinstance(code, str) and code:
                files.append(Attachment(code, f"image{len(files) + 1}.png", "image/png", kind="image"))
        return "".join(texts).strip(), tuple(files), ""
    if kind == "picture":
        code = content.get("downloadCode")
        if not isinstance(code, str) or not code:
            raise TypeError("picture without downloadCode")
        return "", (Attachment(code, "image.png", "image/png", kind="image"),), ""
    if kind == "file":
        code, name = content.get("downloadCode"), content.get("fileName")
        if not isinstance(code, str) or not code:
            raise TypeError("file without downloadCode")
        return "", (Attachment(code, _str(name) or "file", None),), ""
    if kind == "audio":
        said = content.get("recognition")  # DingTalk's own transcript of the voice message
        if isinstance(said, str) and said.strip():
            return said.strip(), (), ""
        return "", (), "voice messages"
    if kind == "video":
        return "", (), "videos"
    return "", (), "messages of this kind"
