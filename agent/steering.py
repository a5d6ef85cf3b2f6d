"""Steering a running turn: messages a user sends while the agent works, given to it at its next
model call instead of waiting for the turn to end.

The gateway decides which messages may steer a turn (docs/steering.md) and hands the turn an
:class:`Inbox` in :attr:`agent.turn.TurnOptions.inbox`. The harness makes it the current turn's
inbox for the graph run (a context variable, like the turn's model choice in
agent/turn_overrides.py, so agent/ never imports the gateway), and :class:`SteerInbox`, a
``wrap_model_call`` middleware of the lead agent, drains it right before each model call.

What a drained message becomes: a plain ``HumanMessage`` with the chat message's id and sender,
built exactly like a turn's own message (never system text: it is a user's words), added to the
request and to the thread's history in front of the model's reply, so the checkpoint keeps it in
the order the model read it. A turn that makes no further model call never drains its inbox: the
gateway then answers those messages as queued turns of their own (nothing is dropped).

Why a middleware and not a node: every extra node is one more super-step and checkpoint write per
turn; ``wrap_model_call`` runs inside the model node (agent/middleware.py says the same).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage

from agent.provenance import PROVENANCE_KEY
from agent.turn_overrides import scoped

STEERED_KEY = "chital_steered"
"""Marks a HumanMessage that reached a running turn by steering (in ``additional_kwargs``)."""


@dataclass(frozen=True, slots=True)
class SteerMessage:
    """A user's message for the running turn: its chat message id, its sender, its text (the
    gateway masked the daemon's secrets in it, as in any turn's text)."""

    message_id: str
    user_id: str
    text: str
    provenance: str | None = None
    """The untrusted sources the message came with (``Provenance.to_json``: a forwarded message is
    someone else's words), as a turn's own message carries them (agent/provenance.py): steered,
    it taints the running turn's lasting actions just as it would its own turn's."""


class Inbox(Protocol):
    """What the gateway hands a turn. ``take`` is called on the event loop right before a model
    call; what it returns is that call's, and the gateway counts it as consumed by this turn."""

    def take(self) -> list[SteerMessage]: ...


class Taken:
    """``inbox`` keeping the ids of what it handed out: messages steered into a turn are part of it,
    so a later run of one of them (its own journal entry, run again) must replay, not answer."""

    def __init__(self, inbox: Inbox | None) -> None:
        self.inbox = inbox
        self.ids: list[str] = []

    def take(self) -> list[SteerMessage]:
        got = self.inbox.take() if self.inbox is not None else []
        self.ids.extend(m.message_id for m in got)
        return got


_CURRENT: contextvars.ContextVar[Inbox | None] = contextvars.ContextVar("chital_inbox", default=None)


def receiving(inbox: Inbox | None) -> contextlib.AbstractContextManager[None]:
    """Make ``inbox`` the current turn's for the model calls made inside."""
    return scoped(_CURRENT, inbox)


def steered_message(message: SteerMessage) -> HumanMessage:
    """``message`` as the thread's history keeps it: the user's own words, the chat's message id."""
    return HumanMessage(
        content=message.text,
        id=message.message_id,
        additional_kwargs={
            "user_id": message.user_id,
            STEERED_KEY: True,
            **({PROVENANCE_KEY: message.provenance} if message.provenance else {}),
        },
    )


def steered(message: AnyMessage) -> bool:
    """A user's message that reached a running turn by steering (agent/steering.py): part of that
    turn, not the start of a turn of its own."""
    return isinstance(message, HumanMessage) and bool(message.additional_kwargs.get(STEERED_KEY))


def turn_start(message: AnyMessage) -> bool:
    """The message that started a turn (a user's, not one steered into a running turn)."""
    return isinstance(message, HumanMessage) and not steered(message)


class SteerInbox(AgentMiddleware[Any, Any, Any]):
    """Drains the current turn's inbox before each model call of the lead agent."""

    @staticmethod
    def _drained() -> list[HumanMessage]:
        inbox = _CURRENT.get()
        if inbox is None:
            return []
        return [steered_message(m) for m in inbox.take()]

    @staticmethod
    def _with(request: ModelRequest[Any], added: list[HumanMessage]) -> ModelRequest[Any]:
        return request.override(messages=[*request.messages, *added])

    @staticmethod
    def _kept(added: list[HumanMessage], response: ModelResponse[Any] | AIMessage) -> ModelResponse[Any]:
        """The model node's update: the steered messages, then what the model said."""
        if isinstance(response, AIMessage):
            return ModelResponse(result=[*added, response])
        return ModelResponse(
            result=[*added, *response.result], structured_response=response.structured_response
        )

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        # A sync run (not the daemon's) runs this off the event loop: no inbox is taken there.
        return handler(request)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        added = self._drained()
        if not added:
            return await handler(request)
        return self._kept(added, await handler(self._with(request, added)))
