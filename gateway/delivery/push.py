"""Delivering push notifications (Bark, ntfy) from the journal: retried, bounded, told when refused.

A push is a journal entry like any ``chital send`` notice (kind ``notice``, platform
:data:`PUSH_PLATFORM`, chat = the target's name): written before anything is sent, marked done
only after the server said 2xx, so a daemon killed before or during the send sends it after the
restart. That makes a push **at least once**: a kill -9 after the server accepted it and before the
journal says done sends it again. ntfy then gets the same ``X-Sequence-ID`` and an ntfy 2.16+
client updates the notification instead of showing a second; Bark has no idempotency key, so a
Bark phone may show it twice in that window. Losing an alert was judged worse than a rare double
(docs/push.md, "Once").

Retries: a network error, a dropped connection, 408/425/429 and 5xx are retried with backoff
(1 s doubling to 60 s, or the server's ``Retry-After`` up to 5 minutes) for
``delivery.retry_window``; then, like a permanent refusal (400/401/403/404/413, a redirect), the
entry is marked failed with a specific reason that names the target, never its key, topic, token
or the server's raw answer. The reason is kept on the entry, so ``chital send --wait`` prints it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import httpx

from gateway.config.push import PUSH_ERROR, PUSH_PLATFORM, PUSH_TITLE
from gateway.config.schema import Config
from gateway.delivery import push_wire
from gateway.ops.metrics import Metrics
from gateway.store.entries import JournalEntry, JournalState
from gateway.store.journal import Store

log = logging.getLogger(__name__)

__all__ = ["PUSH_ERROR", "PUSH_PLATFORM", "PUSH_TITLE", "PushSender"]

RETRY_AFTER_CAP = 300.0
"""The longest a server's Retry-After is obeyed at once (a bogus day-long wait is not)."""


class PushSender:
    """Sends journaled pushes. One per gateway; its HTTP client is made on first use."""

    def __init__(
        self,
        config: Config,
        store: Store,
        redact: Callable[[str], str],
        keep: Callable[[JournalEntry], Awaitable[bool]] | None = None,
        metrics: Metrics | None = None,
        *,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
    ) -> None:
        self.config = config
        self.store = store
        self.redact = redact
        self.keep = keep
        self.metrics = metrics
        """Several daemons on one database: still this daemon's entry to send (gateway/daemon/cluster.py)."""
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # No redirects: a server that sends us elsewhere would take the token along.
            self._client = httpx.AsyncClient(follow_redirects=False)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def deliver(self, entry: JournalEntry) -> None:
        """Send ``entry`` until the server takes it, refuses it or the retry window ends."""
        name = entry.inbound.chat_id
        target = self.config.push.get(name)
        if target is None:
            await self._fail(entry, f"push target {name!r} is not in the config (push.{name})")
            return
        title = str(entry.inbound.extra.get(PUSH_TITLE) or target.title)
        request = push_wire.build(target, entry.key, self.redact(title), self.redact(entry.note))
        if request.truncated:
            log.info("push %s to %r: the text was cut to fit %s's limit", entry.key, name, target.kind)
        started, wait, attempts = time.monotonic(), self.backoff, 0
        window = self.config.delivery.retry_window
        while True:
            attempts += 1
            if self.keep is not None and not await self.keep(entry):
                return  # fenced: the daemon holding the lease sends it
            try:
                status, later = await self._post(request, target.timeout)
            except (httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
                # The request itself is wrong (a header httpx refuses): sending again cannot help.
                await self._fail(
                    entry, f"push target {name!r}: the request could not be made ({type(exc).__name__})"
                )
                return
            except (httpx.HTTPError, TimeoutError) as exc:  # refused, reset, dropped, timed out
                why = f"could not reach the {target.kind} server ({type(exc).__name__})"
                pause = wait
            else:
                if 200 <= status < 300:
                    await self.store.journal_set(entry.key, JournalState.DONE)
                    self._count(name, "sent")
                    log.info("push %s sent to %r after %d attempt(s)", entry.key, name, attempts)
                    return
                if status not in push_wire.RETRY_STATUSES:
                    await self._fail(entry, f"push target {name!r}: {push_wire.refusal(target.kind, status)}")
                    return
                why = f"the {target.kind} server answered HTTP {status}"
                pause = push_wire.retry_after(later, wait, RETRY_AFTER_CAP)
            if time.monotonic() - started + pause > window:
                gave_up = f"gave up after {attempts} attempt(s); last: {why}"
                await self._fail(entry, f"push target {name!r}: {gave_up}")
                return
            self._count(name, "retried")
            log.warning("push %s to %r: %s; retrying in %.0f s", entry.key, name, why, pause)
            await asyncio.sleep(pause)
            wait = min(wait * 2, self.max_backoff)

    async def _post(self, request: push_wire.PushRequest, limit: float) -> tuple[int, str | None]:
        """One attempt: (status, Retry-After). The answer's body is never read (a push server has
        nothing to say that we show, and a huge or endless body must cost nothing), and the whole
        attempt, not each read, is bounded by ``limit`` seconds (a server dripping bytes cannot hold it)."""
        async with asyncio.timeout(limit):
            async with self._http().stream(
                "POST",
                request.url,
                headers=request.headers,
                content=request.content if request.json is None else None,
                json=request.json,
                timeout=limit,
            ) as response:
                return response.status_code, response.headers.get("retry-after")

    def _count(self, target: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.pushes.labels(target, outcome).inc()

    async def _fail(self, entry: JournalEntry, reason: str) -> None:
        self._count(entry.inbound.chat_id, "failed")
        reason = self.redact(reason)
        log.error("push %s failed: %s", entry.key, reason)
        await self.store.journal_fail_with(entry.key, PUSH_ERROR, reason)
