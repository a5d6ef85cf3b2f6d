"""Where spans go (docs/tracing.md): OTLP over HTTP/protobuf, Langfuse beside it; set up when
``tracing.enabled``, imported only then.

An export never holds a turn: spans are queued (bounded, the oldest dropped when full) and sent in
batches by the SDK's worker thread. A collector that does not answer is logged once per outage,
with its host and port only (headers are secrets, a URL may carry credentials), and once more when
exports work again; OpenTelemetry's own exporter logging (a warning per retry) is held back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from agent import tracing as agent_tracing
from gateway.config.schema import Config
from gateway.config.secrets import redactor_for
from gateway.ops import tracing
from gateway.ops.trace_live import Live

log = logging.getLogger("gateway.ops.tracing")

OTEL_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.sdk.trace.export")
"""Loggers that say the same export failure at every retry: their words are kept for our one line."""
CLOSE_WAIT = 3.0
"""Seconds the last flush may take at shutdown (a dead collector must not hold the daemon's stop)."""


class _LastWords(logging.Filter):
    """Keeps OpenTelemetry's export-failure messages for :class:`QuietExporter` instead of logging them."""

    def __init__(self) -> None:
        super().__init__()
        self.last = ""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self.last = record.getMessage()
        except Exception:
            self.last = str(record.msg)
        return False


class QuietExporter(SpanExporter):
    """Wraps an exporter: one log line when exports start failing, one when they work again."""

    def __init__(
        self, inner: SpanExporter, where: str, redact: Callable[[str], str], words: _LastWords
    ) -> None:
        self._inner, self._where, self._redact, self._words = inner, where, redact, words
        self._failing = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception as exc:  # never into the SDK's worker: it would log a traceback per batch
            self._words.last = f"{type(exc).__name__}: {exc}"
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            if self._failing:
                log.info("tracing: spans reach %s again", self._where)
            self._failing = False
        elif not self._failing:
            self._failing = True
            why = self._redact(self._words.last or "no answer")[:300]
            log.warning(
                "tracing: could not export spans to %s (%s); spans are dropped until it answers, "
                "turns go on (logged once per outage)",
                self._where,
                why,
            )
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def where(url: str) -> str:
    """``host:port`` of ``url``: what a log line may show of an endpoint."""
    try:
        parts = urlsplit(url)
        return f"{parts.hostname or '?'}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    except ValueError:
        return "(unparsable endpoint)"


def _provider(cfg: Config) -> TracerProvider:
    t = cfg.tracing
    resource = Resource.create({"service.name": t.service_name})
    return TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(t.sample_ratio)))


async def start_exporters(cfg: Config) -> Callable[[], Awaitable[None]]:
    """Build the provider and its exporters, install the gateway's and the agent's halves;
    returns the close that uninstalls them and flushes (bounded by :data:`CLOSE_WAIT`)."""
    t = cfg.tracing
    redact = redactor_for(cfg)
    words = _LastWords()
    for name in OTEL_LOGGERS:
        logging.getLogger(name).addFilter(words)
    provider = _provider(cfg)
    if t.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        headers = {k: v.get_secret_value() for k, v in t.headers.items()}
        inner = OTLPSpanExporter(endpoint=t.otlp_endpoint, headers=headers, timeout=t.export_timeout)
        exporter = QuietExporter(inner, where(t.otlp_endpoint), redact, words)
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=4096))
    closers: list[Callable[[], Any]] = [provider.shutdown]
    extra = None
    if t.langfuse.configured:
        from gateway.ops.trace_langfuse import start_langfuse

        handlers, close_langfuse = start_langfuse(cfg, redact)
        extra = handlers
        closers.append(close_langfuse)
    tracing.install(Live(provider.get_tracer("chital.gateway"), redact))
    agent_tracing.install(
        agent_tracing.TraceHooks(
            tracer=provider.get_tracer("chital.agent"),
            redact=redact,
            record_content=t.record_content,
            content_chars=t.content_chars,
            extra=extra,
        )
    )
    log.info(
        "tracing on: OTLP %s, Langfuse %s, sampling %g, prompts and completions %s",
        where(t.otlp_endpoint) if t.otlp_endpoint else "off",
        where(t.langfuse.host) if t.langfuse.configured else "off",
        t.sample_ratio,
        "recorded (masked)" if t.record_content else "not recorded",
    )

    async def close() -> None:
        tracing.install(None)
        agent_tracing.install(None)
        for closer in closers:
            try:
                async with asyncio.timeout(CLOSE_WAIT):
                    await asyncio.to_thread(closer)
            except TimeoutError:
                log.warning("tracing: the last spans could not be flushed within %.0fs", CLOSE_WAIT)
            except Exception as exc:
                log.warning("tracing: closing an exporter failed: %s", redact(str(exc))[:300])

    return close
