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

Budgets: when the sink is also a :class:`BudgetLedger` (the gateway's is), the same callback asks
it for a hold BEFORE each call (``on_chat_model_start``, awaited: the request is not sent until
the ledger said yes) and settles the hold with the call's usage after it. A refusal raises
:class:`BudgetRefused`, which stops the call before any byte goes to the provider; the harness
turns it into the turn's visible note. Living on the model rather than in agent middleware is
what makes it cover every call: the lead, sub-agents, titles, summaries and memory extraction.
A provider that reports no usage (or zeros for a call that said something) is counted anyway,
by estimate (:func:`estimate_text`), and the record says so (``estimated``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
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
    estimated: bool = False
    """The provider reported no usage: the counts are our estimate (:func:`estimate_text`)."""
    hold: object | None = field(default=None, compare=False)
    """What :meth:`BudgetLedger.reserve` set aside for this call, settled by this record."""
    cached_tokens: int = 0
    """Of ``prompt_tokens``, those the provider read from its prompt cache (billed lower)."""


class UsageSink(Protocol):
    """Receives each model call's usage. Called on the event loop, inside the model call: it must
    return at once (queue the write) and never raise."""

    def record(self, usage: TokenUsage) -> None: ...


class BudgetRefused(Exception):
    """A model call the user's token budget does not allow; ``message`` is for the chat (the
    gateway words it: the budget, what was used, when it renews). Raised before the request is
    sent, never retried (``agent.middleware.is_retryable`` says no)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _RefusalsAreNotErrors(logging.Filter):
    """LangChain logs every exception a callback raises as a WARNING ("Error in UsageCallback.
    on_chat_model_start callback: ..."); a budget refusal is expected, and the ledger logs it
    once, at INFO (one line per event for the operator)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(a, str) and a.startswith("BudgetRefused(") for a in args)


logging.getLogger("langchain_core.callbacks.manager").addFilter(_RefusalsAreNotErrors())


class PlannedCall:
    """A model call about to be made, as the ledger sees it. The prompt estimate is computed only
    when asked (a user without a budget costs nothing)."""

    __slots__ = ("_estimate", "_messages", "_tools", "max_output", "message_id", "model", "purpose",
                 "thread_id", "user")  # fmt: skip

    def __init__(
        self,
        model: str,
        purpose: str,
        user: str,
        thread_id: str,
        message_id: str,
        messages: Sequence[Any],
        tools: Any = None,
        max_output: int | None = None,
    ) -> None:
        self.model, self.purpose, self.user = model, purpose, user
        self.thread_id, self.message_id = thread_id, message_id
        self.max_output = max_output
        """The request's ``max_tokens`` (None: it sets none; the ledger assumes its default)."""
        self._messages, self._tools = messages, tools
        self._estimate: int | None = None

    def prompt_tokens(self) -> int:
        """Estimated tokens of the request: its messages and tool schemas."""
        if self._estimate is None:
            self._estimate = estimate_messages(self._messages) + (
                estimate_text(_dumps(self._tools)) if self._tools else 0
            )
        return self._estimate


@runtime_checkable
class BudgetLedger(Protocol):
    """A :class:`UsageSink` that also enforces budgets (see the module docstring)."""

    def record(self, usage: TokenUsage) -> None: ...

    async def reserve(self, call: PlannedCall) -> object | None:
        """Before the call: a hold to settle later, None when the user has no budget; raises
        :class:`BudgetRefused` when the call may not be made."""
        ...

    def release(self, hold: object) -> None:
        """The call ended without usage to record (it failed before answering): free the hold."""
        ...


# -- estimates -----------------------------------------------------------------------------------
CHARS_PER_TOKEN = 4
"""The estimate's rule of thumb, over UTF-8 bytes rather than characters so that scripts that take
more tokens per character (CJK: about one a character, three bytes each) are not undercounted."""
MESSAGE_OVERHEAD = 4
"""Tokens each message costs besides its text (role, separators), as OpenAI's chat format counts."""
IMAGE_TOKENS = 1000
"""An image part, whatever its base64 size (providers bill images by tiles, roughly this much)."""


def estimate_text(text: str) -> int:
    """Tokens of ``text`` by the rule of thumb: why not tiktoken (installed with langchain-openai):
    it downloads its vocabulary on first use (an offline daemon would hang on it), it is OpenAI's
    tokenizer only, and it costs real CPU per call on long threads; a budget needs a bound that
    is cheap, deterministic and provider-neutral, and says it is an estimate."""
    if not text:
        return 0
    size = len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
    return -(-size // CHARS_PER_TOKEN)


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return estimate_text(content)
    total = 0
    for part in content if isinstance(content, list) else ():
        if isinstance(part, str):
            total += estimate_text(part)
        elif isinstance(part, dict):
            kind = str(part.get("type", ""))
            if "image" in kind:
                total += IMAGE_TOKENS
            elif isinstance(part.get("text"), str):
                total += estimate_text(part["text"])
            else:
                total += estimate_text(_dumps(part))
    return total


def estimate_messages(messages: Sequence[Any]) -> int:
    """Tokens of a request's messages (text, tool calls, images), by :func:`estimate_text`."""
    total = 0
    for message in messages:
        if isinstance(message, list | tuple):  # a batch: LangChain passes [[messages]]
            total += estimate_messages(message)
            continue
        if not isinstance(message, BaseMessage):
            total += estimate_text(str(message))
            continue
        total += MESSAGE_OVERHEAD + _content_tokens(message.content)
        if isinstance(message, AIMessage) and message.tool_calls:
            total += estimate_text(_dumps(message.tool_calls))
    return total


def estimate_output(response: LLMResult) -> int:
    """Tokens of what the model answered (text and tool calls), by :func:`estimate_text`."""
    total = 0
    for generations in response.generations:
        for generation in generations:
            message = generation.message if isinstance(generation, ChatGeneration) else None
            if isinstance(message, AIMessage):
                total += _content_tokens(message.content)
                if message.tool_calls:
                    total += estimate_text(_dumps(message.tool_calls))
            else:
                total += estimate_text(getattr(generation, "text", "") or "")
    return total


def _max_output(params: Any) -> int | None:
    if not isinstance(params, dict):
        return None
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _purpose(name: Any, metadata: dict[str, Any]) -> str:
    if isinstance(name, str) and name in _BY_RUN_NAME:
        return _BY_RUN_NAME[name]
    return SUBAGENT if metadata.get("lc_agent_name") else LEAD


def _cached(response: LLMResult) -> int:
    """Prompt tokens the provider says it read from its cache (``input_token_details.cache_read``,
    else OpenAI's ``prompt_tokens_details.cached_tokens``); 0 when it says nothing believable."""
    total = 0
    for generations in response.generations:
        for generation in generations:
            message = generation.message if isinstance(generation, ChatGeneration) else None
            usage = message.usage_metadata if isinstance(message, AIMessage) else None
            details = usage.get("input_token_details") if usage else None
            if isinstance(details, dict):
                total += _reported(details.get("cache_read")) or 0
    if total:
        return total
    raw = (response.llm_output or {}).get("token_usage")
    details = raw.get("prompt_tokens_details") if isinstance(raw, dict) else None
    return (_reported(details.get("cached_tokens")) or 0) if isinstance(details, dict) else 0


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
                said = _reported(usage.get("input_tokens")), _reported(usage.get("output_tokens"))
                if said[0] is None or said[1] is None:
                    return None
                prompt, completion = prompt + said[0], completion + said[1]
    if found:
        return prompt, completion
    raw = (response.llm_output or {}).get("token_usage")
    if isinstance(raw, dict) and raw:
        said = _reported(raw.get("prompt_tokens")), _reported(raw.get("completion_tokens"))
        return None if said[0] is None or said[1] is None else (said[0], said[1])
    return None


MAX_REPORTED = 10**9
"""Tokens one call may say it used and be believed: more (or a negative count, which would give
budget back) is a broken or hostile endpoint's number, and the call is counted by estimate."""


def _reported(value: Any) -> int | None:
    """A count the provider reported, or None when it is not a believable one (negative, absurd,
    not a number: ``"lots"``, ``NaN``). Missing counts as 0, as before."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    try:
        count = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return count if 0 <= count <= MAX_REPORTED else None


@dataclass(slots=True)
class _Call:
    """A started call, until its end: who it is for and what it asked (for an estimate)."""

    purpose: str
    user: str
    thread_id: str
    message_id: str
    planned: PlannedCall
    hold: object | None = None


class UsageCallback(BaseCallbackHandler):
    """Reports the usage of each call of one chat model to a sink, and asks a ledger before each
    call (see the module docstring)."""

    run_inline = True
    """Called on the event loop, not in a worker thread: it only queues a record."""
    raise_error = True
    """A :class:`BudgetRefused` from ``on_chat_model_start`` must stop the call; every other
    method catches its own errors (bookkeeping never fails a call)."""

    def __init__(self, model: str, sink: UsageSink) -> None:
        super().__init__()
        self.model = model
        self.sink = sink
        self.ledger = sink if isinstance(sink, BudgetLedger) else None
        self._open: dict[UUID, _Call] = {}

    async def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Awaited before the request is sent: the ledger's hold, or its refusal (raised)."""
        meta = metadata or {}
        params = kwargs.get("invocation_params")
        tools = params.get("tools") if isinstance(params, dict) else None
        purpose, user = _purpose(kwargs.get("name"), meta), str(meta.get("user_id") or "")
        thread_id, message_id = str(meta.get("thread_id") or ""), str(meta.get("message_id") or "")
        planned = PlannedCall(
            self.model, purpose, user, thread_id, message_id, messages, tools, _max_output(params)
        )
        call = _Call(purpose, user, thread_id, message_id, planned)
        if self.ledger is not None and call.user:
            try:
                call.hold = await self.ledger.reserve(planned)
            except BudgetRefused:
                raise
            except Exception:  # our own bug must not stop the user's call (the ledger words its own)
                log.exception("usage: the budget check failed")
        if len(self._open) >= _MAX_OPEN:
            self._forget(self._open.pop(next(iter(self._open))))
        self._open[run_id] = call

    def _forget(self, call: _Call) -> None:
        if call.hold is not None and self.ledger is not None:
            try:
                self.ledger.release(call.hold)
            except Exception:
                log.exception("usage: releasing a budget hold failed")

    def _record(self, call: _Call, counts: tuple[int, int], estimated: bool, cached: int = 0) -> None:
        usage = TokenUsage(
            self.model, call.purpose, call.user, call.thread_id, call.message_id, *counts,
            estimated=estimated, hold=call.hold, cached_tokens=min(cached, counts[0]),
        )  # fmt: skip
        try:
            self.sink.record(usage)
        except Exception:  # never fail a model call over its bookkeeping
            log.exception("usage: recording a model call failed")

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        call = self._open.pop(run_id, None)
        if call is None:
            return
        counts = _counts(response)
        if counts is not None and counts != (0, 0):
            self._record(call, counts, estimated=False, cached=_cached(response))
            return
        # No usage (or zeros, which no real answer costs): count it anyway, by estimate.
        try:
            counts = (call.planned.prompt_tokens(), estimate_output(response))
        except Exception:
            log.exception("usage: estimating a model call failed")
            counts = (0, 0)
        self._record(call, counts, estimated=True)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A failed or stopped call (``/stop``, a dropped stream): when it had begun to answer,
        the provider has billed it, so it is counted by estimate; otherwise its hold is freed."""
        call = self._open.pop(run_id, None)
        if call is None:
            return
        response = kwargs.get("response")
        said = 0
        if isinstance(response, LLMResult):
            try:
                said = estimate_output(response)
            except Exception:
                said = 0
        if said:
            self._record(call, (call.planned.prompt_tokens(), said), estimated=True)
        else:
            self._forget(call)


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
