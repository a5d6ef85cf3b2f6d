"""Safety middleware of the lead agent: guardrails that can veto tool calls (fail-closed) and tool
errors turned into short, secret-free messages the model can recover from."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, cast

from langchain.agents.middleware import ToolErrorMiddleware
from langchain.agents.middleware.types import (
    AgentMiddleware,
    ToolCallRequest,
)
from langchain_core.messages import ToolMessage
from langchain_core.tools import ToolException
from langgraph.errors import GraphBubbleUp
from langgraph.types import Command

from agent.redact import Redactor as SecretRedactor
from agent.sandbox.paths import SandboxError

log = logging.getLogger(__name__)


# ---- redaction and tool errors ------------------------------------------------------------------
_SECRETISH = re.compile(
    r"(?i)(bearer\s+|(?:api[_-]?key|access[_-]?token|token|secret|password)[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;]+"
)


class Redactor(SecretRedactor):
    """:class:`agent.redact.Redactor` (the secret values, token shapes) plus credential-looking
    assignments (``password: …``, ``token=…``, ``Bearer …``): for texts that describe a tool call
    or its failure (error messages, approval prompts), where such an assignment is most likely a
    credential. Successful tool results get the plain redactor: masking every ``password = …``
    in a file the agent reads would break its edits of that file."""

    def __call__(self, text: str) -> str:
        return _SECRETISH.sub(r"\1***", super().__call__(text))


_SAFE_ERRORS: tuple[type[BaseException], ...] = (ToolException, SandboxError)
"""Exceptions raised on purpose with a text meant for the model; others show only their type."""


def _redact_message(message: Any, strict: Redactor, plain: SecretRedactor) -> Any:
    if not isinstance(message, ToolMessage):
        return message
    redact = strict if message.status == "error" else plain
    if isinstance(message.content, str):
        content: Any = redact(message.content)
        if content is message.content:
            return message
    else:
        content = [
            {**b, "text": redact(str(b["text"]))} if isinstance(b, dict) and "text" in b else b
            for b in message.content
        ]
    return message.model_copy(update={"content": content})


def redact_result(
    result: ToolMessage | Command[Any], strict: Redactor, plain: SecretRedactor
) -> ToolMessage | Command[Any]:
    """A tool's result with the daemon's secrets masked: an error's text by ``strict``, a
    success's by ``plain``; a :class:`Command`'s messages alike."""
    if isinstance(result, ToolMessage):
        return cast(ToolMessage, _redact_message(result, strict, plain))
    update = result.update
    if isinstance(update, dict) and isinstance(update.get("messages"), list | tuple):
        messages = [_redact_message(m, strict, plain) for m in update["messages"]]
        return dataclasses.replace(result, update={**update, "messages": messages})
    return result


class RedactToolResults(AgentMiddleware[Any, Any, Any]):
    """Masks the daemon's secrets in every tool result (see :class:`ToolErrors`), for agents
    whose tool errors are handled elsewhere (sub-agents: their tool results go to the model
    provider in the sub-agent's own requests)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.strict = Redactor(secrets)
        self.plain = SecretRedactor(self.strict.secrets)

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        return redact_result(handler(request), self.strict, self.plain)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        return redact_result(await handler(request), self.strict, self.plain)


class ToolErrors(ToolErrorMiddleware[Any, Any]):
    """LangChain's ToolErrorMiddleware with Chital's message: which tool, what kind of failure,
    and the text only of exceptions meant for the model (redacted, cut short).

    It also masks the daemon's secrets in every tool result on its way to the model (and to the
    checkpoint): a tool's output is the one text the model provider gets that the daemon did not
    write, and a command, a web page or an MCP server may print a token the daemon holds. Error
    results (``handle_tool_error`` tools, MCP servers reporting ``isError``) get the strict
    redactor; successful ones the values and token shapes only (see :class:`Redactor`). A
    :class:`Command`'s messages are masked the same way.
    """

    def __init__(self, secrets: Iterable[str] = (), max_chars: int = 500) -> None:
        self.redact = Redactor(secrets)
        self.plain = SecretRedactor(self.redact.secrets)
        self.max_chars = max_chars
        super().__init__(self._on_error)

    def _on_error(self, exc: Exception, request: ToolCallRequest) -> str:
        name = request.tool_call["name"]
        if isinstance(exc, _SAFE_ERRORS):
            detail = self.redact(str(exc)).strip() or type(exc).__name__
            if len(detail) > self.max_chars:
                detail = detail[: self.max_chars - 1] + "…"
        elif isinstance(exc, TimeoutError):
            detail = "it timed out"
        else:
            detail = type(exc).__name__
        # Type only at warning level: exception texts may carry URLs with tokens.
        log.warning("tool %s failed: %s", name, type(exc).__name__)
        log.debug("tool %s failure", name, exc_info=exc)
        return f"Error: {name} failed ({detail}). Fix the arguments and retry, or go on without it."

    def _scrub(self, result: ToolMessage | Command[Any]) -> ToolMessage | Command[Any]:
        return redact_result(result, self.redact, self.plain)

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        return self._scrub(super().wrap_tool_call(request, handler))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        return self._scrub(await super().awrap_tool_call(request, handler))


# ---- guardrails ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Allow:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Deny:
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class GuardrailContext:
    thread_id: str
    user_id: str
    message_id: str
    tool_call_id: str


Guardrail = Callable[[str, dict[str, Any], GuardrailContext], Awaitable[Allow | Deny]]


class GuardrailMiddleware(AgentMiddleware[Any, Any, Any]):
    """Every guardrail must answer ``Allow()`` for a tool call to run.

    Fail-closed: a guardrail that raises, times out or answers anything but Allow/Deny denies.
    A denied call becomes an error ToolMessage saying why, so the model can tell the user.
    """

    def __init__(self, guardrails: Sequence[Guardrail], *, timeout: float = 10.0) -> None:
        super().__init__()
        self.guardrails = list(guardrails)
        self.timeout = timeout

    @staticmethod
    def _context(request: ToolCallRequest) -> GuardrailContext:
        config = getattr(request.runtime, "config", None) or {}
        meta = config.get("metadata") or {}
        conf = config.get("configurable") or {}
        return GuardrailContext(
            thread_id=str(conf.get("thread_id", "")),
            user_id=str(meta.get("user_id", "")),
            message_id=str(meta.get("message_id", "")),
            tool_call_id=str(request.tool_call.get("id") or ""),
        )

    async def _verdict(self, request: ToolCallRequest) -> Deny | None:
        name, args = request.tool_call["name"], dict(request.tool_call.get("args") or {})
        ctx = self._context(request)
        for guardrail in self.guardrails:
            try:
                async with asyncio.timeout(self.timeout):
                    verdict = await guardrail(name, args, ctx)
            except GraphBubbleUp:
                raise
            except TimeoutError:
                log.warning("guardrail %r timed out on %s; denied", guardrail, name)
                return Deny("the safety check did not answer in time")
            except Exception as exc:
                log.warning("guardrail %r failed on %s (%s); denied", guardrail, name, type(exc).__name__)
                return Deny("the safety check failed")
            if isinstance(verdict, Deny):
                return verdict
            if not isinstance(verdict, Allow):
                return Deny("the safety check gave no verdict")
        return None

    @staticmethod
    def _refusal(request: ToolCallRequest, deny: Deny) -> ToolMessage:
        name = request.tool_call["name"]
        log.info("tool call %s denied: %s", name, deny.reason)
        return ToolMessage(
            content=f"Refused: {name} was not run. Reason: {deny.reason}",
            tool_call_id=request.tool_call["id"],
            name=name,
            status="error",
        )

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        deny = await self._verdict(request)
        return self._refusal(request, deny) if deny is not None else await handler(request)

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        # Guardrails are async; the sync path cannot ask them, so it denies (fail-closed).
        return self._refusal(request, Deny("tool calls need the async agent run"))
