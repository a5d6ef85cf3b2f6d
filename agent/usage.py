"""Token usage of every model call, reported to whoever runs the agent (the gateway records it).

The agent knows no database: it reports each finished model call as a :class:`TokenUsage` to a
:class:`UsageSink` given to the runtime. One :class:`UsageCallback` is attached to each chat model
instance (``attach_usage``), so every call is counted wherever it is made: the lead's model node,
a sub-agent, the title and summary calls, the background memory extraction.

Who a call is for comes from the LangChain run's metadata, which LangGraph fills from the turn's
config (``Harness._config``: ``user_id``, ``message_id``; ``thread_id`` from ``configurable``) and
which nested runs inherit; the memory extraction passes the same keys itself. What it was for:
the run name (``chital_title``, ``chital_summary``, ``memory_extraction``), else a sub-agent when
LangChain's ``lc_agent_name`` is set (only sub-agents are named), else the lead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, LLMResult

log = logging.getLogger(__name__)

LEAD, SUBAGENT, TITLE, SUMMARY, MEMORY = "lead", "subagent", "title", "summary", "memory"
_BY_RUN_NAME = {"chital_title": TITLE, "chital_summary": SUMMARY, "memory_extraction": MEMORY}
_MAX_OPEN = 4096
"""Started calls remembered while waiting for their end (a bound: a call that never ends)."""


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """One finished model call."""

    model: str
    """The name of the model in the config (``models[].name``), not the provider's id."""
    purpose: str
    """``lead``, ``subagent``, ``title``, ``summary`` or ``memory``."""
    user: str
    thread_id: str
    message_id: str
    prompt_tokens: int
    completion_tokens: int


class UsageSink(Protocol):
    """Receives each model call's usage. Called on the event loop, inside the model call: it must
    return at once (queue the write) and never raise."""

    def record(self, usage: TokenUsage) -> None: ...


def _purpose(name: Any, metadata: dict[str, Any]) -> str:
    if isinstance(name, str) and name in _BY_RUN_NAME:
        return _BY_RUN_NAME[name]
    return SUBAGENT if metadata.get("lc_agent_name") else LEAD


def _counts(response: LLMResult) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a result: the messages' ``usage_metadata``, else the
    provider's ``token_usage`` in ``llm_output``; None when the provider said nothing."""
    prompt = completion = 0
    found = False
    for generations in response.generations:
        for generation in generations:
            message = generation.message if isinstance(generation, ChatGeneration) else None
            usage = message.usage_metadata if isinstance(message, AIMessage) else None
            if usage:
                found = True
                prompt += int(usage.get("input_tokens") or 0)
                completion += int(usage.get("output_tokens") or 0)
    if found:
        return prompt, completion
    raw = (response.llm_output or {}).get("token_usage")
    if isinstance(raw, dict) and raw:
        return int(raw.get("prompt_tokens") or 0), int(raw.get("completion_tokens") or 0)
    return None


class UsageCallback(BaseCallbackHandler):
    """Reports the usage of each call of one chat model to a sink (see the module docstring)."""

    run_inline = True
    """Called on the event loop, not in a worker thread: it only queues a record."""

    def __init__(self, model: str, sink: UsageSink) -> None:
        super().__init__()
        self.model = model
        self.sink = sink
        self._open: dict[UUID, tuple[str, str, str, str]] = {}

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        meta = metadata or {}
        if len(self._open) >= _MAX_OPEN:
            self._open.pop(next(iter(self._open)))
        self._open[run_id] = (
            _purpose(kwargs.get("name"), meta),
            str(meta.get("user_id") or ""),
            str(meta.get("thread_id") or ""),
            str(meta.get("message_id") or ""),
        )

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        who = self._open.pop(run_id, None)
        if who is None:
            return
        counts = _counts(response)
        if counts is None:
            return
        purpose, user, thread_id, message_id = who
        try:
            self.sink.record(TokenUsage(self.model, purpose, user, thread_id, message_id, *counts))
        except Exception:  # never fail a model call over its bookkeeping
            log.exception("usage: recording a model call failed")

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._open.pop(run_id, None)


def attach_usage(model: BaseChatModel, name: str, sink: UsageSink | None) -> BaseChatModel:
    """Count every call of ``model`` (configured as ``name``) into ``sink``; no-op without a sink."""
    if sink is None:
        return model
    handler = UsageCallback(name, sink)
    callbacks = model.callbacks
    if isinstance(callbacks, BaseCallbackManager):
        callbacks.add_handler(handler, inherit=False)
    else:
        model.callbacks = [*(callbacks or []), handler]
    return model
