"""OpenTelemetry spans from LangChain's callbacks: each model call, tool call and sub-agent of a
traced turn (agent/tracing.py says when this runs; docs/tracing.md shows the tree).

Names and attributes follow OpenTelemetry's GenAI semantic conventions: ``chat {model}`` spans with
``gen_ai.usage.input_tokens`` / ``gen_ai.usage.output_tokens``, ``execute_tool {name}``, and
``invoke_agent {name}`` for a sub-agent (the run a ``task`` tool call starts). Texts (prompts,
completions, tool arguments and results) are recorded only with ``record_content``, and then
masked with the daemon's redactor and cut; error messages are always masked.

Parents come from the run ids LangChain gives every callback, not from the ambient context: a
callback may run in another task or thread than its run, and the graph's own chains (nodes,
middleware) get no span but are remembered, so a model call inside a sub-agent finds the
sub-agent's span through them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from opentelemetry import context as otel_context
from opentelemetry import trace

from agent.tracing import TraceHooks

SUBAGENT_TOOL = "task"
"""The tool whose run is a sub-agent (deepagents' ``SubAgentMiddleware``, agent/subagents.py)."""


def handlers_for(hooks: TraceHooks) -> list[BaseCallbackHandler]:
    """A span handler for a run under the current span, if that span is recorded (a sampled
    turn); the hooks' extra handlers with it."""
    span = trace.get_current_span()
    if not span.is_recording():
        return []
    found: list[BaseCallbackHandler] = [SpanHandler(hooks, otel_context.get_current())]
    if hooks.extra is not None:
        found += hooks.extra(span.get_span_context())
    return found


class SpanHandler(BaseCallbackHandler):
    """One turn's spans, by LangChain run id. Called inline (no thread hop)."""

    run_inline = True
    raise_error = False

    def __init__(self, hooks: TraceHooks, parent: otel_context.Context) -> None:
        self._hooks = hooks
        self._tracer = hooks.tracer
        self._root = parent
        self._spans: dict[UUID, trace.Span] = {}
        self._up: dict[UUID, UUID | None] = {}
        """Runs without a span of their own (chains): their parent, to find a spanned ancestor."""
        self._subagents: dict[UUID, str] = {}
        """``task`` tool runs not yet given their ``invoke_agent`` span: the sub-agent's kind."""

    # -- helpers --------------------------------------------------------------------------------
    def _context(self, parent: UUID | None) -> otel_context.Context:
        seen = 0
        while parent is not None and seen < 10_000:
            span = self._spans.get(parent)
            if span is not None:
                return trace.set_span_in_context(span, self._root)
            parent = self._up.get(parent)
            seen += 1
        return self._root

    def _start(
        self, run_id: UUID, parent: UUID | None, name: str, kind: trace.SpanKind, attrs: dict[str, Any]
    ) -> trace.Span:
        span = self._tracer.start_span(name, context=self._context(parent), kind=kind, attributes=attrs)
        self._spans[run_id] = span
        return span

    def _text(self, value: Any, *, tail: bool = False) -> str:
        """``value`` as text, masked, then cut to ``content_chars`` (its end kept with ``tail``: a
        prompt's newest message is the one worth reading, its system prompt the same every time)."""
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        text, most = self._hooks.redact(text), self._hooks.content_chars
        if len(text) <= most:
            return text
        return "…" + text[-most:] if tail else text[:most] + "…"

    def _fail(self, run_id: UUID, error: BaseException) -> None:
        span = self._spans.pop(run_id, None)
        if span is None:
            return
        kind = type(error).__name__
        span.set_attribute("error.type", kind)
        message = self._hooks.redact(f"{kind}: {error}")[:500]
        span.set_status(trace.Status(trace.StatusCode.ERROR, message))
        span.end()

    def _end(self, run_id: UUID) -> None:
        span = self._spans.pop(run_id, None)
        if span is not None:
            span.end()

    # -- chains: remembered for their children; a sub-agent's gets its span ---------------------
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        kind = self._subagents.pop(parent_run_id, None) if parent_run_id is not None else None
        if kind is None:
            self._up[run_id] = parent_run_id
            return
        attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": kind}
        self._start(run_id, parent_run_id, f"invoke_agent {kind}", trace.SpanKind.INTERNAL, attrs)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._up.pop(run_id, None)
        self._end(run_id)
        if kwargs.get("parent_run_id") is None:
            self._close_all()

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._up.pop(run_id, None)
        self._fail(run_id, error)
        if kwargs.get("parent_run_id") is None:
            self._close_all(error)

    def _close_all(self, error: BaseException | None = None) -> None:
        """The graph's own run ended (or was cancelled): any span still open ends with it, so
        none is held or lost."""
        for run_id in list(self._spans):
            if error is None:
                self._end(run_id)
            else:
                self._fail(run_id, error)
        self._up.clear()
        self._subagents.clear()

    # -- model calls ----------------------------------------------------------------------------
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        params = kwargs.get("invocation_params") or {}
        meta = metadata or {}
        model = str(params.get("model") or params.get("model_name") or meta.get("ls_model_name") or "model")
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
        provider = meta.get("ls_provider")
        if provider:
            attrs["gen_ai.provider.name"] = str(provider)
        if self._hooks.record_content:
            batch = messages[0] if messages else []
            attrs["gen_ai.input.messages"] = self._text([_message(m) for m in batch], tail=True)
        self._start(run_id, parent_run_id, f"chat {model}", trace.SpanKind.CLIENT, attrs)

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self.on_chat_model_start(serialized, [], run_id=run_id, parent_run_id=parent_run_id, **kwargs)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        span = self._spans.get(run_id)
        if span is None:
            return
        generation = response.generations[0][0] if response.generations and response.generations[0] else None
        usage = _usage(response, generation)
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage[0])
            span.set_attribute("gen_ai.usage.output_tokens", usage[1])
        if isinstance(generation, ChatGeneration):
            info = generation.message.response_metadata or {}
            if info.get("model_name"):
                span.set_attribute("gen_ai.response.model", str(info["model_name"]))
            if info.get("finish_reason"):
                span.set_attribute("gen_ai.response.finish_reasons", [str(info["finish_reason"])])
            if self._hooks.record_content:
                span.set_attribute("gen_ai.output.messages", self._text([_message(generation.message)]))
        self._end(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._fail(run_id, error)

    # -- tool calls (a ``task`` call's run is a sub-agent) ----------------------------------------
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = str(kwargs.get("name") or (serialized or {}).get("name") or "tool")
        attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        call_id = kwargs.get("tool_call_id")
        if call_id:
            attrs["gen_ai.tool.call.id"] = str(call_id)
        if self._hooks.record_content:
            attrs["gen_ai.tool.call.arguments"] = self._text(inputs if inputs is not None else input_str)
        self._start(run_id, parent_run_id, f"execute_tool {name}", trace.SpanKind.INTERNAL, attrs)
        if name == SUBAGENT_TOOL:
            kind = (inputs or {}).get("subagent_type") or "subagent"
            self._subagents[run_id] = str(kind)[:100]

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._subagents.pop(run_id, None)
        span = self._spans.get(run_id)
        if span is not None and self._hooks.record_content:
            content = getattr(output, "content", output)
            span.set_attribute("gen_ai.tool.call.result", self._text(content))
        self._end(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._subagents.pop(run_id, None)
        self._fail(run_id, error)


def _message(message: BaseMessage) -> dict[str, Any]:
    """A message as the GenAI conventions' ``{role, parts}`` shape, text only."""
    parts: list[dict[str, Any]] = []
    if message.text:
        parts.append({"type": "text", "content": message.text})
    for call in getattr(message, "tool_calls", None) or ():
        parts.append({"type": "tool_call", "name": call.get("name"), "arguments": call.get("args")})
    return {"role": message.type, "parts": parts}


def _usage(response: LLMResult, generation: Any) -> tuple[int, int] | None:
    """(input, output) tokens the endpoint reported, from the message or the provider's output."""
    meta = getattr(getattr(generation, "message", None), "usage_metadata", None)
    if meta:
        return int(meta.get("input_tokens", 0)), int(meta.get("output_tokens", 0))
    usage = (response.llm_output or {}).get("token_usage") or {}
    if usage:
        return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return None


__all__: Sequence[str] = ("SpanHandler", "handlers_for")
