"""One rate limiter per chat that serves sends and edits alike and obeys the platform's retry-after.

The SDKs each have some retry logic, but none paces edits of a message we stream, and each treats
429 differently; one small limiter here keeps the behaviour the same on every platform. It is the
one retry layer of a call: a failure the SDK already retried (``TransientSendError.retried``) is not
retried here again (docs/channels.md has the table of who retries what).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from channels.base import Capabilities, RetryAfter, TransientSendError
from gateway.ops import tracing

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_ATTEMPTS = 5
TRANSIENT_ATTEMPTS = 2
"""A 5xx or network failure gets one quick retry here; after that the gateway parks the reply and
retries it with backoff (core.Gateway._park) without holding this chat's lock all the while."""
MAX_RETRY_AFTER = 120.0


class ChatPacer:
    """Serialises calls into one chat and spaces them by the platform's intervals."""

    def __init__(self, caps: Capabilities, on_rate_limited: Callable[[], None] | None = None) -> None:
        self._caps = caps
        self._lock = asyncio.Lock()
        self._tokens = float(max(1, caps.send_burst))
        self._refilled = time.monotonic()
        self._blocked_until = 0.0
        self._on_rate_limited = on_rate_limited
        self.last_used = time.monotonic()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def call(self, op: Callable[[], Awaitable[T]], *, is_send: bool) -> T:
        if not tracing.active():
            return await self._call(op, is_send)
        with tracing.platform_call(is_send):  # a span per send or edit (gateway/ops/tracing.py)
            return await self._call(op, is_send)

    async def _call(self, op: Callable[[], Awaitable[T]], is_send: bool) -> T:
        async with self._lock:
            self.last_used = time.monotonic()
            transient = 0
            for attempt in range(1, MAX_ATTEMPTS + 1):
                wait = max(self._blocked_until - time.monotonic(), self._send_wait() if is_send else 0.0)
                if wait > 0:
                    await asyncio.sleep(wait)
                try:
                    result = await op()
                except RetryAfter as exc:
                    if self._on_rate_limited:
                        self._on_rate_limited()
                    delay = min(max(exc.seconds, 0.05), MAX_RETRY_AFTER)
                    self._blocked_until = time.monotonic() + delay
                    log.warning("rate limited by the platform; waiting %.1fs (attempt %d)", delay, attempt)
                    tracing.retry("rate limited", delay)
                    if attempt == MAX_ATTEMPTS:
                        raise
                    continue
                except TransientSendError as exc:
                    transient += 1
                    if exc.retried or transient >= TRANSIENT_ATTEMPTS or attempt == MAX_ATTEMPTS:
                        raise
                    if exc.maybe_sent and is_send and not self._caps.dedupes_sends:
                        raise  # repeated, it may post twice: the reply decides (gateway/delivery/reply.py)
                    delay = min(0.5 * 2 ** (attempt - 1), 8.0) * (0.5 + random.random())
                    log.warning("send failed (%s); retrying in %.1fs", exc, delay)
                    tracing.retry(str(exc), delay)
                    await asyncio.sleep(delay)
                    continue
                if is_send and self._caps.min_send_interval > 0:
                    self._refill()
                    self._tokens -= 1
                return result
            raise AssertionError("unreachable")

    def _refill(self) -> None:
        now = time.monotonic()
        rate = 1.0 / self._caps.min_send_interval
        self._tokens = min(float(max(1, self._caps.send_burst)), self._tokens + (now - self._refilled) * rate)
        self._refilled = now

    def _send_wait(self) -> float:
        """Seconds until the send bucket holds a token (0 when sends are not spaced)."""
        if self._caps.min_send_interval <= 0:
            return 0.0
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) * self._caps.min_send_interval


MAX_PACERS = 10_000
"""Pacers held at once (~0.6 KB each). The idle sweep alone bounds them by the chats seen within
``idle_ttl``, which a flood of strangers writing from distinct chats can make any size."""


class PacerPool:
    """Pacers by (channel, chat), dropped when idle so memory stays flat across many chats, and
    never more than ``max_pacers`` of them."""

    def __init__(self, idle_ttl: float = 600.0, max_pacers: int = MAX_PACERS) -> None:
        self._pacers: dict[tuple[str, str], ChatPacer] = {}
        self._idle_ttl = idle_ttl
        self._max = max(1, max_pacers)
        self._last_sweep = time.monotonic()

    def __len__(self) -> int:
        return len(self._pacers)

    def get(
        self, channel: str, chat: str, caps: Capabilities, on_rate_limited: Callable[[], None]
    ) -> ChatPacer:
        key = (channel, chat)
        pacer = self._pacers.get(key)
        if pacer is None:
            if len(self._pacers) >= self._max:
                self._evict()
            pacer = self._pacers[key] = ChatPacer(caps, on_rate_limited)
        self._sweep()
        return pacer

    def _evict(self) -> None:
        """Drop the least recently used idle pacers down to 90% of the cap (one sort per tenth of
        the cap of new chats). A dropped pacer only forgets its chat's send budget and retry-after;
        the platform's next 429 teaches them again. Busy pacers are never dropped."""
        idle = sorted((p.last_used, key) for key, p in self._pacers.items() if not p.busy)
        excess = len(self._pacers) - int(self._max * 0.9) + 1
        for _, key in idle[: max(excess, 0)]:
            del self._pacers[key]

    def _sweep(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < 60:
            return
        self._last_sweep = now
        for key, pacer in list(self._pacers.items()):
            if not pacer.busy and now - pacer.last_used > self._idle_ttl:
                del self._pacers[key]
