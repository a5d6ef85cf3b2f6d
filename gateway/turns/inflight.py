"""What this process handles right now: the journal keys queued, running or sending, and their
live replies.

One registry instead of a set and a dict on the Gateway that the turn runner, approvals, /stop and
the queued sign each reached into. A key is taken once (a second dispatch of the same entry is a
no-op) and released when its handler is done; :meth:`InFlight.released` lets approvals wait for a
paused run to leave without polling. The live reply of a key is shared: the queued sign posts into
the very message the turn later edits into its answer (gateway/turns/queued_sign.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.delivery.reply import Reply
    from gateway.store.entries import JournalEntry


class InFlight:
    """Keys handled by this process and their live replies."""

    def __init__(self, new_reply: Callable[[JournalEntry], Reply]) -> None:
        self._new_reply = new_reply
        self._keys: set[str] = set()
        self._replies: dict[str, Reply] = {}
        self._waiters: dict[str, asyncio.Event] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def take(self, key: str) -> bool:
        """Start handling ``key``; False when this process already is."""
        if key in self._keys:
            return False
        self._keys.add(key)
        return True

    def release(self, key: str) -> None:
        """``key``'s handler is done here: whoever waits in :meth:`released` goes on."""
        self._keys.discard(key)
        waiter = self._waiters.pop(key, None)
        if waiter is not None:
            waiter.set()

    async def released(self, key: str) -> None:
        """Return once ``key`` is not handled here (at once when it is not)."""
        if key not in self._keys:
            return
        waiter = self._waiters.setdefault(key, asyncio.Event())
        await waiter.wait()

    def reply(self, entry: JournalEntry) -> Reply:
        """``entry``'s live reply, made on first use."""
        reply = self._replies.get(entry.key)
        if reply is None:
            reply = self._replies[entry.key] = self._new_reply(entry)
        return reply

    def live(self, key: str) -> Reply | None:
        """``key``'s reply if one was made and not yet dropped."""
        return self._replies.get(key)

    def drop_reply(self, key: str) -> None:
        self._replies.pop(key, None)
