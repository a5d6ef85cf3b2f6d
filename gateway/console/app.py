"""The console's aiohttp sub-application: the gate every request passes (session, origin, CSRF,
security headers), the login and logout, and the static files by a fixed list of names.

Mounted at ``/console`` on the daemon's listener (:func:`mount`) only when an admin token is set:
without one there is no console at all, not a console with an empty password.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import aiohttp_jinja2
import jinja2
from aiohttp import web
from multidict import MultiDictProxy

from gateway.console import ConsoleHost, actions, chat, pages
from gateway.console.auth import PATH, SECURITY_HEADERS, Guard
from gateway.console.forms import FORM, FormLimits, form_of, read_form
from gateway.console.request import GUARD_KEY, HOST_KEY, SESSION, session_of
from gateway.console.text import one_line, shown

log = logging.getLogger(__name__)

PUBLIC_ROUTES = frozenset({"login", "login_post", "static"})
"""The only routes reachable without a session: the login page, its form and the static files."""
STATIC = {
    "htmx.min.js": "application/javascript",
    "console.css": "text/css",
    "chat.js": "application/javascript",
}
"""Every static file there is, by name: a request names one of these or gets 404. Nothing is ever
joined from the request to a path."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refuse(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", content_type="text/plain")


@web.middleware
async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Sessions before anything: a page without one redirects to the login, an action gets 401; a
    state-changing request from another origin or without the session's CSRF token gets 403."""
    try:
        response = await _gate(request, handler)
    except web.HTTPException as exc:
        if exc.status < 400 or not chat.wants_json(request):
            exc.headers.update(SECURITY_HEADERS)
            raise
        response = refuse(exc.status, (exc.text or exc.reason or "").strip())
    except Exception as exc:  # a database gone away: say so, specifically, not "Internal Server Error"
        log.error(
            "console: %s %s failed: %s: %s",
            request.method,
            where(request),
            type(exc).__name__,
            one_line(str(exc), redact=request.app[HOST_KEY].redact),
        )
        why = f"The console could not read the daemon's state ({type(exc).__name__}); see the daemon's log."
        response = refuse(500, why)
    if response.status >= 400 and isinstance(response, web.Response) and chat.wants_json(request):
        response = as_json(response)
    response.headers.update(SECURITY_HEADERS)
    return response


def as_json(response: web.Response) -> web.Response:
    """A refusal as the chat page's script reads its answers (``{"ok": false, "error": …}``): as
    text it was "That did not reach the daemon; send it again" for an expired session, a wrong
    CSRF token or a form too large, never what happened."""
    if response.content_type == "application/json":
        return response
    why = (response.text or response.reason or "").strip()
    return web.json_response({"ok": False, "error": why}, status=response.status)


def where(request: web.Request) -> str:
    """The request's path for a log line (decoded, so ``%0a`` is a newline: :func:`one_line`)."""
    return one_line(request.path, 200, request.app[HOST_KEY].redact)


async def _gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    guard = request.app[GUARD_KEY]
    route = request.match_info.route.name
    changing = request.method not in ("GET", "HEAD", "OPTIONS")
    if changing and not guard.origin_ok(request):
        log.warning(
            "console: %s %s refused: cross-origin or no Origin/Referer", request.method, where(request)
        )
        return refuse(403, "Refused: this request did not come from the console's own pages (Origin check).")
    if any("\x00" in k or "\x00" in v for k, v in request.query.items()):
        # No page takes one, and PostgreSQL's text refuses it (a search for one was a 500 there).
        return refuse(400, "Refused: the address holds a NUL character (%00); no console page takes one.")
    session = guard.session_of(request)
    if changing and route in PUBLIC_ROUTES:  # the login form: read within limits before anything
        request[FORM] = await read_form(request, FormLimits())
    if route not in PUBLIC_ROUTES:
        if session is None:
            if changing:
                return refuse(401, "No console session (or it expired): log in at /console/login.")
            raise web.HTTPSeeOther(f"{PATH}/login")
        if changing:
            form = await _read_bounded(request, route)
            if isinstance(form, web.Response):
                return form
            request[FORM] = form
            given = form.get("csrf")
            if not guard.csrf_ok(request, session, given if isinstance(given, str) else None):
                log.warning(
                    "console: %s %s refused: no or a wrong CSRF token", request.method, where(request)
                )
                return refuse(403, "Refused: the form's CSRF token is missing or wrong. Reload the page.")
        request[SESSION] = session
    return await handler(request)


async def login_page(request: web.Request) -> web.StreamResponse:
    if request.app[GUARD_KEY].session_of(request) is not None:
        raise web.HTTPSeeOther(f"{PATH}/")
    return aiohttp_jinja2.render_template("login.html", request, {"error": None, "notice": None})


