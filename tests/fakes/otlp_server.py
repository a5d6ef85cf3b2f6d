"""A fake OTLP/HTTP trace receiver (aiohttp on 127.0.0.1, free port), and Langfuse's ingestion
endpoint with it: Langfuse v3+ exports OpenTelemetry spans to ``/api/public/otel/v1/traces``.

Bodies are parsed with ``opentelemetry-proto`` (``ExportTraceServiceRequest``, gzip or not), as a
collector would; the raw bytes are kept too, so a test can search them for a secret in any field.

    async with FakeOTLP() as otlp:
        cfg["tracing"] = {"enabled": True, "otlp_endpoint": otlp.traces_url}
        ...
        spans = otlp.spans()          # every span received, flat
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

LANGFUSE_PATH = "/api/public/otel/v1/traces"


@dataclass
class Span:
    """One received span, with ids as hex and attributes as plain values."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int
    status_message: str
    scope: str
    path: str
    """Which endpoint received it (``/v1/traces`` or Langfuse's)."""


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    """Decompressed protobuf bytes."""
    spans: list[Span] = field(default_factory=list)


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


class FakeOTLP:
    """Takes OTLP/HTTP protobuf trace exports; ``status`` != 200 refuses them (an outage)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.other: list[tuple[str, str]] = []
        """(method, path) of requests to other paths (Langfuse's API calls)."""
        self.status = 200
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def traces_url(self) -> str:
        return f"{self.base_url}/v1/traces"

    async def start(self) -> FakeOTLP:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/traces", self._traces)
        app.router.add_post(LANGFUSE_PATH, self._traces)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> FakeOTLP:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _other(self, request: web.Request) -> web.Response:
        self.other.append((request.method, request.path))
        return web.json_response({})

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if body[:2] == b"\x1f\x8b":  # gzip that aiohttp left compressed
            body = gzip.decompress(body)
        got = Received(request.path, dict(request.headers), body)
        if self.status != 200:
            self.received.append(got)
            return web.Response(status=self.status)
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.spans.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            events=[
                                (e.name, {a.key: _value(a.value) for a in e.attributes}) for e in s.events
                            ],
                            status_code=s.status.code,
                            status_message=s.status.message,
                            scope=ss.scope.name,
                            path=request.path,
                        )
                    )
        self.received.append(got)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def spans(self, path: str = "/v1/traces") -> list[Span]:
        return [s for r in self.received if r.path == path for s in r.spans]

    def raw(self) -> bytes:
        """Every body received (headers apart), for searching."""
        return b"\n".join(r.body for r in self.received)
