"""Tracing's parts without a daemon (docs/tracing.md): off costs nothing and imports nothing, the
config treats export headers as secrets, a journaled trace context that is garbage starts a fresh
trace, an error's words are masked on a span, and a failing collector is logged once per outage.
The end-to-end behaviour is tests/test_e2e_tracing.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from agent import tracing as agent_tracing
from agent.redact import Redactor
from channels.base import Inbound
from gateway.config.schema import Config
from gateway.config.secrets import daemon_secrets
from gateway.ops import tracing
from gateway.ops.trace_export import QuietExporter, _LastWords, where
from gateway.ops.trace_live import TRACEPARENT, Live
from gateway.store.entries import JournalEntry, JournalKind
from tests.fresh_python import run_python

SECRET = "s3cr3t-value-of-the-daemon-42"


def inbound(text: str = "hi", **extra: object) -> Inbound:
    return Inbound(platform="telegram", chat_id="1", message_id="7", sender_id="1", text=text,
                   is_direct=True, addressed=True, extra=dict(extra))  # fmt: skip


@pytest.fixture
def live() -> Iterator[tuple[Live, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    made = Live(provider.get_tracer("test"), Redactor([SECRET]))
    tracing.install(made)
    try:
        yield made, exporter
    finally:
        tracing.install(None)


def test_off_is_one_shared_null_context_and_no_agent_handler() -> None:
    assert not tracing.active()
    assert tracing.message(inbound()) is tracing.turn(JournalEntry.new(inbound(), JournalKind.TURN))
    assert tracing.platform_call(True) is tracing.journal_write(inbound())
    assert tracing.status_lines("telegram:1") == []
    assert agent_tracing.callbacks() == []


def test_off_imports_no_sdk_exporter_or_langfuse() -> None:
    """The daemon's modules with tracing off (imported as `chital run` imports them, lean imports
    installed) run nothing of OpenTelemetry's SDK, its exporter or Langfuse: LangSmith's client
    binds the SDK's TracerProvider at import, which compat/lean_imports.py defers."""
    out = run_python(
        """
        import sys
        from compat.lean_imports import install
        install()
        import gateway.daemon.app, gateway.daemon.gateway, agent.harness, agent.stream_events, langsmith.client
        shells = {"opentelemetry.sdk", "opentelemetry.sdk.trace"}  # created, their bodies not run
        print([m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter", "langfuse"))
               and m not in shells])
        """,
        timeout=120,
    )
    assert out == "[]"


def test_headers_are_secrets_and_the_endpoint_must_be_http() -> None:
    cfg = Config.model_validate(
        {"tracing": {"enabled": True, "headers": {"Authorization": f"Bearer {SECRET}"}}}
    )
    assert f"Bearer {SECRET}" in daemon_secrets(cfg)
    assert SECRET not in repr(cfg.tracing)
    with pytest.raises(ValidationError, match="http"):
        Config.model_validate({"tracing": {"otlp_endpoint": "grpc://collector:4317"}})
    assert where(f"https://user:{SECRET}@collector.example:4318/v1/traces") == "collector.example:4318"


def test_a_garbage_traceparent_starts_a_fresh_trace(live: tuple[Live, InMemorySpanExporter]) -> None:
    _, exporter = live
    entry = JournalEntry.new(inbound(**{TRACEPARENT: "00-zz-not-a-context-01"}), JournalKind.TURN)
    with tracing.turn(entry):
        pass
    (turn,) = exporter.get_finished_spans()
    assert turn.name == "chital.turn" and turn.parent is None
    assert turn.attributes is not None and turn.attributes["chital.turn.resumed"] is False


