"""What a harness turn yields. The gateway maps these to chat output; the terminal prints them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.provenance import Source


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the answer's text as the model produces it."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolProgress:
    """A tool (or sub-agent) started, finished or failed. ``phase``: start | end | error."""

    name: str
    phase: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class StatusUpdate:
    """Free-form progress worth showing (sub-agent running, retrying the model...)."""

    text: str


@dataclass(frozen=True, slots=True)
class PlanItem:
    """One step of the agent's plan (agent/plan.py). ``status``: pending | in_progress | completed.
    ``text`` is the model's words: untrusted, shown only through the gateway's safe rendering."""

    text: str
    status: str


@dataclass(frozen=True, slots=True)
class PlanUpdated:
    """The agent wrote its plan (``write_todos``): the whole list, as it stands now."""

    items: tuple[PlanItem, ...]


@dataclass(frozen=True, slots=True)
class SkillDrafted:
    """The agent drafted a skill (``draft_skill``, agent/skill_tools.py) that now waits for an
    admin: the gateway tells the admins (docs/skills.md). ``name`` is checked (the spec's form);
    the draft itself is read from disk, never carried here."""

    name: str


@dataclass(frozen=True, slots=True)
class Clarification:
    """The agent ends the turn asking the user a question; ``options`` (model text, untrusted)
    are offered as buttons where the platform has them (docs/choices.md)."""

    question: str
    options: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """The turn pauses until a person approves or denies one tool call (agent/approvals.py).

    ``id`` is stable for this pause (a replay of the turn asks with the same id); answer it with
    ``AgentHarness.resume``. ``args`` are the call's arguments with configured secrets and
    credential-looking values already masked. Several gated calls of one model step are several
    events; the turn continues once each is answered."""

    id: str
    tool: str
    args: dict[str, Any]
    description: str = ""
    untrusted: str = ""
    """The untrusted sources the model had read before asking, in words (agent/provenance.py):
    the call may follow an instruction from them. Empty: none."""
    sources: tuple[Source, ...] = ()
    """The same sources, as data: what a standing permission decides on (gateway/turns/grants.py)."""
    standing_ok: bool = True
    """Whether a standing permission may answer it (False: a coding agent's own question, asked
    live and answered once)."""


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """A person's answer to an :class:`ApprovalRequested`: ``approved``, or not with ``reason``
    (denied by someone, timed out) which the model reads as the tool's result."""

    approved: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class FileOut:
    """A file the agent wants delivered to the chat.

    ``path`` is the *virtual* path (``/mnt/user-data/outputs/report.pdf``), never a host path:
    sandboxed code can swap the file for a link at any moment, so whoever sends it opens it at
    delivery time through the agent's symlink-safe reader (``AgentRuntime.read_output``)."""

    path: str
    caption: str = ""


@dataclass(frozen=True, slots=True)
class OutputFile:
    """The bytes of a file read out of a thread's sandbox for delivery."""

    name: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Final:
    """The turn's complete answer text (Markdown). Always the last event of a successful turn.

    ``fresh``: this run started the turn, its message new to the thread, and its whole stream was
    seen here (not a replay of an earlier answer, not the continuation of a stored step or of an
    earlier attempt). Then what the turn left for after its answer came as events: a question
    with options as a :class:`Clarification` (the thread cannot end on an older one: the message
    came after it), a presented file as a ``FileOut``. Without them, nobody needs the reads that
    look for open options and presented files (gateway/turns/runner.py)."""

    text: str
    fresh: bool = field(default=False, compare=False)  # two answers are equal by their text


@dataclass(frozen=True, slots=True)
class TurnFailed:
    """The turn could not complete; ``message`` is safe to show the user (no secrets, no traces).

    ``detail`` is for the operator (the log, the terminal chat): the cause and the model's URL,
    e.g. ``connection refused: http://10.0.0.5:8000/v1/chat/completions``. It may name internal
    hosts, so it never goes to a chat; it never holds a key or the provider's error text. Left out
    of equality: two failures the user sees alike are alike."""

    message: str
    retryable: bool = False
    detail: str = field(default="", compare=False)


AgentEvent = (
    TextDelta
    | ToolProgress
    | StatusUpdate
    | PlanUpdated
    | SkillDrafted
    | Clarification
    | FileOut
    | Final
    | TurnFailed
    | ApprovalRequested
)