async def login_post(request: web.Request) -> web.StreamResponse:
    guard = request.app[GUARD_KEY]
    form = form_of(request)
    given = form.get("token")
    outcome = guard.login(request, given if isinstance(given, str) else "")
    if isinstance(outcome, str):
        status = 429 if outcome.startswith("Too many") else 401
        page = {"error": outcome, "notice": None}
        return aiohttp_jinja2.render_template("login.html", request, page, status=status)
    old = guard.session_of(request)
    if old is not None:  # a login always starts a new session (no fixation)
        guard.sessions.end(old.id)
    response = web.HTTPSeeOther(f"{PATH}/")
    guard.set_cookie(request, response, outcome)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    guard = request.app[GUARD_KEY]
    guard.sessions.end(session_of(request).id)
    log.info("console: %s logged out", session_of(request).actor)
    response = web.HTTPSeeOther(f"{PATH}/login")
    guard.clear_cookie(response)
    return response


UPLOADS_AT_ONCE = 2
"""Chat messages with files the daemon reads at once: each is held in memory whole (up to
``max_files`` x ``max_file_bytes``, 50 MB by default, 1 GB at the settings' maximum), so without
a bound a few posts at once were gigabytes. Past it the post is refused (503, "send it again")."""
UPLOAD_BYTES = 256 * 1024
"""A body larger than this (or of unknown length) counts as an upload."""
UPLOADS_KEY: web.AppKey[asyncio.Semaphore] = web.AppKey("console_uploads", asyncio.Semaphore)


async def _read_bounded(request: web.Request, route: str | None) -> MultiDictProxy[Any] | web.Response:
    """The form within its limits; a large chat message only while fewer than
    :data:`UPLOADS_AT_ONCE` others are being read."""
    limits = form_limits(request, route)
    length = request.content_length
    if route != "chat_send" or (length is not None and length <= UPLOAD_BYTES):
        return await read_form(request, limits)
    uploads = request.app[UPLOADS_KEY]
    if uploads.locked():
        return refuse(
            503, f"The daemon is receiving {UPLOADS_AT_ONCE} other messages with files: send again soon."
        )
    async with uploads:
        return await read_form(request, limits)


def form_limits(request: web.Request, route: str | None) -> FormLimits:
    """A logged-in person's chat message may carry files and a long text; every other form is a
    few short fields."""
    if route != "chat_send":
        return FormLimits()
    web_chat = request.app[HOST_KEY].config.channels.web
    files = max(web_chat.max_files, 0)
    text = web_chat.max_text_chars * 4 + 1024  # UTF-8: up to four bytes a character
    body = web_chat.max_file_bytes * max(files, 1) + text + 2**20
    # Each file's own limit is the channel's to say (400 naming it); here only the body's.
    return FormLimits(parts=files + 8, field_bytes=max(text, 64 * 1024), file_bytes=body, body_bytes=body)


def _static_files() -> dict[str, tuple[bytes, str, str]]:
    """Each allowed static file's bytes, content type and ETag, read once from the package."""
    root = resources.files("gateway.console") / "static"
    files = {}
    for name, kind in STATIC.items():
        body = (root / name).read_bytes()
        files[name] = (body, kind, hashlib.sha256(body).hexdigest()[:32])
    return files


def build(host: ConsoleHost, token: str) -> web.Application:
    """The console's sub-application (routes relative to ``/console``)."""
    app = web.Application(middlewares=[gate])
    app[HOST_KEY] = host
    app[GUARD_KEY] = Guard(host.config.console, token)
    app[UPLOADS_KEY] = asyncio.Semaphore(UPLOADS_AT_ONCE)
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("gateway.console", "templates"),
        autoescape=True,
        finalize=lambda value: shown(value, host.redact),
    )
    env.globals["base"] = PATH
    files = _static_files()

    async def static(request: web.Request) -> web.StreamResponse:
        found = files.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound(text="No such file.")
        body, kind, etag = found
        return web.Response(body=body, content_type=kind, headers={"ETag": f'"{etag}"'})

    app.router.add_get("/login", login_page, name="login")
    app.router.add_post("/login", login_post, name="login_post")
    app.router.add_post("/logout", logout, name="logout")
    app.router.add_get("/static/{name}", static, name="static")
    pages.add_routes(app)
    actions.add_routes(app)
    chat.add_routes(app)
    return app


def mount(app: web.Application, host: ConsoleHost) -> bool:
    """Serve the console under ``/console`` on ``app`` when an admin token is set; False when not."""
    token = host.config.console.admin_token()
    if token is None:
        return False

    async def bare(_: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther(f"{PATH}/")

    app.router.add_get(PATH, bare)
    app.add_subapp(PATH, build(host, token))
    return True
