"""Putting what is known about the sender into each model call, and noting finished turns.

``MemoryMiddleware`` is a ``wrap_model_call`` middleware on purpose, like the harness's own: it runs
inside the model node and adds no graph node (an ``after_agent`` hook would be one more super-step
and checkpoint write per turn, before the harness can yield the Final). It re-reads the facts on
every model call, so a long-lived chat sees facts learned a minute ago in another thread; the read
is one indexed SQLite query.

Tokens are estimated as ``ceil(characters / 4)``: no tokenizer matches every provider, and the
budget only needs to keep the section small, not exact.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.config import get_config

from agent.memory.facts import Fact
from agent.provenance import of_messages

if TYPE_CHECKING:
    from agent.memory.service import MemoryService

log = logging.getLogger(__name__)

HEADER = (
    "## What you know about this user\n"
    "Facts remembered from earlier conversations with the person who sent the current message, "
    "most relevant first. They may be outdated; use them when they help, do not recite them, and "
    "never attribute them to anyone else in the chat."
)

_BLOCK_OPEN = '<memory note="added by the assistant\'s memory, not written by the user">'

_WORD = re.compile(r"\w{3,}", re.UNICODE)
_STOP = frozenset(
    "the and for are but not you your with this that have has was were what when where which who "
    "how why can could would should about from they them their there here just like want need "
    "please thanks into out our more some any all its it's also than then".split()
)


def estimate_tokens(text: str) -> int:
    """Approximate tokens: one per four characters, rounded up."""
    return math.ceil(len(text) / 4)


@functools.lru_cache(maxsize=8192)
def _words(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORD.findall(text.casefold()) if w not in _STOP)


def rank(facts: Sequence[Fact], query: str) -> list[Fact]:
    """Most relevant first: facts sharing more words with the current message, then the newest.

    Word overlap, not embeddings: it needs no embedding model and no extra call, and for the few
    hundred short facts a user has, recency already orders most of them well.
    """
    words = _words(query)

    def key(fact: Fact) -> tuple[int, datetime]:
        return (len(words & _words(fact.text)), fact.updated_at)

    return sorted(facts, key=key, reverse=True)


def render_section(facts: Sequence[Fact], query: str, budget: int) -> str:
    """The system-prompt section for ``facts`` within ``budget`` tokens ("" when none fit)."""
    used = estimate_tokens(HEADER) + 1
    lines: list[str] = []
    for fact in rank(facts, query):
        line = f"- {fact.text}"
        cost = estimate_tokens(line) + 1
        if used + cost > budget:
            continue  # a shorter, less relevant fact may still fit
        used += cost
        lines.append(line)
    return HEADER + "\n" + "\n".join(lines) if lines else ""


def with_section(system: SystemMessage | None, section: str) -> SystemMessage:
    """``system`` with ``section`` appended, keeping content blocks (and their cache marks)."""
    if system is None:
        return SystemMessage(section)
    content = system.content
    if isinstance(content, str):
        return SystemMessage(f"{content}\n\n{section}" if content else section)
    return SystemMessage([*content, {"type": "text", "text": f"\n\n{section}"}])


def with_context_block(messages: Sequence[AnyMessage], section: str) -> list[AnyMessage]:
    """``messages`` with ``section`` prepended to the last HumanMessage, marked as not the user's.

    A content prefix rather than a system message in the middle: Anthropic moves non-leading
    system messages to the top (which changes the prefix again), OpenAI-compatible servers vary.
    """
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        message = out[i]
        if isinstance(message, HumanMessage):
            block = f"{_BLOCK_OPEN}\n{section}\n</memory>\n\n"
            content = message.content
            new = block + content if isinstance(content, str) else [{"type": "text", "text": block}, *content]
            out[i] = message.model_copy(update={"content": new})
            break
    return out


def _config() -> dict[str, Any]:
    try:
        return dict(get_config())
    except RuntimeError:  # not inside a runnable (direct use in a test)
        return {}


def sender_of(messages: Sequence[AnyMessage], config: dict[str, Any]) -> str | None:
    """Who sent the current message: the run's ``metadata.user_id`` (the harness sets it, and
    sub-agents inherit it), else the ``user_id`` on the last HumanMessage."""
    user = (config.get("metadata") or {}).get("user_id")
    if isinstance(user, str) and user:
        return user
    human = last_human(messages)
    user = human.additional_kwargs.get("user_id") if human is not None else None
    return user if isinstance(user, str) and user else None


def last_human(messages: Sequence[AnyMessage]) -> HumanMessage | None:
    return next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)


def _answer(response: Any) -> AIMessage | None:
    if isinstance(response, AIMessage):
        return response
    result: list[BaseMessage] = getattr(response, "result", None) or []
    if not result:
        inner = getattr(response, "model_response", None)  # ExtendedModelResponse
        result = getattr(inner, "result", None) or []
    return next((m for m in reversed(result) if isinstance(m, AIMessage)), None)


class MemoryMiddleware(AgentMiddleware[Any, Any, Any]):
    """Inject the sender's facts; in the lead agent also hand each finished turn to extraction.

    Sub-agents get ``note_turns=False``: they read memory, never write it.
    """

    def __init__(self, service: MemoryService, *, note_turns: bool) -> None:
        super().__init__()
        self.service = service
        self.note_turns = note_turns

    @property
    def name(self) -> str:
        return "ChitalMemory" if self.note_turns else "ChitalMemoryReadOnly"

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        config = _config()
        user = sender_of(request.messages, config)
        if user is None or not self.service.active:
            return await handler(request)
        human = last_human(request.messages)
        query = human.text if human is not None else ""
        section = await self.service.section_for(user, query)
        if section and self.service.settings.placement == "message":
            request = request.override(messages=with_context_block(request.messages, section))
        elif section:
            request = request.override(system_message=with_section(request.system_message, section))
        response = await handler(request)
        if self.note_turns and human is not None:
            answer = _answer(response)
            if answer is not None and not answer.tool_calls:  # the turn's final answer
                thread_id = str((config.get("configurable") or {}).get("thread_id", ""))
                message_id = (config.get("metadata") or {}).get("message_id") or human.id or ""
                # After untrusted content (agent/provenance.py) the answer may repeat what it said:
                # only the user's own words are learned from (docs/memory.md).
                untrusted = of_messages(request.messages).tainted
                self.service.note_turn(
                    user, thread_id, [human, answer], message_id=str(message_id), untrusted=untrusted
                )
        return response

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        # The memory store is async; Chital runs agents only through the async API.
        return handler(request)
