"""Limits every adapter enforces the same way: how long a platform asked us to wait, and whether a
file fits. One implementation each, so a fix (an HTTP-date Retry-After, a clearer note) reaches
every platform at once."""

from __future__ import annotations

import datetime as dt
import email.utils
import math
from collections.abc import Mapping
from typing import Any

from channels.base import PermanentSendError


def header(headers: Mapping[str, str] | None, name: str) -> str | None:
    """The value of header ``name`` in any letter case (SDKs hand over plain dicts too)."""
    wanted = name.lower()
    return next((v for k, v in (headers or {}).items() if k.lower() == wanted), None)


def retry_after(value: object, *, default: float = 1.0, minimum: float = 0.0) -> float:
    """Seconds to wait before trying again, from any shape a platform or SDK gives it: a number,
    a numeric string (``Retry-After: 2``), an HTTP date, or a ``timedelta`` (python-telegram-bot).
    ``default`` when it is missing or unreadable; never below ``minimum``."""
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        try:
            seconds = float(value)
        except ValueError:
            seconds = _seconds_until(value)
    else:
        return default
    return max(seconds, minimum) if math.isfinite(seconds) else default


def _seconds_until(http_date: str) -> float:
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError):
        return math.nan
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return (when - dt.datetime.now(dt.UTC)).total_seconds()


def oversize(name: str, size: int | None, limit: int, rule: str = "") -> str | None:
    """Why a file of ``size`` bytes is refused under ``limit`` (``rule`` names a platform's own
    cap), or None when it fits or its size is not known yet."""
    if size is None or size <= limit:
        return None
    return f"{name} is {size} bytes, over the {limit}-byte limit" + (f" ({rule})" if rule else "")


def check_size(name: str, size: int | None, limit: int, rule: str = "") -> None:
    """Raise :class:`PermanentSendError` when a file is too large (see :func:`oversize`): before a
    download from the size the platform announced, and again on the bytes that arrived."""
    why = oversize(name, size, limit, rule)
    if why:
        raise PermanentSendError(why)


async def read_capped(resp: Any, cap: int) -> bytes:
    """The whole body of an aiohttp response, or its first ``cap + 1`` bytes when it is longer (the
    caller refuses it). Streamed: ``StreamReader.read(n)`` returns what is buffered, not ``n``
    bytes, so one call cuts a long body short silently (a file of a few MB arrived as ~64 KB)."""
    chunks: list[bytes] = []
    total = 0
    while total <= cap:
        chunk = await resp.content.read(min(64 * 1024, cap + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
