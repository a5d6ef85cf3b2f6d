"""Slack event → :class:`Inbound`: a pure function, testable without a socket.

Kept apart from :mod:`channels.slack.channel` (the connection and the Web API) so that what a user's post
means can be read in one place. An event that is a person's post but lacks what every post has
(user, channel, ts as strings) raises ``ValueError``: the adapter skips it as unreadable instead of
dropping it silently. What is not text becomes text where it can (a shared or forwarded message's
text) or a file (``file_share``); files Slack will not let the bot download get a plain note.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from channels.base import FORWARDED, Action, Attachment, ContextItem, Inbound

PLATFORM = "slack"
ACCEPTED_SUBTYPES = frozenset({None, "file_share", "thread_broadcast", "me_message"})
"""Message subtypes that are a person saying something; edits, deletions, joins, bot posts are not."""

_LINK = re.compile(r"<([^<>|]+)(?:\|([^<>]*))?>")


def to_inbound(event: dict[str, Any], bot_user_id: str | None) -> Inbound | None:
    """An ``app_mention`` or ``message`` event as an :class:`Inbound`, or None when it is not a
    person's post (bots, edits, joins). Raises ``ValueError``/``TypeError`` for a post that is
    malformed."""
    etype = event.get("type")
    if not isinstance(event.get("subtype"), str | None):
        raise TypeError("subtype is not a string")
    if etype not in ("message", "app_mention") or event.get("subtype") not in ACCEPTED_SUBTYPES:
        return None
    user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
    if event.get("bot_id") or (user is not None and user == bot_user_id):
        return None  # our own posts come back as events; other bots could loop with us
    if not (isinstance(user, str) and isinstance(channel, str) and isinstance(ts, str)) or not (
        user and channel and ts
    ):
        raise ValueError("a post without a user, channel or ts")
    raw = event.get("text") or ""
    if not isinstance(raw, str):
        raise TypeError("text is not a string")
    is_direct = event.get("channel_type") == "im"
    mention = re.compile(rf"<@{re.escape(bot_user_id or '-')}(?:\|[^>]*)?> ?")
    addressed = is_direct or etype == "app_mention" or bool(mention.search(raw))
    thread_ts = event.get("thread_ts")
    if thread_ts is not None and not isinstance(thread_ts, str):
        raise TypeError("thread_ts is not a string")
    # A channel post starts a thread: the reply goes there and the thread is one conversation.
    thread_id = thread_ts if is_direct else (thread_ts or ts)
    profile = event.get("user_profile") or {}
    files = event.get("files") or []
    if not isinstance(files, list) or not all(isinstance(f, dict) for f in files):
        raise TypeError("files is not a list of objects")
    attachments = tuple(
        Attachment(
            file_id=f.get("url_private_download") or f.get("url_private"),
            name=str(f.get("name") or f.get("title") or f.get("id", "file")),
            mime_type=f.get("mimetype"),
            size=f.get("size") if isinstance(f.get("size"), int) else None,
            # A clip recorded in Slack (the microphone button) is a voice note.
            kind="voice" if f.get("subtype") == "slack_audio" else "",
        )
        for f in files
        if f.get("url_private_download") or f.get("url_private")
    )
    text = plain_text(mention.sub("", raw))
    shared = _shared_text(event.get("attachments"))
    if shared:
        text = f"{text}\n\n{shared}" if text else shared
    unsupported = ""
    if not text and not attachments and files:
        unsupported = "files shared this way"  # Slack Connect / hidden by plan: no download URL
    return Inbound(
        platform=PLATFORM,
        chat_id=channel,
        message_id=ts,
        sender_id=user,
        text=text,
        is_direct=is_direct,
        addressed=addressed,
        thread_id=thread_id,
        sender_name=profile.get("display_name") or profile.get("real_name") or profile.get("name") or "",
        attachments=attachments,
        extra={
            "thread_ts": thread_id,
            **({FORWARDED: _shared_author(event.get("attachments"))} if shared else {}),
        },
        unsupported=unsupported,
    )


def context_item(msg: dict[str, Any], bot_user_id: str | None, bot_id: str | None) -> ContextItem | None:
    """A message of ``conversations.replies`` as thread context, or None for what is not someone
    saying something (joins, edits ...). Without the ``users:read`` scope names are known only
    when Slack sends the poster's profile along; otherwise the author is ``<@U…>``, which the
    agent can use to mention them."""
    if not isinstance(msg, dict) or msg.get("subtype") not in ACCEPTED_SUBTYPES | {"bot_message"}:
        return None
    user, ts, raw = msg.get("user"), msg.get("ts"), msg.get("text") or ""
    if not isinstance(ts, str) or not isinstance(raw, str):
        return None
    is_self = user is not None and user == bot_user_id
    is_self = is_self or (bot_id is not None and msg.get("bot_id") == bot_id)
    is_bot = bool(msg.get("bot_id")) or msg.get("subtype") == "bot_message"
    profile, bot_profile = _dict(msg.get("user_profile")), _dict(msg.get("bot_profile"))
    name = profile.get("display_name") or profile.get("real_name") or bot_profile.get("name")
    name = name or msg.get("username") or (f"<@{user}>" if isinstance(user, str) else "someone")
    text = plain_text(raw)
    shared = _shared_text(msg.get("attachments"))
    files = msg["files"] if isinstance(msg.get("files"), list) else []
    names = ", ".join(str(f.get("name") or "file") for f in files if isinstance(f, dict))
    extras = [t for t in (shared, f"(shared files: {names})" if names else "") if t]
    text = "\n\n".join([text, *extras] if text else extras)
    return ContextItem(str(name), text or "(a message without text)", ts, is_self, is_bot)


def to_action(body: dict[str, Any]) -> Action | None:
    """The :class:`Action` of a ``block_actions`` payload (a press of one of our Block Kit
    buttons), or None when it lacks the user, channel, message or value."""
    user, channel = _dict(body.get("user")), _dict(body.get("channel"))
    container, message = _dict(body.get("container")), _dict(body.get("message"))
    actions = body.get("actions")
    first = _dict(actions[0]) if isinstance(actions, list) and actions else {}
    user_id, value = user.get("id"), first.get("value")
    channel_id = channel.get("id") or container.get("channel_id")
    ts = container.get("message_ts") or message.get("ts")
    if not all(isinstance(v, str) and v for v in (user_id, value, channel_id, ts)):
        return None
    name = user.get("name") or user.get("username") or user_id
    thread = message.get("thread_ts")
    return Action(
        platform=PLATFORM,
        chat_id=str(channel_id),
        sender_id=str(user_id),
        value=str(value),
        message_id=str(ts),
        sender_name=str(name),
        thread_id=thread if isinstance(thread, str) and thread != ts else None,
    )


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _shared_text(attachments: Any) -> str:
    """The text of a message shared or forwarded into this one (legacy ``attachments``)."""
    if not isinstance(attachments, list):
        return ""
    lines: list[str] = []
    for att in attachments:
        if not isinstance(att, dict) or not (att.get("is_share") or att.get("is_msg_unfurl")):
            continue
        body = att.get("text") or att.get("fallback") or ""
        if isinstance(body, str) and body.strip():
            who = att.get("author_name") or att.get("author_subname") or "someone"
            lines.append(f"(shared message from {who}) {plain_text(body)}")
    return "\n".join(lines)


def _shared_author(attachments: Any) -> str:
    """Who wrote the first message shared into this one ("" when Slack does not say)."""
    for att in attachments if isinstance(attachments, list) else ():
        if isinstance(att, dict) and (att.get("is_share") or att.get("is_msg_unfurl")):
            return str(att.get("author_name") or att.get("author_subname") or "")
    return ""


def recover_ids(ref: str, event: Any, bot_user_id: str | None) -> dict[str, Any]:
    """What :meth:`Channel.skip_unreadable` needs, read defensively from an event that did not
    parse (any field may be missing or of the wrong type)."""
    out: dict[str, Any] = {"ref": ref}
    if not isinstance(event, dict) or event.get("bot_id"):
        return out
    user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
    if not isinstance(channel, str) or not channel:
        return out
    is_direct = event.get("channel_type") == "im" or channel.startswith("D")
    text = json.dumps(event.get("text"), ensure_ascii=False)
    thread = event.get("thread_ts") if isinstance(event.get("thread_ts"), str) else None
    ts_ok = isinstance(ts, str) and bool(ts)
    out.update(
        chat_id=channel,
        sender_id=user if isinstance(user, str) and user != bot_user_id else "",
        message_id=ts if ts_ok else "",
        is_direct=is_direct,
        addressed=is_direct or event.get("type") == "app_mention" or f"<@{bot_user_id}" in text,
        thread_id=thread if is_direct else (thread or (ts if ts_ok else None)),
    )
    if out["thread_id"]:
        out["extra"] = {"thread_ts": out["thread_id"]}
    return out


def plain_text(text: str) -> str:
    """Slack's markup in a user's text made readable: links, channel refs and specials decoded;
    user mentions (``<@U…>``) kept so the agent can mention people back."""

    def link(m: re.Match[str]) -> str:
        target, label = m.group(1), m.group(2)
        if target.startswith("@"):
            return m.group(0)
        if target.startswith("#"):
            return "#" + (label or target[1:])
        if target.startswith("!"):
            return label if label and label.startswith("@") else "@" + (label or target[1:].split("^")[0])
        return f"{label} ({target})" if label and label != target else target

    return html.unescape(_LINK.sub(link, text)).strip()
