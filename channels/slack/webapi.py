"""Slack Web API reads and failures, as free functions over slack_sdk's client: the one wrapper every
call goes through (:func:`call`), a reply found again by its metadata key, a thread's earlier
messages, and a file's bytes.

Kept apart from :mod:`channels.slack.channel`, which holds the connection (Socket Mode, bolt's
listeners) and the Channel contract, so that what a Web API answer means (which error is fatal,
which is worth a retry, which host may see the bot token) reads in one place. Nothing here holds
state: the channel passes its client, its pooled session and its token.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Sequence
from typing import TypeVar
from urllib.parse import urlsplit

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.web.async_client import AsyncWebClient

from channels.base import (
    ChannelError,
    ContextItem,
    FatalChannelError,
    Inbound,
    PermanentSendError,
    RetryAfter,
    TransientSendError,
)
from channels.limits import check_size, header, retry_after

from .inbound import context_item

T = TypeVar("T")

CONTEXT_PAGES = 3
"""conversations.replies pages read for one message's thread context (200 messages each)."""
REPLY_EVENT = "chital_reply"
"""Metadata event type of the bot's replies; the payload's ``key`` is the part's idempotency key."""

AUTH_ERRORS = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "not_allowed_token_type",
    }
)
TRANSIENT_ERRORS = frozenset({"internal_error", "fatal_error", "service_unavailable", "request_timeout"})
SDK_RETRIED = (aiohttp.ServerConnectionError, aiohttp.ClientOSError)
"""Failures slack_sdk's default AsyncConnectionErrorRetryHandler already retried once (a pooled
connection the server dropped); the pacer does not retry them again (docs/channels.md)."""


async def call(pending: Awaitable[T], what: str) -> T:
    """Await one SDK call and map its failures onto the channel errors delivery acts on."""
    try:
        return await pending
    except SlackApiError as exc:
        raise map_api_error(exc, what) from None
    except SlackRequestError as exc:
        # files_upload_v2 raises this when the upload step (not a Web API method) fails.
        raise TransientSendError(f"slack {what}: upload failed") from exc
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        raise TransientSendError(
            f"slack {what}: network error ({type(exc).__name__})", retried=isinstance(exc, SDK_RETRIED)
        ) from None


def map_api_error(exc: SlackApiError, what: str) -> ChannelError:
    """SlackApiError → RetryAfter / Fatal / Transient / Permanent. Never carries the token."""
    resp = exc.response
    status = getattr(resp, "status_code", None) or getattr(resp, "status", None) or 0
    data = getattr(resp, "data", None)
    error = data.get("error") if isinstance(data, dict) else None
    headers = getattr(resp, "headers", None) or {}
    if status == 429 or error == "ratelimited":
        return RetryAfter(retry_after(header(headers, "Retry-After")), f"slack {what} rate limited")
    if error in AUTH_ERRORS:
        return FatalChannelError(f"slack rejected the token ({error}); update it in the config")
    if status >= 500 or error in TRANSIENT_ERRORS:
        return TransientSendError(f"slack {what}: {error or 'HTTP ' + str(status)}")
    needed = f" (needs scope {data.get('needed')})" if isinstance(data, dict) and data.get("needed") else ""
    return PermanentSendError(f"slack {what}: {error or 'HTTP ' + str(status)}{needed}")


async def find_reply(
    client: AsyncWebClient, channel: str, thread_ts: str | None, since: str | None, key: str
) -> str | None:
    """The ts of the bot's recent message whose metadata carries ``key``, if any: read from the
    thread (conversations.replies) or the channel (conversations.history)."""
    if thread_ts:
        pending = client.conversations_replies(
            channel=channel, ts=thread_ts, limit=200, include_all_metadata=True
        )
        resp = await call(pending, "conversations.replies")
    else:
        pending = client.conversations_history(
            channel=channel, oldest=since or None, limit=200, include_all_metadata=True
        )
        resp = await call(pending, "conversations.history")
    for msg in resp.get("messages") or []:
        meta = msg.get("metadata") or {}
        payload = meta.get("event_payload") or {}
        if meta.get("event_type") == REPLY_EVENT and payload.get("key") == key:
            return str(msg.get("ts"))
    return None


async def thread_context(
    client: AsyncWebClient, inbound: Inbound, limit: int, bot_user_id: str | None, bot_id: str | None
) -> Sequence[ContextItem]:
    """The thread's parent and its newest replies before ``inbound`` (conversations.replies,
    oldest first, at most :data:`CONTEXT_PAGES` pages); nothing outside a thread."""
    thread_ts = inbound.extra.get("thread_ts")
    if not isinstance(thread_ts, str) or thread_ts == inbound.message_id or limit <= 0:
        return ()
    parent: ContextItem | None = None
    recent: collections.deque[ContextItem] = collections.deque(maxlen=limit)
    cursor: str | None = None
    for _ in range(CONTEXT_PAGES):
        pending = client.conversations_replies(
            channel=inbound.chat_id, ts=thread_ts, latest=inbound.message_id, inclusive=False,
            limit=200, cursor=cursor,
        )  # fmt: skip
        resp = await call(pending, "conversations.replies")
        for msg in resp.get("messages") or []:
            item = context_item(msg, bot_user_id, bot_id)
            if item is None or not before(item.message_id, inbound.message_id):
                continue
            if item.message_id == thread_ts:
                parent = item
            else:
                recent.append(item)
        cursor = (resp.get("response_metadata") or {}).get("next_cursor") or None
        if not resp.get("has_more") or not cursor:
            break
    replies = list(recent)
    if parent is None:
        return replies
    return [parent, *replies[len(replies) - limit + 1 :]] if limit > 1 else [parent]


def before(ts: str, current: str) -> bool:
    """Slack timestamps compare as decimals ("1712.000200" < "1712.001")."""
    try:
        return float(ts) < float(current)
    except ValueError:
        return False


async def download(
    session: aiohttp.ClientSession,
    url: str,
    *,
    token: str,
    api_base_url: str,
    proxy: str | None,
    name: str,
    limit: int,
) -> bytes:
    """A file's bytes, fetched with the bot token from a host that may see it (:func:`trusted`),
    refused once it grows past ``limit``."""
    if not trusted(url, api_base_url):
        raise PermanentSendError(f"refusing to send the bot token to {urlsplit(url).hostname}")
    try:
        async with session.get(url, headers={"Authorization": f"Bearer {token}"}, proxy=proxy) as resp:
            if resp.status == 429 or resp.status >= 500:
                raise TransientSendError(f"slack file download: HTTP {resp.status}")
            if resp.status != 200:
                raise PermanentSendError(f"slack file download: HTTP {resp.status}")
            if resp.content_type == "text/html":  # Slack's login page: token lacks files:read
                raise PermanentSendError("slack file download answered a login page (files:read scope?)")
            data = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                data += chunk
                check_size(name, len(data), limit)
            return bytes(data)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise TransientSendError(f"slack file download failed ({type(exc).__name__})") from None


def trusted(url: str, api_base_url: str) -> bool:
    """The bot token goes only to the API's own host or Slack's file hosts."""
    host = (urlsplit(url).hostname or "").lower()
    api_host = (urlsplit(api_base_url).hostname or "").lower()
    return bool(host) and (
        host == api_host or host.endswith((".slack.com", ".slack-gov.com")) or host in ("slack.com",)
    )
