"""A webhook delivery -> :class:`Inbound` values: pure functions, testable without Meta.

What a delivery is (Cloud API webhooks, field ``messages``)::

    {"object": "whatsapp_business_account",
     "entry": [{"id": WABA_ID, "changes": [{"field": "messages", "value": {
         "messaging_product": "whatsapp",
         "metadata": {"display_phone_number": ..., "phone_number_id": ...},
         "contacts": [{"profile": {"name": ...}, "wa_id": ...}],
         "messages": [{"from": WA_ID, "id": WAMID, "timestamp": ..., "type": "text",
                       "text": {"body": ...}, "context": {"id": WAMID}}],
         "statuses": [{"id": WAMID, "status": "failed", "errors": [{"code": 131047}]}]}}]}]}

Every conversation is one user's chat with the business number (the Cloud API has no group chats
the bot can read, see docs/setup/whatsapp.md): the chat id and the sender id are the user's
``wa_id``; the message id is the ``wamid``, which Meta keeps on redelivery, so the journal drops a
repeat. Reactions and statuses are not messages (ignored, a failed status is logged); a type the
agent cannot use (stickers, contact cards, orders) gets the unsupported note; a message that lacks
what the format makes required raises ``ValueError``/``TypeError`` for the caller to skip it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from channels import malformed
from channels.base import Attachment, Inbound

PLATFORM = "whatsapp"
SIGNATURE = "X-Hub-Signature-256"
ACTION_PREFIX = "chital:"
"""Reply-button ids the bot made start with this: a press of one is an :class:`Action`."""
MEDIA_TYPES = {"image": "image", "document": "", "audio": "audio", "video": ""}
UNSUPPORTED_TYPES = {
    "sticker": "stickers",
    "contacts": "contact cards",
    "order": "orders",
    "unsupported": "this kind of message",
}
IGNORED_TYPES = frozenset({"reaction", "system", "request_welcome", "ephemeral"})
COMMAND = re.compile(r"/[A-Za-z][\w-]*(?:\s|$)")
"""A command word at the start addresses the bot in a group (``/status``)."""
EXTENSIONS = {"image/jpeg": ".jpg", "image/png": ".png", "image/webp": ".webp", "audio/ogg": ".ogg",
              "audio/mpeg": ".mp3", "video/mp4": ".mp4", "application/pdf": ".pdf"}  # fmt: skip


def signed(app_secret: str, body: bytes, given: str | None) -> bool:
    """``given`` (the ``X-Hub-Signature-256`` header) is ``sha256=`` and the HMAC-SHA256 of the raw
    ``body`` with the app secret; compared in constant time. Hex is case-free."""
    if not given or not app_secret:
        return False
    scheme, _, digits = given.strip().partition("=")
    expected = hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    ok = hmac.compare_digest(digits.lower().encode(errors="replace"), expected.encode())
    return ok and scheme.lower() == "sha256"


@dataclass(frozen=True, slots=True)
class Change:
    """One ``changes[].value`` for our phone number: its messages, statuses and contact names."""

    messages: list[Any]
    statuses: list[Any]
    names: dict[str, str]
    me: str = ""
    """The business number as users see it (``metadata.display_phone_number``, digits): a
    reply quoting one of our messages names it as ``context.from``."""


def changes(payload: Any, phone_number_id: str) -> Iterator[Change | None]:
    """Each ``messages`` change of the delivery; None for one that cannot be read (the caller counts
    it). Changes for another phone number of the same app, and other fields, are left out."""
    if not isinstance(payload, dict) or not isinstance(payload.get("entry"), list):
        yield None
        return
    for entry in payload["entry"]:
        items = entry.get("changes") if isinstance(entry, dict) else None
        if not isinstance(items, list):
            yield None
            continue
        for change in items:
            if not isinstance(change, dict) or not isinstance(change.get("value"), dict):
                yield None
                continue
            if change.get("field") != "messages":
                continue
            value = change["value"]
            meta = value.get("metadata")
            number = meta.get("phone_number_id") if isinstance(meta, dict) else None
            if number != phone_number_id:
                continue
            names: dict[str, str] = {}
            for contact in _listed(value.get("contacts")):
                if isinstance(contact, dict) and isinstance(contact.get("profile"), dict):
                    name, wa_id = contact["profile"].get("name"), contact.get("wa_id")
                    if isinstance(name, str) and isinstance(wa_id, str):
                        names[wa_id] = name
            shown = meta.get("display_phone_number") if isinstance(meta, dict) else None
            me = "".join(ch for ch in shown if ch.isdigit()) if isinstance(shown, str) else ""
            yield Change(_listed(value.get("messages")), _listed(value.get("statuses")), names, me)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def is_wa_id(value: Any) -> bool:
    """A WhatsApp user id: the phone number's digits (``15551234567``)."""
    return isinstance(value, str) and 0 < len(value) <= 32 and value.isdigit()


def check_message(message: Any) -> tuple[str, str, str]:
    """``(type, wamid, from)``; ``ValueError``/``TypeError`` when one is missing or unusable."""
    if not isinstance(message, dict):
        raise TypeError("a message that is not an object")
    mtype, wamid, sender = message.get("type"), message.get("id"), message.get("from")
    if not isinstance(mtype, str) or not mtype:
        raise TypeError("a message without a type")
    if not malformed.is_id(wamid) or not is_wa_id(sender):
        raise ValueError("a message without a usable id or sender")
    return mtype, str(wamid), str(sender)


