"""What a console request carries: the app keys of the daemon's view and of the gate, and the
session the gate found (apart from gateway/console/app.py, which imports the pages and actions)."""

from __future__ import annotations

from aiohttp import web

from gateway.console import ConsoleHost
from gateway.console.auth import Guard, Session

HOST_KEY: web.AppKey[ConsoleHost] = web.AppKey("console_host", ConsoleHost)
GUARD_KEY: web.AppKey[Guard] = web.AppKey("console_guard", Guard)
SESSION = "console_session"


def session_of(request: web.Request) -> Session:
    """The request's session (the gate let it through, so there is one)."""
    session = request.get(SESSION)
    assert isinstance(session, Session)
    return session
