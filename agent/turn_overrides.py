"""A conversation's own model, persona and on-demand skill, applied to each model call of a turn.

LangChain v1's dynamic model and prompt: a ``wrap_model_call`` middleware swaps ``request.model``
and edits ``request.system_message`` per call, so one compiled graph (and one checkpointer)
serves every model. The thread's history is the same whichever model answers: switching models is
choosing who reads it next, not starting over.

Why a context variable carries the choice: the harness sets it around the turn's graph run, and
every task LangGraph starts for that run (the model node, tools, a sub-agent's own graph inside the
``task`` tool) inherits it. The sandbox binding of a turn travels the same way
(``agent.sandbox.routing``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain.agents.middleware import ModelRequest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import SystemMessage

from agent.rewrite import RequestRewriter


@dataclass(frozen=True, slots=True)
class TurnChoice:
    """What one turn changes about the model calls it makes."""

    model: BaseChatModel | None = None
    """Answers instead of the configured model (lead and sub-agents)."""
    persona: str | None = None
    """Replaces the configured ``agent.system_prompt`` (the lead only; tool sections stay)."""
    skill: str | None = None
    """Instructions of a skill the user asked for by name, added to the lead's system prompt."""


T = TypeVar("T")

_CURRENT: contextvars.ContextVar[TurnChoice | None] = contextvars.ContextVar("chital_turn", default=None)


@contextlib.contextmanager
def scoped(var: contextvars.ContextVar[T], value: T) -> Iterator[None]:
    """Set ``var`` to ``value`` for the calls made inside (and the tasks they start): how a turn's
    own settings (its model choice, its steering inbox) reach the middleware of its model calls."""
    token = var.set(value)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # closed from another context (a collected generator)
            var.reset(token)


def choose(choice: TurnChoice | None) -> contextlib.AbstractContextManager[None]:
    """Make ``choice`` the current turn's for the calls made inside (and the tasks they start)."""
    return scoped(_CURRENT, choice)


def current() -> TurnChoice | None:
    return _CURRENT.get()


def _text(message: SystemMessage | None) -> str:
    return message.text if message is not None else ""


class TurnOverrides(RequestRewriter):
    """Apply the current :class:`TurnChoice` to a model request. Outermost in the stack, so the
    persona replaces the configured prompt before other middleware appends its sections.

    ``base_prompt``: the configured ``agent.system_prompt`` a persona replaces (when the system
    message starts with it; otherwise the persona goes first). ``lead=False`` (sub-agents): only
    the model is swapped; their own prompts stay.
    """

    def __init__(self, base_prompt: str = "", *, lead: bool = True) -> None:
        super().__init__()
        self.base_prompt = base_prompt
        self.lead = lead

    def apply(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        choice = _CURRENT.get()
        if choice is None:
            return request
        update: dict[str, Any] = {}
        if choice.model is not None:
            update["model"] = choice.model
        if self.lead and (choice.persona or choice.skill):
            text = _text(request.system_message)
            if choice.persona:
                if self.base_prompt and text.startswith(self.base_prompt):
                    text = choice.persona + text[len(self.base_prompt) :]
                else:
                    text = f"{choice.persona}\n\n{text}" if text else choice.persona
            if choice.skill:
                text = f"{text}\n\n{choice.skill}" if text else choice.skill
            update["system_message"] = SystemMessage(text)
        return request.override(**update) if update else request


def skill_section(name: str, instructions: str) -> str:
    """The lead's system-prompt section for a skill the user activated with ``/<name>``."""
    return (
        f"## Skill for this request: {name}\n"
        f"The user activated the skill `{name}` for this message (the `/` command at its start; "
        "the rest of the message is their request). Follow the skill's instructions below for it; "
        "you need not load the skill again.\n\n"
        f"{instructions}"
    )
