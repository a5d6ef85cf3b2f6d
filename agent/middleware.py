"""Chital's own agent middleware: model-call retries and the per-turn step budget.

Both are ``wrap_model_call`` middleware on purpose: they run inside the model node and add no graph
node (each extra node is one more super-step and checkpoint write per turn).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from langchain.agents.middleware import ModelRequest, ModelResponse, ModelRetryMiddleware
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.exceptions import (
    ModelAuthenticationError,
    ModelConnectionError,
    ModelError,
    ModelNotFoundError,
    ModelPermissionDeniedError,
    ModelRateLimitError,
    ModelTimeoutError,
)
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.config import get_stream_writer
from langgraph.errors import GraphBubbleUp

from compat import langchain as lc_compat

log = logging.getLogger(__name__)

RETRY_EVENT = "chital.model_retry"
"""Key of the custom stream event the harness turns into a StatusUpdate (and a delta replay guard)."""

_RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})

UNREACHABLE_RETRIES = 1
"""Retries of a call whose connection was refused or whose host name did not resolve, whatever
``model_retries`` says: a stopped server or a mistyped base URL does not come back within a backoff
schedule, and the user should learn the cause in a second or two. One retry rides out a restart."""

FailureKind = Literal[
    "refused", "dns", "connect", "timeout", "auth", "forbidden", "not_found", "rate_limited", "server",
    "request", "other",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class ModelFailure:
    """Why a model call failed, in our own words: the provider's error text is never used (it can
    quote the request or part of a key). ``url`` is the request's, without credentials or query."""

    kind: FailureKind
    url: str = ""
    status: int | None = None
    reason: str = ""
    """For ``connect``: the operating system's words (``Network is unreachable``)."""

    @property
    def unreachable(self) -> bool:
        return self.kind in ("refused", "dns", "connect")

    def cause(self) -> str:
        """A short phrase fit for any chat: "The model service <cause>; retrying…"."""
        if self.unreachable:
            return "cannot be reached"
        return {
            "timeout": "did not answer in time",
            "rate_limited": "is rate-limited",
            "server": f"failed (HTTP {self.status})",
        }.get(self.kind, "failed")

    def detail(self) -> str:
        """For the operator (log, terminal): the cause, the URL and what to check. Names hosts."""
        at = self.url or "the model service"
        http = f"HTTP {self.status} from {at}"
        return {
            "refused": f"connection refused: {at} (is the model server running? check base_url)",
            "dns": f"DNS failure: cannot resolve the host of {at} (check base_url)",
            "connect": f"cannot connect to {at}: {self.reason or 'connection failed'}",
            "timeout": f"timeout: {at} did not answer within agent.model_timeout",
            "auth": f"{http}: the API key was refused (check api_key / OPENAI_API_KEY)",
            "forbidden": f"{http}: the API key may not use this model (permission denied)",
            "not_found": f"{http}: wrong model name or base URL (check the model's `model` and base_url)",
            "rate_limited": f"{http}: rate-limited",
            "server": f"{http}: the model server failed",
            "request": f"{http}: the request was refused",
        }.get(self.kind, "")


def diagnose(exc: BaseException) -> ModelFailure:
    """Classify a model call's exception (LangChain's ``Model*Error`` types, HTTP status codes, and
    the socket errors underneath a connection failure)."""
    url = _request_url(exc)
    raw = getattr(exc, "status_code", None)
    status = raw if isinstance(raw, int) else None
    kind: FailureKind
    reason = ""
    if isinstance(exc, ModelTimeoutError | TimeoutError) or status == 408:
        kind = "timeout"
    elif isinstance(exc, ModelAuthenticationError) or status == 401:
        kind = "auth"
    elif isinstance(exc, ModelPermissionDeniedError) or status == 403:
        kind = "forbidden"
    elif isinstance(exc, ModelNotFoundError) or status == 404:
        kind = "not_found"
    elif isinstance(exc, ModelRateLimitError) or status == 429:
        kind = "rate_limited"
    elif status is not None:
        kind = "server" if status >= 500 else "request"
    else:
        chain = list(_causes(exc))
        if any(isinstance(e, ConnectionRefusedError) for e in chain):
            kind = "refused"
        elif any(isinstance(e, socket.gaierror) for e in chain):
            kind = "dns"
        elif isinstance(exc, ModelConnectionError | ConnectionError):
            kind = "connect"
            root = next((e for e in reversed(chain) if isinstance(e, OSError)), None)
            reason = (root.strerror or str(root))[:200] if root is not None else ""
        else:
            kind = "other"
    return ModelFailure(kind, url, status, reason)


def _causes(exc: BaseException, depth: int = 12) -> Iterator[BaseException]:
    """``exc`` and what lies under it: causes, contexts and the members of exception groups."""
    seen: set[int] = set()
    stack: list[tuple[BaseException, int]] = [(exc, 0)]
    while stack:
        current, level = stack.pop()
        if id(current) in seen or level > depth:
            continue
        seen.add(id(current))
        yield current
        below = [current.__cause__, current.__context__]
        if isinstance(current, BaseExceptionGroup):
            below += list(current.exceptions)
        stack += [(e, level + 1) for e in below if e is not None]


def _request_url(exc: BaseException) -> str:
    """The URL the failed request went to (openai/httpx errors carry the request), reduced to
    scheme, host, port and path: no user:password, no query string."""
    for e in _causes(exc, depth=3):
        request = getattr(e, "request", None)
        url = getattr(request, "url", None)
        if url is None:
            continue
        try:
            parts = urlsplit(str(url))
        except ValueError:
            return ""
        host = parts.netloc.rpartition("@")[2]
        return f"{parts.scheme}://{host}{parts.path}" if parts.scheme and host else ""
    return ""


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
        delay = lc_compat.retry_delay(
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
                failure = diagnose(exc)
                limit = self.max_retries
                if failure.unreachable:
                    limit = min(limit, UNREACHABLE_RETRIES)
                if attempt >= limit or not is_retryable(exc):
                    raise
                delay = self._delay(attempt, exc)
                attempt += 1
                # Our own words only: provider messages may quote request details.
                log.info(
                    "model call failed (%s: %s); retry %d/%d in %.2fs",
                    type(exc).__name__,
                    failure.detail() or "unclassified",
                    attempt,
                    limit,
                    delay,
                )
                try:
                    get_stream_writer()(
                        {
                            RETRY_EVENT: {
                                "attempt": attempt,
                                "of": limit,
                                "delay": delay,
                                "error": type(exc).__name__,
                                "cause": failure.cause(),
                            }
                        }
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
