"""Traces of a turn's agent work: which callback handlers a run gets (docs/tracing.md).

The gateway owns tracing (its config, the exporters, the turn span: gateway/ops/tracing.py); the
agent knows none of that and imports nothing of the gateway. What the gateway hands over at start-up
is a :class:`TraceHooks`: the tracer the agent's spans go to, whether texts are recorded, the
redactor that masks them, and the extra handlers a turn gets (Langfuse's). A process-wide setting,
as OpenTelemetry's own tracer provider is.

Why a callback handler and not spans around our own code: model calls, tool calls and sub-agents
happen inside LangChain and LangGraph, whose callbacks are the public place they are announced,
each with its run id and its parent's. The handler (agent/trace_spans.py) nests its spans by those
ids under the span that was current when the run started: the gateway's turn span.

With tracing off, :func:`callbacks` is one ``is None`` test per turn and nothing of OpenTelemetry
is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler


@dataclass(frozen=True, slots=True)
class TraceHooks:
    """What the gateway tells the agent about tracing (installed once, :func:`install`)."""

    tracer: Any
    """An ``opentelemetry.trace.Tracer`` the agent's spans are made with."""
    redact: Callable[[str], str]
    """Masks the daemon's secrets (every configured value): applied to every text a span records,
    error messages included."""
    record_content: bool = False
    """Record prompts, completions, tool arguments and results (masked, cut at ``content_chars``)."""
    content_chars: int = 4000
    extra: Callable[[Any], Sequence[BaseCallbackHandler]] | None = None
    """More handlers for a traced turn, given the turn span's ``SpanContext`` (Langfuse's)."""


_hooks: TraceHooks | None = None


def install(hooks: TraceHooks | None) -> None:
    """Turn the agent's spans on (``hooks``) or off (None)."""
    global _hooks
    _hooks = hooks


def callbacks() -> list[BaseCallbackHandler]:
    """The handlers for a run starting now: none when tracing is off or this turn is not sampled;
    else the span handler nesting under the current span, and the extra ones."""
    hooks = _hooks
    if hooks is None:
        return []
    from agent.trace_spans import handlers_for

    return handlers_for(hooks)
