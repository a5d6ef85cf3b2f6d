"""Per-conversation order, a global cap on running turns, /stop, and draining at shutdown.

Each conversation with work has one worker task that runs its journal entries in arrival order; the
workers share one semaphore, so a busy conversation never blocks another beyond the global cap.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from .metrics import Metrics
from .store import JournalEntry

log = logging.getLogger(__name__)

TurnHandler = Callable[[JournalEntry], Coroutine[Any, Any, None]]


@dataclass
class _Conversation:
    queue: collections.deque[JournalEntry] = field(default_factory=collections.deque)
    worker: asyncio.Task[None] | None = None
    running: JournalEntry | None = None
    running_task: asyncio.Task[None] | None = None


class TurnQueue:
    def __init__(self, max_running: int, handler: TurnHandler, metrics: Metrics) -> None:
        self._sem = asyncio.Semaphore(max_running)
        self._handler = handler
        self._metrics = metrics
        self._convs: dict[str, _Conversation] = {}
        self._stopped: set[str] = set()
        self._closing = False

    # -- intake ---------------------------------------------------------------------------------
    def submit(self, entry: JournalEntry) -> int:
        """Queue ``entry``; returns how many turns are ahead of it in its conversation
        (plus one when every global slot is taken), 0 when it starts at once."""
        conv = self._convs.setdefault(entry.conversation, _Conversation())
        ahead = len(conv.queue) + (1 if conv.running else 0)
        if ahead == 0 and self._sem.locked():
            ahead = 1
        conv.queue.append(entry)
        self._metrics.turns_queued.inc()
        if conv.worker is None and not self._closing:
            conv.worker = asyncio.create_task(
                self._work(entry.conversation, conv), name=f"conv:{entry.conversation}"
            )
        return ahead

    def status(self, conversation: str) -> tuple[JournalEntry | None, int]:
        """The running entry and how many wait behind it. The head of a queue with nothing running
        and a free slot does not wait: its worker takes it at the loop's next turn (a burst of
        messages journaled without a yield in between arrives before the worker has run)."""
        conv = self._convs.get(conversation)
        if conv is None:
            return None, 0
        waiting = len(conv.queue)
        if conv.running is None and waiting and not self._sem.locked():
            waiting -= 1
        return conv.running, waiting

    def is_queued(self, key: str) -> bool:
        return any(e.key == key for c in self._convs.values() for e in c.queue)

    @property
    def queued_count(self) -> int:
        return sum(len(c.queue) for c in self._convs.values())

    @property
    def running_count(self) -> int:
        return sum(1 for c in self._convs.values() if c.running is not None)

    def stop(self, conversation: str) -> bool:
        """Cancel the running turn of ``conversation`` (the user's /stop). Queued ones still run."""
        conv = self._convs.get(conversation)
        if conv is None or conv.running_task is None or conv.running_task.done():
            return False
        assert conv.running is not None
        self._stopped.add(conv.running.key)
        conv.running_task.cancel()
        return True

    def was_stopped(self, key: str) -> bool:
        """True when the turn ``key`` was cancelled by /stop (not by shutdown)."""
        return key in self._stopped

    @contextlib.asynccontextmanager
    async def released(self) -> AsyncIterator[None]:
        """Give the running turn's global slot back while it waits on slow work that is not the
        model (transcribing voice notes: gateway/slow_lane.py), and take a slot again after.

        The conversation stays busy (its order, /stop and the queued sign are unchanged); only the
        global cap is freed for other conversations. A no-op outside a turn task of this queue.
        Cancelled while waiting for the slot back (/stop, shutdown), the acquire still completes
        in the background and the worker's release balances it, so the count stays exact."""
        task = asyncio.current_task()
        if task is None or not any(c.running_task is task for c in self._convs.values()):
            yield
            return
        self._sem.release()
        try:
            yield
        finally:
            await asyncio.shield(asyncio.ensure_future(self._sem.acquire()))

    # -- workers --------------------------------------------------------------------------------
    async def _work(self, name: str, conv: _Conversation) -> None:
        try:
            while conv.queue and not self._closing:
                async with self._sem:
                    if self._closing:
                        return
                    entry = conv.queue.popleft()
                    self._metrics.turns_queued.dec()
                    conv.running = entry
                    conv.running_task = asyncio.create_task(self._handler(entry), name=f"turn:{entry.key}")
                    self._metrics.turns_running.inc()
                    try:
                        await asyncio.shield(conv.running_task)
                    except asyncio.CancelledError:
                        # Our own worker was cancelled (shutdown): the turn task is handled by drain().
                        if not conv.running_task.done():
                            raise
                    except Exception:  # the handler reports its own errors; keep the queue moving
                        log.exception("turn %s crashed", entry.key)
                    finally:
                        self._metrics.turns_running.dec()
                        self._stopped.discard(entry.key)
                        conv.running = None
                        conv.running_task = None
        finally:
            conv.worker = None
            if not conv.queue and conv.running is None:
                self._convs.pop(name, None)

    # -- shutdown -------------------------------------------------------------------------------
    async def drain(self, grace: float) -> int:
        """Let running turns finish for ``grace`` seconds, then cancel them. Queued entries stay in
        the journal as pending and run at the next start. Returns how many turns were cut off."""
        self._closing = True
        running = [
            c.running_task for c in self._convs.values() if c.running_task and not c.running_task.done()
        ]
        cut = 0
        if running:
            _, pending = await asyncio.wait(running, timeout=grace)
            cut = len(pending)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        workers = [c.worker for c in self._convs.values() if c.worker]
        for w in workers:
            w.cancel()
        for w in workers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await w
        return cut
