"""A WeCom long-connection frame -> what it means: pure functions, testable without a socket.

Frames (``{"cmd", "headers": {"req_id"}, "body"}``; names checked against WeCom's own SDKs, see
docs/setup/wecom.md):

* ``aibot_msg_callback``: a user's message. ``body.msgid`` is the journal's message id (WeCom calls
  it the callback's unique mark, for de-duplication), the chat id is ``from.userid`` in a 1:1 chat
  (``chattype: single``) and ``chatid`` in a group (``chattype: group``), which is also what a
  proactive ``aibot_send_msg`` takes. ``headers.req_id`` is what a reply must carry: it goes into
  :attr:`Inbound.extra` (journaled with the message) with the time the frame arrived, so a resumed
  turn knows whether the reply window is still open.
* ``aibot_event_callback``: ``enter_chat`` (someone opened the 1:1 chat), ``template_card_event``
  (a card button), ``feedback_event``; other event types are ignored, as new ones appear.
* no ``cmd``: the answer to one of our frames (subscription, ping, reply), matched by ``req_id``.

In a group WeCom delivers only messages that @-mention the robot, so every group message is
``addressed``; the leading ``@name`` is cut before the agent reads the text. A message of a kind
this adapter does not read is answered with a note (``unsupported``); a frame of our kinds without
what WeCom always sends raises ``ValueError``/``TypeError`` and is skipped as unreadable.

Provenance: the connection is the robot's own (WeCom keeps one per robot), so ``aibotid`` is
neither needed nor used for anything; a callback naming a ``chatid`` without saying it is a group is
unreadable rather than taken as the sender's 1:1 chat (a group message answered, and remembered,
as a private one). A message kind this adapter does not know is named in its note only when the
name is a plain identifier (``[x](https://…)`` or ``<@boss>`` is not).
"""

from __future__ import annotations

import re
import time
from typing import Any

from channels import malformed
from channels.base import Attachment, Inbound

PLATFORM = "wecom"
SUBSCRIBE = "aibot_subscribe"
PING = "ping"
RESPOND = "aibot_respond_msg"
RESPOND_WELCOME = "aibot_respond_welcome_msg"
RESPOND_UPDATE = "aibot_respond_update_msg"
SEND = "aibot_send_msg"
MSG_CALLBACK = "aibot_msg_callback"
EVENT_CALLBACK = "aibot_event_callback"

REQ_ID = "req_id"
"""Key in :attr:`Inbound.extra` (and so in the reply target): the callback's ``req_id``."""
AT = "at"
"""Key in :attr:`Inbound.extra`: wall-clock seconds when the callback arrived (the reply window)."""
CHATTYPE = "chattype"

FILE_KINDS = {"image": "image", "file": "", "video": ""}
UNSUPPORTED = {"location": "locations", "link": "links", "emotion": "stickers"}
_MENTION = re.compile(r"\A@\S+\s*")
_KIND = re.compile(r"[a-z][a-z0-9_]{0,39}")
_KEY = re.compile(r"[A-Za-z0-9+/]{1,128}={0,2}")
MAX_URL = 8192
"""Longest media URL taken (WeCom's are a few hundred characters); a longer one is malformed."""


def obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def req_id_of(frame: Any) -> str:
    """The frame's ``headers.req_id`` when usable, else ``""``."""
    rid = obj(obj(frame).get("headers")).get("req_id")
    return rid if malformed.is_id(rid) else ""


def ids_of(body: Any) -> dict[str, Any]:
    """What a (possibly malformed) callback body still names, for
    :meth:`~channels.base.Channel.skip_unreadable`: usable ids only."""
    body = obj(body)
    msgid, sender = body.get("msgid"), obj(body.get("from")).get("userid")
    group = body.get("chattype") == "group"
    chat = body.get("chatid") if group else sender
    return {
        "ref": f"msg {msgid}" if malformed.is_id(msgid) else "msg ?",
        "chat_id": chat if malformed.is_id(chat) else "",
        "message_id": msgid if malformed.is_id(msgid) else "",
        "sender_id": sender if malformed.is_id(sender) else "",
        "is_direct": not group,  # whatever else it says, a chat that is no group is the sender's
        "addressed": True,  # WeCom delivers a group message only when it @-mentions the robot
    }


