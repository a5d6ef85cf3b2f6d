"""An HTTP route a channel serves on the daemon's hooks listener (WhatsApp's webhook).

Why this shape: most platforms are reached by an outbound connection, but a few deliver only by
calling an HTTPS endpoint of ours (Meta's WhatsApp Cloud API). The daemon already has one listener
that takes deliveries from the internet, the hooks listener (gateway/turns/hooks.py, docs/hooks.md);
a channel declares its routes here and the gateway mounts them there under
``/channels/<channel name><path>``. The channel never imports the gateway (imports point gateway ->
channels): it gets the ``aiohttp`` request and answers it, and what it hands on goes through the
same :data:`channels.base.InboundSink` as every other inbound message (journaled before the answer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web


@dataclass(frozen=True, slots=True)
class WebRoute:
    method: str
    """``GET`` or ``POST``."""
    path: str
    """Below ``/channels/<channel name>``; starts with ``/``."""
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]


def mount_path(channel: str, route: WebRoute) -> str:
    """Where the gateway serves ``route`` of ``channel`` (one place, so docs and tests agree)."""
    return f"/channels/{channel}{route.path}"
