"""What this process knows of the threads it ran, so that a turn may skip its state read.

A turn's prepare reads the thread's state to choose between replaying an answer, continuing an
interrupted turn and starting a new one (agent/harness.py). On a thread whose last turn finished
cleanly here, a different message is new, and the read would only say so, unless:

- the message is in the thread already: answered before (a delivery retry, a journal entry run
  again after its done mark failed, its delivery was parked or its lease lapsed), steered into a
  turn of it (agent/steering.py), or the message of a turn that did not finish cleanly: a run of
  it must find that and replay. Kept however the turn ended, for a replayed answer too, and every
  read keeps the newest ids of people's messages it sees (a turn before a restart, or on another
  daemon, may have answered them);
- the thread's history may hold images: they fade after some turns, and a text-only model gets
  none (agent/vision.py), which only the read can apply. A thread is marked when a turn brings
  images and when a read finds them (a turn another daemon ran may have brought them);
- another daemon wrote the thread since (shared checkpoints): the harness asks the saver too
  (agent/postgres_saver.py ``unchanged_since_own``).

All of it is kept per thread, so a thread is forgotten whole (its last turn with its answered ids
and its images mark): forgetting costs a read, never a wrong answer. Bounded: the threads used
longest ago go first (:data:`CAPACITY`, and :data:`IDS` ids in all). Within a thread the
:data:`PER_THREAD` ids first seen most recently are kept; an id already held is never moved, and a
read adds only the :data:`READ_IDS` newest ids it sees, so neither a read nor a turn (at most
ten steered messages, gateway/turns/busy.py) can push out the ids of the last turns. An
older id cannot run again here while it matters: a message runs again only while its journal
entry is open (a failed done mark, a lapsed lease: seconds to a lease's life), and the dozens of
newer turns of its thread it would take do not fit in that time. A turn's bookkeeping lands only
on the entry its turn began with (:meth:`SettledThreads.begin`): a thread forgotten while its turn
ran is not brought back with a last turn but no answered ids. Not thread-safe; the harness calls
it from the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

CAPACITY = 4096
"""Threads remembered."""
IDS = 4 * CAPACITY
"""Answered message ids remembered, all threads together."""
PER_THREAD = 64
"""Answered message ids remembered per thread (see the module docstring)."""
READ_IDS = 16
"""Ids of people's messages a read of the thread adds, the newest (older ones' entries are long
closed)."""


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

    def begin(self, thread_id: str) -> object:
        """A turn of the thread begins: the handle its :meth:`finished` must present."""
        known = self._touch(thread_id)
        self._trim()
        return known

    def finished(self, thread_id: str, message_id: str, steered: Iterable[str], begun: object) -> None:
        """The turn of ``message_id`` (``begun``) finished cleanly here, with ``steered`` taken into
        it. Its last turn is kept only on the entry the turn began with."""
        known = self._threads.get(thread_id)
        if known is not begun or known is None:
            self.answered(thread_id, (message_id, *steered))
            return
        self._threads.move_to_end(thread_id)
        known.last = message_id
        self._answer(known, (message_id, *steered))
        self._trim()

    def forget(self, thread_id: str, message_ids: Iterable[str] = ()) -> None:
        """The thread's last turn did not finish cleanly (paused, failed, stopped): its next turn
        reads it. Its message and what it took in (``message_ids``) count as answered."""
        known = self._threads.get(thread_id)
        if known is not None:
            known.last = None
        self.answered(thread_id, message_ids)

    def answered(self, thread_id: str, message_ids: Iterable[str]) -> None:
        """``message_ids`` are part of the thread (answered, or steered into a turn of it)."""
        ids = [m for m in message_ids if m]
        if ids:
            self._answer(self._touch(thread_id), ids)
            self._trim()

    def seen(self, thread_id: str, message_ids: Sequence[str], images: bool) -> None:
        """What a read of the thread found: the ids of people's messages in it (turns' and steered
        ones), oldest first (the newest :data:`READ_IDS` are kept), and whether it holds images (it
        is marked, whoever brought them; only the new turn's own reckoning unmarks it)."""
        self.answered(thread_id, message_ids[-READ_IDS:])
        if images:
            self.pictured(thread_id, True)

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
        """Add the ids not held yet, in the order first seen (a read repeating old steered ids
        moves nothing); past the bound the first seen go (see the module docstring)."""
        for message_id in message_ids:
            if message_id in known.answered:
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
