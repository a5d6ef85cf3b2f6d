"""What a turn holds of its thread's checkpoints before sending them in one round trip.

Kept apart from agent/postgres_saver.py, which decides what is held and when it is sent (its
module docstring says why): these are the records, in the order LangGraph made the calls, and the
turn scope that alone may hold them.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint


@dataclass(slots=True)
class HeldWrites:
    config: RunnableConfig
    task_id: str
    task_path: str
    writes: list[tuple[str, Any]]
    found: tuple[str, Any] | None
    """The thread's kept history when the writes were held."""
    kept: list[tuple[int, str, Any]]
    """The values as the database will return them, serialised when held (``aput_writes``)."""


@dataclass(slots=True)
class HeldPut:
    config: RunnableConfig
    checkpoint: Checkpoint


@dataclass(slots=True)
class Held:
    """What a turn holds of its thread, not sent yet, in the order LangGraph made the calls: its
    input checkpoint and the input's writes (sent with step 0's checkpoint), or the lead model's
    writes (sent with the next step's checkpoint); agent/postgres_saver.py says why."""

    target: str
    """The checkpoint the next held writes go against (the last held one)."""
    items: list[HeldPut | HeldWrites] = field(default_factory=list)
    statements: list[tuple[str, Any, bool]] = field(default_factory=list)

    @property
    def last_put(self) -> HeldPut | None:
        return next((i for i in reversed(self.items) if isinstance(i, HeldPut)), None)

    @property
    def writes(self) -> int:
        return sum(isinstance(i, HeldWrites) for i in self.items)


@dataclass(slots=True)
class HeldScope:
    thread: str
    live: bool = True
    """False once the scope is left: a task of the turn that outlived it (a write cut short by a
    second cancel) holds nothing more, as nothing would send it."""


TURN: ContextVar[HeldScope | None] = ContextVar("chital_held_turn", default=None)
"""The turn running in this context, inside ``KeptPostgresSaver.scoped``: only a turn holds
anything (``chital migrate`` and any other writer of the saver send at once), because only its
scope's end sends what is left."""


def in_turn(thread: str) -> bool:
    """A turn of ``thread`` runs in this context, its scope not left yet: it may hold."""
    scope = TURN.get()
    return scope is not None and scope.live and scope.thread == thread
