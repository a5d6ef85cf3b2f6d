"""The ``tracing:`` section: OpenTelemetry spans of every message's life, exported over OTLP/HTTP,
and Langfuse as a second exporter (docs/tracing.md). Off by default: with tracing off no span object
is made and no exporter is imported (gateway/ops/tracing.py)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from gateway.config.sections import Strict


class LangfuseConfig(Strict):
    """Langfuse as a second exporter, through its LangChain integration (model, tool and
    sub-agent runs; the gateway's own spans go to ``otlp_endpoint``). Used only when all three
    are set."""

    host: str = ""
    """The Langfuse server, e.g. ``https://cloud.langfuse.com`` or your own; empty: no Langfuse."""
    public_key: SecretStr | None = None
    """The project's public key (``pk-lf-…``); write ``${LANGFUSE_PUBLIC_KEY}`` here."""
    secret_key: SecretStr | None = None
    """The project's secret key (``sk-lf-…``); write ``${LANGFUSE_SECRET_KEY}`` here, never the value."""

    @property
    def configured(self) -> bool:
        return bool(self.host and self.public_key and self.secret_key)


class TracingConfig(Strict):
    """OpenTelemetry traces of every turn (docs/tracing.md): one trace per inbound message with
    spans for intake, the journal write, the queue wait, the turn, each model call (token counts
    as ``gen_ai.usage.*``), each tool call, each sub-agent and each delivery call."""

    enabled: bool = False
    """Make spans at all. Off: no span objects, no exporter, nothing imported (the cost of a
    message is today's)."""
    otlp_endpoint: str = ""
    """OTLP over HTTP/protobuf, the full traces URL (``http://collector:4318/v1/traces``). Empty
    with ``enabled``: spans are made (trace ids in logs and ``/status``) but exported nowhere
    unless Langfuse is configured."""
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    """Headers sent with every export (``Authorization: ${OTLP_AUTH}``). Their values are secrets:
    masked in logs, never in a span."""
    service_name: str = Field("chital", min_length=1, max_length=200)
    """``service.name`` of the exported resource."""
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
    """Share of messages traced (parent-based ratio sampling on the trace id): 1.0 every message,
    0.1 one in ten. Unsampled messages cost one branch."""
    record_content: bool = False
    """Record prompts, completions, tool arguments and results in spans. Off by default; on, each
    text is masked with the daemon's secret redactor (every configured secret, by value) and cut
    at ``content_chars``."""
    content_chars: int = Field(4000, ge=100, le=100_000)
    """Longest recorded text per attribute (with ``record_content``)."""
    export_timeout: float = Field(10.0, gt=0, le=120)
    """Seconds one export may take; a collector that does not answer never holds a turn (spans
    are exported in the background, in batches)."""
    langfuse: LangfuseConfig = Field(default_factory=LangfuseConfig)
    """Langfuse as a second exporter (its LangChain callback handler)."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, value: str) -> str:
        value = value.strip()
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("otlp_endpoint must be an http:// or https:// URL (OTLP over HTTP/protobuf)")
        return value
