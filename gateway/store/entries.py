"""What the journal holds: an entry's kind and state, the entry itself, and how a message is stored.

Separate from the Store (gateway/store/journal.py) because the table mixins (approvals, schedules)
read journal rows too: they import these from here, and the Store imports them, with no circle.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from channels.base import Attachment, Inbound


class JournalKind(enum.StrEnum):
    """What a journal entry asks of the gateway (stored as its value: the strings never change)."""

    TURN = "turn"
    """A message for the agent."""
    COMMAND = "command"
    """A chat command (gateway/commands/builtin.py)."""
    NOTICE = "notice"
    """A fixed reply: pairing, refusals, notes about what could not be used."""


class JournalState(enum.StrEnum):
    """Where an entry is: ``pending`` → ``running`` → ``done`` or ``failed``; a delivery retry
    puts it back to ``pending``. Stored as its value (older rows read unchanged)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    WAITING = "waiting"
    """The turn paused for a person's approval (gateway/turns/approvals.py resumes it): not resumed at
    start-up like an open entry; the approvals table holds what it waits for."""


OPEN_STATES = (JournalState.PENDING, JournalState.RUNNING)
"""States a restart resumes and retention never prunes."""


BACKGROUND_MARK = "chital_bg"
"""In a background task's ``extra``: the task's number (gateway/turns/background.py)."""


def conversation_of(inbound: Inbound) -> str:
    """The journal's conversation of ``inbound``: its chat's, except for a background task, which
    is a conversation of its own (``<conversation>:bg:<id>``: its own queue, agent thread and
    claim order), while its replies still go to the chat it was asked in."""
    task = inbound.extra.get(BACKGROUND_MARK)
    return f"{inbound.conversation}:bg:{task}" if task is not None else inbound.conversation


MODEL_HINT_SECONDS = 1.0
"""How long a claim's "no ``/model`` choice" stands for the turn it claimed."""


@dataclass(frozen=True, slots=True)
class AtClaim:
    """What a turn's claim saw of its conversation, in the claim's own statement (several daemons,
    gateway/store/leases.py): the turn's start skips each read this says would find nothing. A
    message costs a round trip per statement on PostgreSQL (docs/scale-out.md, "What coordination
    costs"); these were three of them."""

    model_chosen: bool
    """``/model`` chose a model for the chat (gateway/store/usage.py ``chosen_model``)."""
    choice_open: bool
    """A question with options is open in it (gateway/turns/choices.py ``close``)."""
    approvals: bool
    """Approvals of this turn, or pending ones in the conversation (``approvals_at_turn``)."""
    at: float = field(default_factory=time.monotonic, compare=False)
    wall: float = field(default_factory=time.time, compare=False)
    """When the claim was sent, on the wall clock too: a pause of the whole machine (a frozen VM)
    may not move the monotonic one, and leases expire by the wall clock."""

    def within(self, seconds: float) -> bool:
        """The claim was made less than ``seconds`` ago by both clocks."""
        return time.monotonic() - self.at < seconds and time.time() - self.wall < seconds

    def no_model_choice(self) -> bool:
        """No ``/model`` choice to read: none at the claim, made moments ago. A ``/model`` may come
        at any time (a command is no turn, it waits for none), and a turn can start long after
        its claim (a background task waits for a slot, attachments are fetched first): then the
        choice is read, as it was before the claim said anything."""
        return not self.model_chosen and time.monotonic() - self.at < MODEL_HINT_SECONDS


@dataclass(slots=True)
class JournalEntry:
    key: str
    conversation: str
    kind: JournalKind
    inbound: Inbound
    state: JournalState
    attempts: int = 0
    note: str = ""
    """For ``notice`` entries: the text to send."""
    from_journal: bool = False
    """Read back from the journal at start-up (a previous run may have sent part of its reply)."""
    started: bool = False
    """Its claim also marked it running (several daemons: one statement for both; for a turn
    alone in its conversation, the journal insert itself: ``Store.journal_add_turn``); the runner
    then does not mark it again, and its claim makes no statement of its own."""
    at_claim: AtClaim | None = None
    """What that claim saw of the conversation; taken (and cleared) by the runner as it starts."""

    @classmethod
    def new(cls, inbound: Inbound, kind: JournalKind, note: str = "") -> JournalEntry:
        """The entry :meth:`Store.journal_add` just recorded for ``inbound`` (pending)."""
        return cls(inbound.key, conversation_of(inbound), kind, inbound, JournalState.PENDING, note=note)


def inbound_to_json(inbound: Inbound, note: str = "") -> str:
    data = asdict(inbound)
    data["attachments"] = [asdict(a) for a in inbound.attachments]
    if note:
        data["_note"] = note
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def inbound_from_json(raw: str) -> tuple[Inbound, str]:
    data: dict[str, Any] = json.loads(raw)
    note = data.pop("_note", "")
    data["attachments"] = tuple(Attachment(**a) for a in data.get("attachments", ()))
    return Inbound(**data), note
