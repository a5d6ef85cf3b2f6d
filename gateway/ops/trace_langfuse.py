"""Langfuse as a second exporter, through its LangChain integration (docs/tracing.md).

Langfuse (v3 and later) is built on OpenTelemetry. It gets a tracer provider of its own, so its
observations (one per LangChain run: chains, model calls, tools) go to Langfuse only and the OTLP
collector keeps Chital's compact tree; each turn's handler is given the turn span's trace id and
span id (``trace_context``), so both backends show the same trace id.

What Langfuse records passes through its ``mask`` hook: with ``record_content`` off every input,
output and metadata value is replaced by a placeholder; on, masked with the daemon's redactor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from agent.redact import Redactor
from gateway.config.schema import Config

NOT_RECORDED = "(not recorded: tracing.record_content is off)"


def masker(redact: Redactor, record_content: bool, chars: int) -> Callable[..., Any]:
    """Langfuse's ``mask(data=...)``: a placeholder, or the data with every secret masked."""

    def mask(*, data: Any, **_: Any) -> Any:
        if data is None:
            return None
        if not record_content:
            return NOT_RECORDED
        masked = redact.deep(data)
        return masked[:chars] if isinstance(masked, str) else masked

    return mask


def start_langfuse(
    cfg: Config, redact: Redactor
) -> tuple[Callable[[Any], Sequence[BaseCallbackHandler]], Callable[[], None]]:
    """The Langfuse client; returns the per-turn handlers' factory and the client's shutdown."""
    from langfuse import Langfuse

    t = cfg.tracing
    lf = t.langfuse
    assert lf.public_key is not None and lf.secret_key is not None  # lf.configured
    public = lf.public_key.get_secret_value()
    provider = TracerProvider(resource=Resource.create({"service.name": t.service_name}))
    client = Langfuse(
        public_key=public,
        secret_key=lf.secret_key.get_secret_value(),
        host=lf.host,
        tracer_provider=provider,
        mask=masker(redact, t.record_content, t.content_chars),
        timeout=max(1, int(t.export_timeout)),
    )

    def handlers(span_context: Any) -> Sequence[BaseCallbackHandler]:
        from langfuse.langchain import CallbackHandler

        trace_context = {
            "trace_id": format(span_context.trace_id, "032x"),
            "parent_span_id": format(span_context.span_id, "016x"),
        }
        return [CallbackHandler(public_key=public, trace_context=trace_context)]  # type: ignore[arg-type]

    def close() -> None:
        client.shutdown()
        provider.shutdown()

    return handlers, close