def recover_ids(message: Any) -> dict[str, Any]:
    """The ids a malformed message still names, for :meth:`Channel.skip_unreadable`."""
    raw = message if isinstance(message, dict) else {}
    wamid, sender, group = raw.get("id"), raw.get("from"), raw.get("group_id")
    ok = malformed.is_id(wamid)
    chat = sender if group is None else group if malformed.is_id(group) and is_group(str(group)) else ""
    return {
        "ref": f"message {wamid}" if ok else "message ?",
        "chat_id": chat if is_wa_id(sender) else "",
        "sender_id": sender if is_wa_id(sender) else "",
        "message_id": wamid if ok else "",
        "is_direct": group is None,
    }


def press(message: dict[str, Any]) -> tuple[str, str] | None:
    """``(button id, title)`` of a reply-button or list-row press on one of the bot's messages."""
    if message.get("type") != "interactive" or not isinstance(message.get("interactive"), dict):
        return None
    inter = message["interactive"]
    reply = inter.get("button_reply") or inter.get("list_reply")
    if not isinstance(reply, dict):
        raise TypeError("an interactive reply without button_reply or list_reply")
    bid, title = reply.get("id"), reply.get("title")
    if not isinstance(bid, str) or not isinstance(title, str):
        raise TypeError("an interactive reply without id and title")
    return bid, title


def is_group(chat_id: str) -> bool:
    """A group id (Groups API: an opaque base64-like string) rather than a user's digits."""
    return not chat_id.isdigit()


def to_inbound(message: dict[str, Any], names: dict[str, str], me: str = "") -> Inbound | None:
    """The :class:`Inbound` of one message, or None when it is not for the agent (a reaction).

    A message with a ``group_id`` (Groups API) is in that group: addressed when it replies to one
    of the business's messages, starts with a command or names the business number (``@1555…``)."""
    mtype, wamid, sender = check_message(message)
    group = message.get("group_id")
    if group is not None and (not malformed.is_id(group) or not is_group(str(group))):
        raise ValueError("a message with an unusable group_id")
    if mtype in IGNORED_TYPES:
        return None
    text, unsupported = "", ""
    attachments: tuple[Attachment, ...] = ()
    if mtype == "text":
        body = message.get("text")
        got = body.get("body") if isinstance(body, dict) else None
        if not isinstance(got, str):
            raise TypeError("a text message without a string body")
        text = got
    elif mtype in MEDIA_TYPES:
        attachments, text = _media(mtype, message.get(mtype))
    elif mtype == "location":
        loc = message.get("location")
        loc = loc if isinstance(loc, dict) else {}
        where = ", ".join(str(loc[k]) for k in ("name", "address", "latitude", "longitude") if k in loc)
        text = f"(shared a location: {where[:500]})"
    elif mtype == "button":  # a template's quick-reply button: its text is what the user said
        button = message.get("button")
        said = button.get("text") if isinstance(button, dict) else None
        if not isinstance(said, str):
            raise TypeError("a button reply without text")
        text = said
    elif mtype == "interactive":
        pressed = press(message)
        text = pressed[1] if pressed else ""
    else:
        unsupported = UNSUPPORTED_TYPES.get(mtype, "this kind of message")
    context = message.get("context")
    extra: dict[str, Any] = {}
    if isinstance(context, dict) and malformed.is_id(context.get("id")):
        extra["replied_to"] = context["id"]
    name = names.get(sender, "")
    direct = group is None
    addressed = direct or (
        (isinstance(context, dict) and bool(me) and context.get("from") == me)
        or COMMAND.match(text.lstrip()) is not None
        or (bool(me) and f"@{me}" in text)
    )
    if not direct and me:
        text = text.replace(f"@{me}", "").strip()
    return Inbound(platform=PLATFORM, chat_id=sender if direct else str(group), message_id=wamid,
                   sender_id=sender, text=text, is_direct=direct, addressed=addressed,
                   sender_name=name if isinstance(name, str) else "", attachments=attachments, extra=extra,
                   unsupported=unsupported)  # fmt: skip


def _media(mtype: str, media: Any) -> tuple[tuple[Attachment, ...], str]:
    if not isinstance(media, dict) or not malformed.is_id(media.get("id")):
        raise TypeError(f"a {mtype} message without a media id")
    mime = media.get("mime_type") if isinstance(media.get("mime_type"), str) else None
    filename = media.get("filename")
    if not isinstance(filename, str) or not filename:
        filename = f"{mtype}{EXTENSIONS.get((mime or '').split(';')[0].strip(), '')}"
    caption = str(media["caption"]) if isinstance(media.get("caption"), str) else ""
    kind = MEDIA_TYPES[mtype]
    if mtype == "audio" and media.get("voice") is True:
        kind = "voice"
    attachment = Attachment(file_id=media["id"], name=filename[:255], mime_type=mime, size=None, kind=kind)
    return (attachment,), caption


def failed_status(status: Any) -> tuple[str, int] | None:
    """``(recipient, first error code)`` of a ``failed`` delivery status (how Meta reports a
    message it accepted but could not deliver, 131047 among them); None for any other status."""
    if not isinstance(status, dict) or status.get("status") != "failed":
        return None
    errors = _listed(status.get("errors"))
    code = errors[0].get("code") if errors and isinstance(errors[0], dict) else None
    recipient = status.get("recipient_id")
    return (str(recipient) if is_wa_id(recipient) else "?"), (code if isinstance(code, int) else 0)