def check_body(body: Any) -> tuple[str, str, str, bool]:
    """``(msgid, sender, chat id, is_direct)`` of a callback body; ``ValueError``/``TypeError``
    when WeCom's always-present fields are missing or of the wrong type."""
    if not isinstance(body, dict):
        raise TypeError("a callback without an object body")
    msgid, sender = body.get("msgid"), obj(body.get("from")).get("userid")
    if not malformed.is_id(msgid) or not malformed.is_id(sender):
        raise ValueError("a callback without a usable msgid or from.userid")
    chattype = body.get("chattype")
    if chattype == "group":
        chat = body.get("chatid")
        if not malformed.is_id(chat):
            raise ValueError("a group callback without a usable chatid")
        return msgid, sender, chat, False
    if chattype not in ("single", None):
        raise ValueError("a callback of an unknown chattype")
    if chattype is None and body.get("chatid") not in (None, "", sender):
        raise ValueError("a callback naming a chat without saying it is a group")
    return msgid, sender, sender, True


def _text(value: Any, what: str) -> str:
    content = obj(value).get("content")
    if not isinstance(content, str):
        raise TypeError(f"a {what} message without a string content")
    return content


def _attachment(kind: str, value: Any, n: int) -> Attachment:
    """An encrypted file: ``file_id`` is ``"<aeskey> <url>"`` (both needed to read it)."""
    item = obj(value)
    url, key = item.get("url"), item.get("aeskey")
    if not isinstance(url, str) or not url.startswith(("https://", "http://")) or len(url) > MAX_URL:
        raise ValueError(f"a {kind} without a usable url")
    if key is not None and not (isinstance(key, str) and _KEY.fullmatch(key)):
        key = "!"  # present but unusable: refused at download, never handed on undecrypted
    key = key or ""
    name = item.get("filename") or item.get("name")
    suffix = {"image": ".jpg", "video": ".mp4"}.get(kind, "")
    name = name if isinstance(name, str) and name.strip() else f"{kind}-{n}{suffix}"
    size = item.get("size") if isinstance(item.get("size"), int) else None
    return Attachment(file_id=f"{key} {url}", name=name[:255], size=size, kind=FILE_KINDS[kind])


def to_inbound(req_id: str, body: Any, *, now: float | None = None) -> Inbound:
    """The :class:`Inbound` of an ``aibot_msg_callback`` body (see the module docstring)."""
    msgid, sender, chat, direct = check_body(body)
    msgtype = body.get("msgtype")
    if not isinstance(msgtype, str):
        raise TypeError("a callback without a string msgtype")
    text, unsupported = "", ""
    attachments: list[Attachment] = []
    if msgtype == "text":
        text = _text(body.get("text"), "text")
    elif msgtype == "voice":  # WeCom sends a voice message already transcribed
        text = _text(body.get("voice"), "voice")
    elif msgtype in FILE_KINDS:
        attachments.append(_attachment(msgtype, body.get(msgtype), 1))
    elif msgtype == "mixed":
        items = obj(body.get("mixed")).get("msg_item")
        if not isinstance(items, list):
            raise TypeError("a mixed message without a msg_item list")
        parts: list[str] = []
        for item in items[: malformed.MAX_ATTACHMENTS + 1]:
            kind = obj(item).get("msgtype")
            if kind == "text":
                parts.append(_text(obj(item).get("text"), "mixed text"))
            elif kind == "image":
                attachments.append(_attachment("image", obj(item).get("image"), len(attachments) + 1))
        text = "\n".join(parts)
    else:
        unsupported = UNSUPPORTED.get(msgtype, f"{msgtype} messages" if _KIND.fullmatch(msgtype) else "")
        unsupported = unsupported or "messages of this kind"
    if not direct:
        text = _MENTION.sub("", text.lstrip(), count=1)
    at = time.time() if now is None else now
    return Inbound(
        platform=PLATFORM,
        chat_id=chat,
        message_id=msgid,
        sender_id=sender,
        text=text,
        is_direct=direct,
        addressed=True,  # 1:1, or a group message WeCom delivered because it @-mentions the robot
        sender_name=sender,
        attachments=tuple(attachments),
        extra={REQ_ID: req_id, AT: at, CHATTYPE: "single" if direct else "group"},
        unsupported=unsupported,
    )


def event_of(body: Any) -> tuple[str, dict[str, Any]]:
    """``(eventtype, event)`` of an ``aibot_event_callback`` body; ``TypeError`` when unreadable."""
    event = obj(body).get("event")
    etype = obj(event).get("eventtype")
    if not isinstance(etype, str):
        raise TypeError("an event callback without an eventtype")
    return etype, obj(event)
