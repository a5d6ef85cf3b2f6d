"""The daemon's HTTP listeners, each opened as one step of its start-up (gateway/daemon/app.py): the
endpoint with ``/healthz``, ``/readyz``, ``/metrics`` and the operator console (docs/console.md),
and the hooks' own endpoint (docs/hooks.md). Each registers its release as it is acquired."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiohttp import web

from channels.webroute import mount_path
from gateway.config.secrets import redactor_for
from gateway.daemon.console_host import with_console
from gateway.daemon.lifecycle import Resources, listen_error
from gateway.ops.http import build_app

if TYPE_CHECKING:
    from gateway.daemon.app import Daemon

log = logging.getLogger(__name__)


async def start_http(daemon: Daemon, resources: Resources) -> tuple[web.AppRunner, int]:
    """The endpoint's runner and the port it is bound to."""
    config = daemon.config
    host, port = config.http.host, config.http.port
    app = with_console(build_app(daemon, daemon.metrics, redactor_for(config)), daemon)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    resources.push("the HTTP endpoint", runner.cleanup)
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        raise listen_error(host, port, exc) from None
    # The bound port (``port: 0`` picks one): the runner's public list of listening addresses.
    addresses = runner.addresses
    bound = int(addresses[0][1]) if addresses else config.http.port
    log.info("health and metrics on http://%s:%s/", config.http.host, bound)
    return runner, bound


async def start_hooks(daemon: Daemon, resources: Resources) -> int:
    """The port the hooks' endpoint is bound to."""
    from gateway.turns.hooks import Hooks, serve

    assert daemon.gateway is not None
    config = daemon.config
    host, port = config.hooks.host, config.hooks.port
    hooks = Hooks(daemon.gateway, config, daemon.metrics, redactor_for(config))
    try:
        runner, bound = await serve(hooks, host, port)
    except OSError as exc:
        raise listen_error(host, port, exc) from None
    resources.push("the hooks endpoint", runner.cleanup)
    log.info("hooks on http://%s:%s/hooks/<name> (%d hook(s))", host, bound, len(hooks.hooks))
    for sup in daemon.supervisors:
        for path in dict.fromkeys(mount_path(sup.channel.name, r) for r in sup.channel.web_routes()):
            log.info("%s webhook on http://%s:%s%s", sup.channel.name, host, bound, path)
    return bound
