"""Reaches into ``aiohttp``: ``TCPConnector._create_connection`` overridden.

Why (agent/tools/web_guard.py): it is the hook ``BaseConnector.connect`` calls for every new
connection, with the request, before the connection is handed to it. web_fetch's address guard
uses it to refuse proxied requests, to tell its socket check which host name a connection is for
(``allow_hosts`` name entries) and to check the connected peer's address again (belt and braces
behind the public ``socket_factory``).

Public fallback (outside :data:`compat.versions.VERIFIED`'s ``aiohttp`` set):
:class:`CheckedConnector` does not override it, so :meth:`CheckedConnector.checked_connection` is
never called: the guard is the public ``socket_factory`` check alone, which sees no host name (an
``allow_hosts`` name entry then opens nothing: deny by default).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

from compat.versions import usable

DISTRIBUTION = "aiohttp"

Connect = Callable[[], Awaitable[ResponseHandler]]


class CheckedConnector(aiohttp.TCPConnector):
    """A ``TCPConnector`` that runs :meth:`checked_connection` around each connection it makes
    (on the verified releases; see the module docstring)."""

    hooked = usable(DISTRIBUTION)
    """Whether :meth:`checked_connection` is called."""

    async def checked_connection(self, req: Any, connect: Connect) -> ResponseHandler:
        """Make the connection for ``req`` by awaiting ``connect()``; a subclass checks around it."""
        return await connect()


async def _create_connection(self: CheckedConnector, req: Any, *args: Any, **kwargs: Any) -> ResponseHandler:
    parent = super(CheckedConnector, self)._create_connection
    return await self.checked_connection(req, lambda: parent(req, *args, **kwargs))


if CheckedConnector.hooked:
    setattr(CheckedConnector, "_create_connection", _create_connection)  # noqa: B010
