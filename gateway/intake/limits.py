"""Throttles of the intake path, kept in memory: they guard against floods, not against restarts.

Each is a sliding window ("at most N events per W seconds per key"). A restart forgets them, which
only ever errs towards answering: the durable promises (journal, outbox) never depend on these.
"""

from __future__ import annotations

import collections
import time

from gateway.config.durations import about
from gateway.config.schema import Config

PAIRING_REMINDER_EVERY = 60.0
"""A stranger who keeps writing gets their pending code again at most this often (seconds)."""
ANNOUNCEMENTS_PER_HOUR = 20
"""New pairing requests announced to a channel's admins per hour; beyond it they are only logged
(``chital pairing list`` and ``/approve`` alone still show them all)."""
UNREADABLE_NOTES_PER_MINUTE = 3
"""A sender whose messages cannot be read is told so at most this often a minute (docs/channels.md)."""
BAD_CODES = 5
BAD_CODES_WINDOW = 15 * 60.0
"""An admin who sends this many unknown codes in this window must wait: a stolen or scripted
admin account cannot sweep the code space (docs/access.md has the arithmetic)."""


class SlidingWindow:
    """At most ``limit`` events per ``window`` seconds for each key.

    Memory stays bounded under a flood of distinct keys (``max_keys``): the keys seen longest ago
    are forgotten first, which can only let a forgotten sender through early."""

    def __init__(self, limit: int, window: float, max_keys: int = 10_000) -> None:
        self.limit = limit
        self.window = window
        self.max_keys = max_keys
        self._events: dict[str, collections.deque[float]] = {}

    def _recent(self, key: str, now: float) -> collections.deque[float]:
        events = self._events.get(key)
        if events is None:
            return collections.deque()
        while events and events[0] <= now - self.window:
            events.popleft()
        if not events:
            del self._events[key]
        return events

    def wait(self, key: str, now: float | None = None) -> float:
        """Seconds until ``key`` may have another event; 0 when it may now."""
        now = time.monotonic() if now is None else now
        events = self._recent(key, now)
        if len(events) < self.limit:
            return 0.0
        return max(events[0] + self.window - now, 0.001)

    def add(self, key: str, now: float | None = None) -> None:
        """Count one event for ``key`` (whether or not it was within the limit)."""
        now = time.monotonic() if now is None else now
        events = self._events.get(key)
        if events is None:
            if len(self._events) >= self.max_keys:
                for old in list(self._events)[: max(1, self.max_keys // 10)]:
                    del self._events[old]
            events = self._events[key] = collections.deque(maxlen=self.limit)
        events.append(now)

    def hit(self, key: str, now: float | None = None) -> float:
        """Count an event if ``key`` is within its limit and return 0; otherwise count nothing and
        return the seconds to wait (refused events do not push the window further out)."""
        now = time.monotonic() if now is None else now
        wait = self.wait(key, now)
        if not wait:
            self.add(key, now)
        return wait

    def reset(self, key: str) -> None:
        self._events.pop(key, None)


def queue_full_text(waiting: int) -> str:
    what = "1 message" if waiting == 1 else f"{waiting} messages"
    return f"⏳ I already have {what} waiting in this chat; please wait for my answers before sending more."


def rate_limited_text(per_minute: int, wait: float) -> str:
    what = "1 message" if per_minute == 1 else f"{per_minute} messages"
    return (
        f"🐢 You are sending messages faster than I can take them (at most {what} a minute). "
        f"Please wait about {about(wait)}, then send this one again."
    )


class Throttles:
    """The gateway's throttles, one object so the gateway holds one attribute."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.reminders = SlidingWindow(1, PAIRING_REMINDER_EVERY)
        self.announcements = SlidingWindow(ANNOUNCEMENTS_PER_HOUR, 3600.0, max_keys=100)
        self.bad_codes = SlidingWindow(BAD_CODES, BAD_CODES_WINDOW)
        self.unreadable_notes = SlidingWindow(UNREADABLE_NOTES_PER_MINUTE, 60.0)
        per_minute = config.limits.user_messages_per_minute
        self.messages = SlidingWindow(per_minute, 60.0) if per_minute else None

    def refusal(self, user: str, waiting: int, admin: bool) -> str | None:
        """The note refusing a message for the agent, or None to accept it.

        ``waiting``: messages already queued in its conversation. The queue cap applies to
        everyone (it protects the conversation's order and the daemon's memory); the per-user
        rate spares admins, who must be able to work while a flood goes on. A refused message
        does not count towards the rate, so a sender who pauses gets through again."""
        cap = self.config.concurrency.max_queue_per_conversation
        if waiting >= cap:
            return queue_full_text(waiting)
        if self.messages is not None and not admin:
            wait = self.messages.hit(user)
            if wait:
                return rate_limited_text(self.messages.limit, wait)
        return None
