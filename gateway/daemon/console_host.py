"""The console's view of the daemon (gateway/console/): narrow callables over its parts, read at each
request, so the console never holds the Daemon itself."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.config.secrets import redactor_for
from gateway.daemon.status import snapshot
from gateway.daemon.summary import summary

if TYPE_CHECKING:
    from channels.web.channel import WebChannel
    from gateway.console import ConsoleHost
    from gateway.daemon.app import Daemon

log = logging.getLogger(__name__)


def with_console(app: web.Application, daemon: Daemon) -> web.Application:
    """``app`` (the daemon's HTTP listener) with the console mounted at ``/console`` when an admin
    token is set (docs/console.md); unchanged when not. Without one nothing of the console is
    imported: Jinja2 and the templates cost an idle daemon memory it would never use."""
    if daemon.config.console.admin_token() is None:
        return app
    from gateway.console.app import mount

    if mount(app, console_host(daemon)):
        log.info("operator console at /console/ on the HTTP listener (docs/console.md)")
    return app


def console_host(daemon: Daemon) -> ConsoleHost:
    from gateway.console import ConsoleHost

    async def status() -> dict[str, Any]:
        return await snapshot(daemon, daemon.recent_errors)

    async def startup() -> list[str]:
        if daemon.started is None:
            return ["(the daemon is still starting)"]
        return [text for _, text in await summary(daemon)]

    return ConsoleHost(
        config=daemon.config,
        redact=redactor_for(daemon.config),
        store=lambda: daemon.store,
        context=lambda: daemon.gateway.command_context() if daemon.gateway is not None else None,
        status=status,
        summary=startup,
        web=lambda: web_channel(daemon),
    )


def web_channel(daemon: Daemon) -> WebChannel | None:
    """The web chat's channel, once the daemon built it (None while starting, or when it is off)."""
    from channels.web.channel import WebChannel

    for sup in daemon.supervisors:
        if isinstance(sup.channel, WebChannel):
            return sup.channel
    return None