def test_a_resumed_turn_joins_the_journaled_trace(live: tuple[Live, InMemorySpanExporter]) -> None:
    _, exporter = live
    message = inbound()
    with tracing.message(message), tracing.journal_write(message):
        pass
    assert TRACEPARENT in message.extra  # what the journal stores with the message
    root = next(s for s in exporter.get_finished_spans() if s.name == "chital.message")
    # After a restart the waiting map is empty: the journaled stamp is what joins the trace.
    resumed = JournalEntry.new(inbound(**{TRACEPARENT: message.extra[TRACEPARENT]}), JournalKind.TURN)
    resumed.key = "other-key"  # not in this process's map
    with tracing.turn(resumed):
        tracing.outcome("ok")
    turn = next(s for s in exporter.get_finished_spans() if s.name == "chital.turn")
    assert turn.context is not None and root.context is not None
    assert turn.context.trace_id == root.context.trace_id and turn.parent is not None
    assert turn.parent.span_id == root.context.span_id
    assert tracing.status_lines(resumed.conversation) == [f"Trace: {root.context.trace_id:032x}"]


def test_an_error_on_a_span_is_masked(live: tuple[Live, InMemorySpanExporter]) -> None:
    _, exporter = live
    with pytest.raises(RuntimeError), tracing.message(inbound()), tracing.platform_call(True):
        raise RuntimeError(f"the platform said: token {SECRET} is wrong")
    spans = exporter.get_finished_spans()
    assert {s.name for s in spans} == {"chital.message", "chital.delivery.send"}
    for span in spans:
        assert SECRET not in str(span.status.description) and not span.events
        assert span.attributes is not None and span.attributes["error.type"] == "RuntimeError"


class Flaky(SpanExporter):
    """A collector's exporter that fails while ``down``, saying why as OpenTelemetry's does."""

    def __init__(self) -> None:
        self.down = True

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.down:
            logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter").error(
                "Failed to export span batch code: 401, reason: bad header Bearer %s", SECRET
            )
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


def test_a_failing_collector_is_logged_once_per_outage(caplog: pytest.LogCaptureFixture) -> None:
    words = _LastWords()
    otel = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    otel.addFilter(words)
    try:
        inner = Flaky()
        quiet = QuietExporter(inner, "collector:4318", Redactor([SECRET]), words)
        with caplog.at_level(logging.INFO):
            for _ in range(5):
                assert quiet.export([]) is SpanExportResult.FAILURE
            inner.down = False
            quiet.export([])
            inner.down = True
            quiet.export([])
    finally:
        otel.removeFilter(words)
    ours = [r.getMessage() for r in caplog.records if r.name == "gateway.ops.tracing"]
    assert len([m for m in ours if "could not export" in m]) == 2, ours  # two outages, one line each
    assert len([m for m in ours if "again" in m]) == 1
    assert all(SECRET not in m for m in ours) and "401" in ours[0]
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")], (
        "its per-retry lines held back"
    )


async def test_a_retried_send_is_one_span_with_a_retry_event(live: tuple[Live, InMemorySpanExporter]) -> None:
    """The pacer's retries (a 429, a 5xx) are events on the send's span, their words masked."""
    from channels.base import Capabilities, RetryAfter, TransientSendError
    from gateway.delivery.pacing import ChatPacer

    _, exporter = live
    failures: list[Exception] = [
        RetryAfter(0.01),
        TransientSendError(f"HTTP 502 from https://x/bot{SECRET}/send"),
    ]

    async def send() -> str:
        if failures:
            raise failures.pop(0)
        return "m1"

    pacer = ChatPacer(Capabilities(max_message_len=4096, edit_interval=1.0))
    with tracing.message(inbound()):
        assert await pacer.call(send, is_send=True) == "m1"
    assert await pacer.call(send, is_send=False) == "m1"  # outside a message's trace: no span
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"chital.message", "chital.delivery.send"}
    events = spans["chital.delivery.send"].events
    assert [e.name for e in events] == ["retry", "retry"]
    reasons = [str((e.attributes or {})["chital.retry.reason"]) for e in events]
    assert reasons[0] == "rate limited" and "502" in reasons[1] and SECRET not in reasons[1]
