"""A separate, fair lane for slow per-user work before a turn (transcribing voice notes).

Why: a turn holds one of the global turn slots (``concurrency.max_turns``) while it runs. If
transcription ran inside that slot, eight voice notes sent to a stalled transcriber would hold
eight slots for the transcriber's whole timeout, and another user's one-line question would
queue behind them. So the turn gives its slot back while it waits on such work
(:meth:`gateway.turns.queue.TurnQueue.released`) and queues here instead: at most ``limit`` jobs at
once over all users, and at most ``per_user`` of one user's, so one user's pile of recordings
waits behind itself, not in front of everyone else's (docs/media.md, "Fair transcription").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class FairLane:
    """A global cap and a per-key cap on concurrent jobs. A job waits for its key's turn first,
    then for a global place, so a key with many waiting jobs holds at most ``per_user`` places."""

    def __init__(self, limit: int, per_user: int) -> None:
        self._all = asyncio.Semaphore(limit)
        self._per_user = per_user
        self._users: dict[str, tuple[asyncio.Semaphore, int]] = {}
        """key -> (its semaphore, jobs holding or waiting on it); dropped when that reaches 0."""

    @contextlib.asynccontextmanager
    async def slot(self, user: str) -> AsyncIterator[None]:
        sem, users = self._users.get(user, (asyncio.Semaphore(self._per_user), 0))
        self._users[user] = (sem, users + 1)
        try:
            async with sem, self._all:
                yield
        finally:
            sem, users = self._users[user]
            if users <= 1:
                del self._users[user]
            else:
                self._users[user] = (sem, users - 1)

    @property
    def waiting_users(self) -> int:
        """Users with jobs running or waiting here (for status and tests)."""
        return len(self._users)
