"""What a harness turn yields. The gateway maps these to chat output; the terminal prints them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
class Clarification:
    """The agent ends the turn asking the user a question."""

    question: str


@dataclass(frozen=True, slots=True)
class FileOut:
    """A file the agent wants delivered to the chat (a host path inside the thread's outputs)."""

    path: Path
    caption: str = ""


@dataclass(frozen=True, slots=True)
class Final:
    """The turn's complete answer text (Markdown). Always the last event of a successful turn."""

    text: str


@dataclass(frozen=True, slots=True)
class TurnFailed:
    """The turn could not complete; ``message`` is safe to show the user (no secrets, no traces)."""

    message: str
    retryable: bool = False


AgentEvent = TextDelta | ToolProgress | StatusUpdate | Clarification | FileOut | Final | TurnFailed
