"""The operator console: pages over the daemon's state and the admin actions of the chat commands,
served at ``/console`` on the daemon's HTTP listener behind a login (docs/console.md).

A layer of its own between the daemon (which mounts it on its listener) and the commands (whose
functions its actions call: one implementation of each action). It sees the daemon only through a
:class:`ConsoleHost`, built by gateway/daemon/console_host.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.redact import Redactor
    from channels.web.channel import WebChannel
    from gateway.commands.registry import CommandContext
    from gateway.config.schema import Config
    from gateway.store.journal import Store


@dataclass(frozen=True, slots=True)
class ConsoleHost:
    """What the console uses of the daemon: narrow callables, read at each request (the listener
    starts before the database and the gateway, so each may still be None)."""

    config: Config
    redact: Redactor
    """The daemon's secret redactor (gateway/config/secrets.py): every page is masked by it."""
    store: Callable[[], Store | None]
    context: Callable[[], CommandContext | None]
    """The chat commands' context (``Gateway.command_context``); None until the gateway runs."""
    status: Callable[[], Awaitable[dict[str, Any]]]
    """``chital status``'s document (gateway/daemon/status.py ``snapshot``)."""
    summary: Callable[[], Awaitable[list[str]]]
    """The start-up summary's lines (gateway/daemon/summary.py)."""
    web: Callable[[], WebChannel | None] = lambda: None
    """The web chat's channel (channels/web/), once the daemon runs it."""
