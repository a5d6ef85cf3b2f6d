"""Local HTTP endpoint: /healthz (the process lives), /readyz (whether it can answer users, and why
not: the agent, the storage, each channel), /metrics.

/healthz stays 200 while the process runs (a container HEALTHCHECK restarts only a dead or hung
process); /readyz is what an operator or an alert looks at: 503 with the reasons in ``why``.
"""

from __future__ import annotations

import time
from typing import Protocol

from aiohttp import web

from agent.redact import Redactor
from channels.base import ChannelState
from gateway.ops.metrics import Metrics


class Observable(Protocol):
    """What the endpoint asks of the daemon."""

    def readiness(self) -> dict[str, object]:
        """``{"ready": bool, "why": [str], "agent": ..., "storage": ..., "channels": ...}``."""
        ...


def build_app(daemon: Observable, metrics: Metrics, redact: Redactor | None = None) -> web.Application:
    """``redact`` masks the daemon's secrets in both documents (gateway/config/secrets.py): a channel's
    reason quotes its SDK's error, a metric's label a name from the config."""
    mask = redact or Redactor()

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        body = mask.deep(daemon.readiness())
        return web.json_response(body, status=200 if body.get("ready") else 503)

    async def metrics_view(_: web.Request) -> web.Response:
        # Imported on the first scrape: it brings wsgiref and http.server along (gateway/ops/metrics.py).
        from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

        body = mask(generate_latest(metrics.registry).decode()).encode()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def index(_: web.Request) -> web.Response:
        # The start-up summary prints this URL: it must answer, and say where to look.
        return web.Response(
            text="chital\n/healthz  the process lives\n/readyz   can it answer users, and why not\n"
            "/metrics  Prometheus metrics\n"
        )

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_view)
    return app


def describe_state(state: ChannelState, reason: str | None, since: float) -> dict[str, object]:
    return {
        "state": state.value,
        "reason": reason,
        "since": round(since, 3),
        "for_s": round(time.time() - since, 1),
    }
