"""The gateway's spans while tracing is on (gateway/ops/tracing.py is the switch; docs/tracing.md).

No secret reaches a span: attributes are ids, names, counts and outcomes; an error's words are
masked with the daemon's redactor; OpenTelemetry's own exception recording (a traceback, an
exception's message as the span status) is switched off on every span made here.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from channels.base import Inbound
from gateway.store.entries import JournalEntry

TRACEPARENT = "traceparent"
"""Key in a journaled message's ``extra``: the W3C trace context of its ``chital.message`` span."""
KEEP = 10_000
"""Messages waiting for their turn, and conversations' last trace ids, held at once (oldest go)."""
_PROPAGATOR = TraceContextTextMapPropagator()


class Live:
    """Spans of the gateway: made with ``tracer``, texts masked with ``redact``."""

    def __init__(self, tracer: trace.Tracer, redact: Callable[[str], str]) -> None:
        self.tracer = tracer
        self.redact = redact
        self._waiting: OrderedDict[str, tuple[otel_context.Context, int]] = OrderedDict()
        """Journal key → the message's context and when it was journaled (its queue wait's start)."""
        self._last: OrderedDict[str, str] = OrderedDict()
        """Conversation → its last turn's trace id (``/status``)."""

    def _error(self, span: trace.Span, exc: BaseException) -> None:
        kind = type(exc).__name__
        span.set_attribute("error.type", kind)
        span.set_status(trace.Status(trace.StatusCode.ERROR, self.redact(f"{kind}: {exc}")[:500]))

    @contextlib.contextmanager
    def _current(self, span: trace.Span) -> Iterator[trace.Span]:
        """``span`` current for the block and ended after it; an exception marks it failed with
        masked words (never OpenTelemetry's own recording: its message and traceback unmasked)."""
        with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            try:
                yield span
            except Exception as exc:
                self._error(span, exc)
                raise

    # -- intake -----------------------------------------------------------------------------------
    def message(self, inbound: Inbound) -> contextlib.AbstractContextManager[trace.Span]:
        attrs: dict[str, Any] = {
            "chital.platform": inbound.platform,
            "chital.message.key": inbound.key,
            "chital.direct": inbound.is_direct,
        }
        span = self.tracer.start_span("chital.message", kind=trace.SpanKind.CONSUMER, attributes=attrs)
        return self._current(span)

    @contextlib.contextmanager
    def journal_write(self, inbound: Inbound) -> Iterator[None]:
        current = trace.get_current_span()
        if current.is_recording():
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier)
            if TRACEPARENT in carrier:
                inbound.extra[TRACEPARENT] = carrier[TRACEPARENT]
            self._waiting[inbound.key] = (otel_context.get_current(), time.time_ns())
            if len(self._waiting) > KEEP:
                self._waiting.popitem(last=False)
        with self._current(self.tracer.start_span("chital.journal.write")):
            yield

    @contextlib.contextmanager
    def detached(self) -> Iterator[None]:
        token = otel_context.attach(otel_context.Context())
        try:
            yield
        finally:
            otel_context.detach(token)

    # -- the turn ---------------------------------------------------------------------------------
    def _parent(self, entry: JournalEntry) -> tuple[otel_context.Context, int | None]:
        waiting = self._waiting.pop(entry.key, None)
        if waiting is not None:
            return waiting
        stamp = entry.inbound.extra.get(TRACEPARENT)
        if isinstance(stamp, str):  # resumed: after a restart, an approval, a parked delivery
            return _PROPAGATOR.extract({TRACEPARENT: stamp}, context=otel_context.Context()), None
        return otel_context.Context(), None  # journaled untraced (a schedule, `chital send`)

    @contextlib.contextmanager
    def turn(self, entry: JournalEntry) -> Iterator[None]:
        parent, since = self._parent(entry)
        if since is not None:
            wait = self.tracer.start_span("chital.queue.wait", context=parent, start_time=since)
            wait.end()
        attrs: dict[str, Any] = {
            "chital.platform": entry.inbound.platform,
            "chital.message.key": entry.key,
            "chital.turn.attempt": entry.attempts + 1,
            "chital.turn.resumed": entry.from_journal,  # a restart, an approval, a parked reply
        }
        span = self.tracer.start_span("chital.turn", context=parent, attributes=attrs)
        if span.is_recording():
            self._last[entry.conversation] = format(span.get_span_context().trace_id, "032x")
            self._last.move_to_end(entry.conversation)
            if len(self._last) > KEEP:
                self._last.popitem(last=False)
        with self._current(span):
            yield

    def outcome(self, value: str) -> None:
        span = trace.get_current_span()
        span.set_attribute("chital.turn.outcome", str(value))
        if str(value) == "error":
            span.set_status(trace.Status(trace.StatusCode.ERROR, "the turn failed"))

    def last_trace(self, conversation: str) -> str | None:
        return self._last.get(conversation)

    def current_id(self) -> str | None:
        found = trace.get_current_span().get_span_context()
        return format(found.trace_id, "032x") if found.is_valid else None

    # -- delivery ---------------------------------------------------------------------------------
    def platform_call(self, is_send: bool) -> contextlib.AbstractContextManager[Any]:
        if not trace.get_current_span().get_span_context().is_valid:
            return contextlib.nullcontext()  # outside any message's trace: no orphan trace per call
        name = "chital.delivery.send" if is_send else "chital.delivery.edit"
        return self._current(self.tracer.start_span(name, kind=trace.SpanKind.CLIENT))

    def retry(self, reason: str, delay: float) -> None:
        attrs: dict[str, Any] = {
            "chital.retry.reason": self.redact(reason)[:300],
            "chital.retry.delay_s": round(delay, 3),
        }
        trace.get_current_span().add_event("retry", attrs)


class TraceFormatter(logging.Formatter):
    """Log lines written within a traced message end with `` trace_id=<32 hex>``: the id to
    look the trace up by."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        found = trace.get_current_span().get_span_context()
        if found.is_valid:
            return f"{line} trace_id={found.trace_id:032x}"
        return line
