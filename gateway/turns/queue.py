"""Per-conversation order, a global cap on running turns, /stop, and draining at shutdown.

Each conversation with work has one worker task that runs its journal entries in arrival order; the
workers share one semaphore, so a busy conversation never blocks another beyond the global cap.

/stop (gateway/turns/stopping.py) ends "the current answer": the running turn, or, when none runs yet,
the first one waiting (a message and its /stop fetched in one batch: the turn's task may exist
without having run a single step). A stopped turn whose handler never saw the cancellation, and a
waiting one taken off the queue, are handed to ``on_stopped``: their outcome is delivered there.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.ops import tracing
from gateway.ops.metrics import Metrics
from gateway.ops.tasks import cancel_and_wait
from gateway.store.entries import JournalEntry

log = logging.getLogger(__name__)

TurnHandler = Callable[[JournalEntry], Coroutine[Any, Any, None]]
StoppedHandler = Callable[[JournalEntry], None]


class Stop(enum.Enum):
    """What :meth:`TurnQueue.stop` did with a turn."""

    CANCELLED = "cancelled"
    """It was running: cancelled; its handler (or ``on_stopped``, if it never ran) shows the outcome."""
    REMOVED = "removed"
    """It was waiting: taken off the queue; the caller shows the outcome."""
    LATE = "late"
    """Its answer is being delivered already: left alone."""
    ABSENT = "absent"
    """Not queued or running here."""
    PART = "part"
    """Its answer is out; the optional part still being made after it (the spoken version) was cut."""


@dataclass
class _Conversation:
    queue: collections.deque[JournalEntry] = field(default_factory=collections.deque)
    worker: asyncio.Task[None] | None = None
    running: JournalEntry | None = None
    running_task: asyncio.Task[None] | None = None
    finishing: bool = False
    """The running turn is delivering its answer: /stop no longer cuts it."""
    part: asyncio.Future[Any] | None = None
    """Work of the running turn after its answer is out that /stop may still cut (the spoken
    version being made: gateway/turns/spoken.py)."""


class TurnQueue:
    def __init__(
        self,
        max_running: int,
        handler: TurnHandler,
        metrics: Metrics,
        on_stopped: StoppedHandler | None = None,
    ) -> None:
        self._sem = asyncio.Semaphore(max_running)
        self._handler = handler
        self._on_stopped = on_stopped
        self._metrics = metrics
        self._convs: dict[str, _Conversation] = {}
        self._stopped: dict[str, str | None] = {}
        """Turns cancelled by a user (/stop, or a message interrupting them) and their note."""
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
            with tracing.detached():  # the worker outlives this message: not in its trace
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

    def current(self, conversation: str) -> JournalEntry | None:
        """The turn /stop stops in ``conversation``: the running one, else the first waiting."""
        conv = self._convs.get(conversation)
        if conv is None:
            return None
        if conv.running is not None:
            return conv.running
        return conv.queue[0] if conv.queue else None

    def find(self, key: str) -> JournalEntry | None:
        """The entry ``key`` if it is running or waiting here."""
        for conv in self._convs.values():
            if conv.running is not None and conv.running.key == key:
                return conv.running
            for entry in conv.queue:
                if entry.key == key:
                    return entry
        return None

    def ahead_of(self, key: str) -> tuple[JournalEntry | None, list[JournalEntry]]:
        """The running turn of ``key``'s conversation and the turns waiting before ``key``: whose
        replies must be in the chat before ``key``'s queued sign (gateway/daemon/gateway.py)."""
        for conv in self._convs.values():
            keys = [e.key for e in conv.queue]
            if key in keys:
                task = conv.running_task
                running = conv.running if task is not None and not task.done() else None
                return running, list(conv.queue)[: keys.index(key)]
        return None, []

    def finishing(self, key: str) -> None:
        """The running turn ``key`` starts delivering its answer: from now on /stop leaves it alone,
        so an answer is never cut halfway through its parts nor overwritten by "Stopped"."""
        for conv in self._convs.values():
            if conv.running is not None and conv.running.key == key:
                conv.finishing = True

    @contextlib.contextmanager
    def cuttable(self, key: str, part: asyncio.Future[Any]) -> Iterator[None]:
        """While inside, /stop of the finishing turn ``key`` cancels ``part`` (an optional piece
        made after the answer is out, like its spoken version) instead of answering "too late"."""
        conv = next((c for c in self._convs.values() if c.running is not None and c.running.key == key), None)
        if conv is None:
            yield
            return
        conv.part = part
        try:
            yield
        finally:
            conv.part = None

    def stop(self, key: str, note: str | None = None, *, cut_part: bool = False) -> Stop:
        """Stop the turn ``key`` (the user's /stop): cancel it if it runs, take it off the queue if
        it waits. Turns behind it still run. ``note``: what its reply says instead of "Stopped"
        (a message interrupted it: gateway/turns/busy.py). ``cut_part``: a turn whose answer is
        out has the part still being made after it cut (:meth:`cuttable`; the user's /stop)."""
        for conv in self._convs.values():
            if conv.running is not None and conv.running.key == key:
                task = conv.running_task
                if cut_part and conv.finishing and conv.part is not None and not conv.part.done():
                    conv.part.cancel()
                    return Stop.PART
                if conv.finishing or task is None or task.done():
                    return Stop.LATE
                self._stopped[key] = note
                task.cancel()
                return Stop.CANCELLED
            for entry in conv.queue:
                if entry.key == key:
                    conv.queue.remove(entry)
                    self._metrics.turns_queued.dec()
                    return Stop.REMOVED
        return Stop.ABSENT

    def was_stopped(self, key: str) -> bool:
        """True when the turn ``key`` was cancelled by /stop (not by shutdown)."""
        return key in self._stopped

    def stop_note(self, key: str) -> str | None:
        """The note the stopped turn ``key`` shows instead of "Stopped" (None: /stop's own)."""
        return self._stopped.get(key)

    @contextlib.asynccontextmanager
    async def released(self) -> AsyncIterator[None]:
        """Give the running turn's global slot back while it waits on slow work that is not the
        model (transcribing voice notes: gateway/intake/slow_lane.py), and take a slot again after.

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
                    if self._closing or not conv.queue:  # closing, or /stop took the last one off
                        return
                    entry = conv.queue.popleft()
                    self._metrics.turns_queued.dec()
                    conv.running = entry
                    task = asyncio.create_task(self._handler(entry), name=f"turn:{entry.key}")
                    conv.running_task = task
                    self._metrics.turns_running.inc()
                    try:
                        await asyncio.shield(task)
                    except asyncio.CancelledError:
                        # Our own worker was cancelled (shutdown): the turn task is handled by drain().
                        if not task.done():
                            raise
                    except Exception:  # the handler reports its own errors; keep the queue moving
                        log.exception("turn %s crashed", entry.key)
                    finally:
                        self._metrics.turns_running.dec()
                        if entry.key in self._stopped and task.cancelled():
                            # Cancelled before its handler could say so (it had not started yet):
                            # the stop's outcome is shown from here.
                            self._stopped_outside(entry)
                        self._stopped.pop(entry.key, None)
                        conv.running = None
                        conv.running_task = None
                        conv.finishing = False
        finally:
            conv.worker = None
            if not conv.queue and conv.running is None:
                self._convs.pop(name, None)

    def _stopped_outside(self, entry: JournalEntry) -> None:
        if self._on_stopped is None:
            return
        try:
            self._on_stopped(entry)
        except Exception:
            log.exception("could not show that %s was stopped", entry.key)

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
            await cancel_and_wait(pending)
        await cancel_and_wait([c.worker for c in self._convs.values() if c.worker])
        return cut
