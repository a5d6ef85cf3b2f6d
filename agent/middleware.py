"""Chital's own agent middleware: model-call retries and the per-turn step budget.

Both are ``wrap_model_call`` middleware on purpose: they run inside the model node and add no graph
node (each extra node is one more super-step and checkpoint write per turn).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import ModelRequest, ModelResponse, ModelRetryMiddleware
from langchain.agents.middleware._retry import calculate_delay
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.exceptions import ModelError
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.config import get_stream_writer
from langgraph.errors import GraphBubbleUp

log = logging.getLogger(__name__)

RETRY_EVENT = "chital.model_retry"
"""Key of the custom stream event the harness turns into a StatusUpdate (and a delta replay guard)."""

_RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})


def is_retryable(exc: BaseException) -> bool:
    """Timeouts, connection errors, 429 and 5xx; never bad requests, auth errors or our own bugs."""
    if isinstance(exc, ModelError):
        return exc.is_retryable
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and status in _RETRYABLE_STATUS


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (``Retry-After``: seconds or an HTTP date), if any."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class RetryModelCalls(ModelRetryMiddleware):
    """LangChain's ModelRetryMiddleware, plus two things it lacks.

    - It honours ``Retry-After`` (a 429 telling us to wait 20 s is not retried after 1 s).
    - It reports each retry as a custom stream event, so the chat can say "retrying" and the
      harness knows a retried stream starts over.
    Exhausted retries re-raise (``on_failure="error"``): the harness maps the error to a clear
    TurnFailed instead of letting an error string pose as the model's answer.
    """

    def __init__(self, *, max_retries: int, initial_delay: float, max_delay: float = 60.0) -> None:
        super().__init__(
            max_retries=max_retries,
            retry_on=is_retryable,
            on_failure="error",
            backoff_factor=2.0,
            initial_delay=initial_delay,
            max_delay=max_delay,
            jitter=True,
        )

    def _delay(self, attempt: int, exc: BaseException) -> float:
        delay = calculate_delay(
            attempt,
            backoff_factor=self.backoff_factor,
            initial_delay=self.initial_delay,
            max_delay=self.max_delay,
            jitter=self.jitter,
        )
        asked = retry_after(exc)
        if asked is not None:
            delay = max(delay, min(asked, self.max_delay))
        return delay

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        attempt = 0
        while True:
            try:
                return await handler(request)
            except GraphBubbleUp:
                raise
            except Exception as exc:
                if attempt >= self.max_retries or not is_retryable(exc):
                    raise
                delay = self._delay(attempt, exc)
                attempt += 1
                # Type and status only: provider messages may quote request details.
                log.info(
                    "model call failed (%s %s); retry %d/%d in %.2fs",
                    type(exc).__name__,
                    getattr(exc, "status_code", ""),
                    attempt,
                    self.max_retries,
                    delay,
                )
                try:
                    get_stream_writer()(
                        {RETRY_EVENT: {"attempt": attempt, "delay": delay, "error": type(exc).__name__}}
                    )
                except RuntimeError:  # not inside a graph run (direct use in a test)
                    pass
                await asyncio.sleep(delay)


class StepBudget(AgentMiddleware[Any, Any, Any]):
    """Make the model's last allowed call of a turn answer in text.

    LangChain's ModelCallLimitMiddleware stops with a canned "limit exceeded" message and adds a
    before_model node; here the model gets ``tool_choice="none"`` and a note on its final step, so
    the user still gets a real answer from what was gathered.
    """

    NOTE = "You have reached this turn's step limit: answer the user now with what you have, no tool calls."

    def __init__(self, max_steps: int) -> None:
        super().__init__()
        self.max_steps = max_steps

    def _is_last_step(self, request: ModelRequest[Any]) -> bool:
        if not request.tools:
            return False
        calls = 0
        for message in reversed(request.messages):
            if isinstance(message, HumanMessage):
                break
            if isinstance(message, AIMessage):
                calls += 1
        return calls + 1 >= self.max_steps

    def _limit(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        base = request.system_message.text if request.system_message is not None else ""
        note = f"{base}\n\n{self.NOTE}" if base else self.NOTE
        return request.override(tool_choice="none", system_message=SystemMessage(note))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage:
        return handler(self._limit(request) if self._is_last_step(request) else request)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage:
        return await handler(self._limit(request) if self._is_last_step(request) else request)
