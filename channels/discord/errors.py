"""discord.py's and the transport's errors as the channel contract's (channels/base.py).

discord.py already retries short 429s (sleeping retry_after) and 500/502/504/524; what reaches us is
a 429 longer than ``max_ratelimit_timeout`` (RateLimited), or what its retries could not fix (marked
``retried`` so the pacer does not retry it again)."""

from __future__ import annotations

from typing import NoReturn

import aiohttp
import discord

from channels.base import ChannelError, PermanentSendError, RetryAfter, TransientSendError
from channels.limits import header, retry_after

SDK_RETRIED = frozenset({500, 502, 504, 524})
"""Statuses discord.py's HTTPClient.request already retried five times (1, 3, 5, 7 s apart)."""
_CONNECTION_RESET = (54, 10054)  # errnos it retries likewise


def raise_mapped(exc: BaseException, what: str) -> NoReturn:
    """Translate a discord.py / transport error into the channel contract's (module docstring)."""
    if isinstance(exc, ChannelError):
        raise exc
    if isinstance(exc, discord.RateLimited):
        raise RetryAfter(exc.retry_after, f"Discord {what} rate limited") from exc
    if isinstance(exc, discord.HTTPException):
        detail = f"Discord {what} failed: {exc.status} (code {exc.code}) {exc.text}".strip()
        if exc.status == 429:
            seconds = retry_after(header(getattr(exc.response, "headers", None), "Retry-After"))
            raise RetryAfter(seconds, f"Discord {what} rate limited") from exc
        if exc.status >= 500:
            raise TransientSendError(detail, retried=exc.status in SDK_RETRIED) from exc
        raise PermanentSendError(detail) from exc  # 400 (50035 ...), 403 Forbidden, 404 NotFound
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        reset = isinstance(exc, OSError) and exc.errno in _CONNECTION_RESET
        raise TransientSendError(f"Discord {what} failed: {type(exc).__name__}", retried=reset) from exc
    raise exc
