"""Local HTTP endpoint: /healthz (the process lives), /readyz (each channel's state), /metrics."""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from channels.base import ChannelState

from .metrics import Metrics


def build_app(daemon: object, metrics: Metrics) -> web.Application:
    """``daemon`` provides ``channel_report()`` → dict and ``ready()`` → bool."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        report = daemon.channel_report()  # type: ignore[attr-defined]
        ready = daemon.ready()  # type: ignore[attr-defined]
        return web.json_response({"ready": ready, "channels": report}, status=200 if ready else 503)

    async def metrics_view(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
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
