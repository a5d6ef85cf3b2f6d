"""What one turn may carry besides the user's text: the typed extras of the agent seam.

The gateway builds a :class:`TurnOptions` per message (images the user sent, the thread it was
sent in, the conversation's chosen model and persona, a skill asked for by name) and passes it to
``AgentHarness.run``. Everything has a default, so a plain text turn passes nothing. The agent
knows no chat platform: these are plain values, not platform objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # agent.provenance imports langchain-core: not at config-loading time (the CLI)
    from agent.provenance import Source
    from agent.steering import Inbox


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image to show a vision-capable model as part of the user's message (already within the
    configured size limits); ``path`` is where the same file sits in the sandbox, if it was saved."""

    mime: str
    data: bytes
    name: str = ""
    path: str = ""


@dataclass(frozen=True, slots=True)
class ContextMessage:
    """An earlier message of the thread the user wrote in (or the message they replied to), given to
    the agent as context, never as a request of its own."""

    author: str
    text: str
    is_bot: bool = False
    """Written by this bot (shown as the assistant's own earlier answer)."""
    other_bot: bool = False
    """Written by another bot or an integration (shown ``Name (bot)``; the name is checked for
    look-alikes before the suffix is added, agent/untrusted.py)."""


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """Per-turn extras; the defaults are a plain text turn on the configured model."""

    images: tuple[ImagePart, ...] = ()
    context: tuple[ContextMessage, ...] = ()
    model: str | None = None
    """A name from ``models:`` in the config, chosen for this conversation (``/model``)."""
    system_prompt: str | None = None
    """The conversation's persona: replaces ``agent.system_prompt`` for this turn (the workspace,
    tool, skill and memory sections stay; agent/turn_overrides.py)."""
    skill: str | None = None
    """A skill the user activated by name (``/<skill> text``) for this turn."""
    provenance: tuple[Source, ...] = ()
    """Untrusted sources the turn's input carries besides its thread context: a firing of a
    schedule made in a conversation that had read untrusted content (agent/provenance.py)."""
    inbox: Inbox | None = None
    """Messages the user sends while the turn runs, given to it at its next model call (busy mode
    ``steer``, agent/steering.py); None: the turn takes none."""


PLAIN = TurnOptions()
