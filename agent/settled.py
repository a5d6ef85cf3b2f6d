"""What this process knows of the threads it ran, so that a turn may skip its state read.

A turn's prepare reads the thread's state to choose between replaying an answer, continuing an
interrupted turn and starting a new one (agent/harness.py). On a thread whose last turn finished
cleanly here, a different message is new, and the read would only say so, unless:

- the message was answered here before (a delivery retry), or was steered into an earlier turn
  here (agent/steering.py): a later run of its own journal entry must find that and replay;
- the thread's history may hold images: they fade after some turns, and a text-only model gets
  none (agent/vision.py), which only the read can apply. A thread is marked when a turn brings
  images and when a read finds them (a turn another daemon ran may have brought them);
- another daemon wrote the thread since (shared checkpoints): the harness asks the saver too
  (agent/postgres_saver.py ``unchanged_since_own``).

All three are remembered here, bounded, the oldest forgotten first: forgetting costs a read, never
a wrong answer. Not thread-safe; the harness calls it from the event loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

V = TypeVar("V")

CAPACITY = 4096
"""Threads remembered per kind (message ids answered: four times as many)."""


def _add(known: dict[str, V], key: str, value: V, cap: int) -> None:
    known.pop(key, None)  # to the end: the newest is forgotten last
    if len(known) >= cap:
        known.pop(next(iter(known)))
    known[key] = value


class SettledThreads:
    """The threads' last clean turns, the message ids answered, the threads that may hold images."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._last: dict[str, str] = {}
        self._answered: dict[str, None] = {}
        self._pictured: dict[str, None] = {}

    def is_new(self, thread_id: str, message_id: str) -> bool:
        """Whether ``message_id`` is new to the thread as far as this process knows, needing no
        read (the caller still asks whether another daemon wrote the thread since)."""
        last = self._last.get(thread_id)
        return (
            last is not None
            and last != message_id
            and message_id not in self._answered
            and thread_id not in self._pictured
        )

    def finished(self, thread_id: str, message_id: str, steered: Iterable[str] = ()) -> None:
        """The turn of ``message_id`` finished cleanly here, with ``steered`` taken into it."""
        _add(self._last, thread_id, message_id, self.capacity)
        self.answered((message_id, *steered))

    def forget(self, thread_id: str) -> None:
        """The thread's last turn did not finish cleanly (paused, failed, stopped): read it next."""
        self._last.pop(thread_id, None)

    def answered(self, message_ids: Iterable[str]) -> None:
        for message_id in message_ids:
            _add(self._answered, message_id, None, 4 * self.capacity)

    def pictured(self, thread_id: str, holds: bool) -> None:
        """Whether the thread's history may hold images (its next turn reads it to fade them)."""
        if holds:
            _add(self._pictured, thread_id, None, self.capacity)
        else:
            self._pictured.pop(thread_id, None)
