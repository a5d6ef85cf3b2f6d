"""What this process knows of the threads it ran, so that a turn may skip its state read.

A turn's prepare reads the thread's state to choose between replaying an answer, continuing an
interrupted turn and starting a new one (agent/harness.py). On a thread whose last turn finished
cleanly here, a different message is new, and the read would only say so, unless:

- the message was answered on the thread before (a delivery retry, a journal entry run again after
  its done mark failed or its lease lapsed), or was steered into a turn of it (agent/steering.py):
  a run of it must find that and replay. Steered ids are kept however the turn that took them
  ended, and every read keeps the steered ids it sees (a turn before a restart, or on another
  daemon, may have taken them);
- the thread's history may hold images: they fade after some turns, and a text-only model gets
  none (agent/vision.py), which only the read can apply. A thread is marked when a turn brings
  images and when a read finds them (a turn another daemon ran may have brought them);
- another daemon wrote the thread since (shared checkpoints): the harness asks the saver too
  (agent/postgres_saver.py ``unchanged_since_own``).

All of it is kept per thread, so a thread is forgotten whole (its last turn with its answered ids
and its images mark): forgetting costs a read, never a wrong answer. Bounded: the threads used
longest ago go first (:data:`CAPACITY`, and :data:`IDS` ids in all); within a thread, the
:data:`PER_THREAD` newest answered ids. An older one cannot run again here while it matters: a
message runs again only while its journal entry is open (seconds to a lease's life), and a
thread's turns run one at a time, so :data:`PER_THREAD` newer turns of the same thread on this
daemon do not fit in that time. Not thread-safe; the harness calls it from the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

CAPACITY = 4096
"""Threads remembered."""
IDS = 4 * CAPACITY
"""Answered message ids remembered, all threads together."""
PER_THREAD = 64
"""Answered message ids remembered per thread (see the module docstring)."""


class _Thread:
    __slots__ = ("answered", "last", "pictured")

    def __init__(self) -> None:
        self.last: str | None = None
        self.answered: OrderedDict[str, None] = OrderedDict()
        self.pictured = False


class SettledThreads:
    """Per thread: its last clean turn here, the message ids answered on it, whether it may hold
    images (see the module docstring)."""

    def __init__(self, capacity: int = CAPACITY, ids: int = IDS, per_thread: int = PER_THREAD) -> None:
        self.capacity, self.ids, self.per_thread = capacity, ids, per_thread
        self._threads: OrderedDict[str, _Thread] = OrderedDict()
        self._held = 0  # answered ids, all threads

    def is_new(self, thread_id: str, message_id: str) -> bool:
        """Whether ``message_id`` is new to the thread as far as this process knows, needing no
        read (the caller still asks whether another daemon wrote the thread since)."""
        known = self._threads.get(thread_id)
        return (
            known is not None
            and known.last is not None
            and known.last != message_id
            and message_id not in known.answered
            and not known.pictured
        )

    def finished(self, thread_id: str, message_id: str, steered: Iterable[str] = ()) -> None:
        """The turn of ``message_id`` finished cleanly here, with ``steered`` taken into it."""
        known = self._touch(thread_id)
        known.last = message_id
        self._answer(known, (message_id, *steered))
        self._trim()

    def forget(self, thread_id: str, steered: Iterable[str] = ()) -> None:
        """The thread's last turn did not finish cleanly (paused, failed, stopped): its next turn
        reads it. What the turn took in (``steered``) stays answered."""
        known = self._threads.get(thread_id)
        if known is not None:
            known.last = None
        self.answered(thread_id, steered)

    def answered(self, thread_id: str, message_ids: Iterable[str]) -> None:
        """``message_ids`` are part of the thread (answered, or steered into a turn of it)."""
        ids = [m for m in message_ids if m]
        if ids:
            self._answer(self._touch(thread_id), ids)
            self._trim()

    def pictured(self, thread_id: str, holds: bool) -> None:
        """Whether the thread's history may hold images (its next turn reads it to fade them)."""
        if holds:
            self._touch(thread_id).pictured = True
            self._trim()
        elif (known := self._threads.get(thread_id)) is not None:
            known.pictured = False

    def _touch(self, thread_id: str) -> _Thread:
        known = self._threads.get(thread_id)
        if known is None:
            known = self._threads[thread_id] = _Thread()
        self._threads.move_to_end(thread_id)
        return known

    def _answer(self, known: _Thread, message_ids: Iterable[str]) -> None:
        for message_id in message_ids:
            if message_id in known.answered:
                known.answered.move_to_end(message_id)
                continue
            known.answered[message_id] = None
            self._held += 1
            if len(known.answered) > self.per_thread:
                known.answered.popitem(last=False)
                self._held -= 1

    def _trim(self) -> None:
        """Forget the threads used longest ago, whole, past either bound (never the newest)."""
        while len(self._threads) > 1 and (len(self._threads) > self.capacity or self._held > self.ids):
            _, gone = self._threads.popitem(last=False)
            self._held -= len(gone.answered)
