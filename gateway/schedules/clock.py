"""The schedules' clock and wake-up call: the one object the parts around schedules share.

The runner sleeps until the next schedule is due; three others must wake it: the agent's scheduler
(a schedule was added), the gateway (an owner confirmed one, by button or ``/schedules confirm``)
and a channel that connects. And the confirmation reads the same clock as the runner (a test
moves it). Made first, before the scheduler, the gateway and the runner, and handed to each at
construction: so neither the gateway nor the runner needs the other to exist first, and nothing
is wired in by assigning attributes afterwards (docs/design.md, "Composition").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class ScheduleClock:
    """``now()`` for every schedule decision; ``poke()`` wakes the runner's sleep."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.now = now
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Look at the schedules again now (one was added or confirmed, a channel connected)."""
        self._wake.set()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less when poked meanwhile (a poke since the last sleep counts)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await self._wake.wait()
        self._wake.clear()
