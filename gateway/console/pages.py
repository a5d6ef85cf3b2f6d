"""The console's read-only pages. Each reads what the chat commands and ``chital status`` read (the
status snapshot, the store's tables, the commands' own listings) and renders one template; every
value shown passes :func:`gateway.console.app.shown` (secrets masked, escaped, bounded)."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import time
from typing import Any

import aiohttp_jinja2
from aiohttp import web

from compat.versions import check_all
from gateway.commands.builtin import REGISTRY
from gateway.commands.mcp import servers_text
from gateway.commands.skills import listing
from gateway.console.charts import usage_charts
from gateway.console.request import HOST_KEY, session_of
from gateway.schedules.runner import info_of
from gateway.store.journal import Store

CONVERSATIONS_LISTED = 100
SEARCH_CHARS = 200
NAV = (
    ("overview", "/", "Overview"),
    ("chat", "/chat", "Chat"),
    ("conversations", "/conversations", "Conversations"),
    ("people", "/people", "People"),
    ("approvals", "/approvals", "Approvals"),
    ("schedules", "/schedules", "Schedules"),
    ("tasks", "/tasks", "Background tasks"),
    ("usage", "/usage", "Usage"),
    ("skills", "/skills", "Skills & MCP"),
)


def when(ts: float | None) -> str:
    if not ts:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def render(request: web.Request, template: str, page: str, **values: Any) -> web.Response:
    """A page with the layout's values: the nav, the CSRF token its forms carry, and the notice an
    action left for it (shown once)."""
    session = session_of(request)
    notice, session.notice = session.notice, None
    context = {"nav": NAV, "page": page, "csrf": session.csrf, "notice": notice, "when": when, **values}
    return aiohttp_jinja2.render_template(template, request, context)


def store_of(request: web.Request) -> Store:
    store = request.app[HOST_KEY].store()
    if store is None:
        raise web.HTTPServiceUnavailable(text="The daemon is still starting: its database is not open yet.")
    return store


async def overview(request: web.Request) -> web.Response:
    host = request.app[HOST_KEY]
    status = await host.status()
    try:
        version = importlib.metadata.version("chital")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return render(
        request,
        "overview.html",
        "overview",
        status=status,
        summary=await host.summary(),
        version=version,
        problems=[p.line() for p in check_all()],
    )


async def conversations(request: web.Request) -> web.Response:
    search = request.query.get("q", "")[:SEARCH_CHARS]
    found = await store_of(request).conversations(search, CONVERSATIONS_LISTED)
    return render(request, "conversations.html", "conversations", search=search, found=found)


async def conversation(request: web.Request) -> web.Response:
    key = request.query.get("c", "")
    store = store_of(request)
    entries = await store.conversation_entries(key) if key else []
    if not entries:
        raise web.HTTPNotFound(text="No such conversation.")
    approvals = {e["key"]: await store.approvals_for(e["key"]) for e in entries}
    ctx = request.app[HOST_KEY].context()
    thread = await store.thread_get(key)
    redact = request.app[HOST_KEY].redact  # masked before the transcript cuts (a secret's head)
    history = await ctx.harness.transcript(thread, mask=redact) if ctx is not None and thread else ()
    return render(
        request,
        "conversation.html",
        "conversations",
        key=key,
        entries=entries,
        approvals=approvals,
        thread=thread,
        history=history,
    )


async def people(request: web.Request) -> web.Response:
    host = request.app[HOST_KEY]
    store = store_of(request)
    now = time.time()
    pending = [r for r in await store.pairing_list() if not r.denied and not r.expired(now)]
    policy = host.config.access
    return render(
        request,
        "people.html",
        "people",
        pending=pending,
        approved=await store.approved_list(),
        allowed=list(policy.allow_users),
        admins=list(policy.admins),
    )


async def approvals(request: web.Request) -> web.Response:
    store = store_of(request)
    return render(
        request,
        "approvals.html",
        "approvals",
        pending=await store.approvals_pending(),
        grants=await store.grants_live(),
    )


async def schedules(request: web.Request) -> web.Response:
    found = await store_of(request).schedules_all()
    rows = [(s, info_of(s)) for s in found]
    return render(request, "schedules.html", "schedules", rows=rows)


async def tasks(request: web.Request) -> web.Response:
    return render(request, "tasks.html", "tasks", tasks=await store_of(request).background_all())


async def usage(request: web.Request) -> web.Response:
    today = dt.date.today()
    since = (today - dt.timedelta(days=13)).isoformat()
    rows = await store_of(request).usage_by_day(since)
    return render(request, "usage.html", "usage", charts=usage_charts(rows, today, 14))


async def skills(request: web.Request) -> web.Response:
    host = request.app[HOST_KEY]
    ctx = host.context()
    if ctx is None:
        raise web.HTTPServiceUnavailable(text="The daemon is still starting.")
    skills_text = listing(ctx, REGISTRY.known)
    mcp = ctx.harness.mcp
    mcp_text = servers_text(mcp.servers()) if mcp is not None else "MCP is off (the agent has no tools)."
    return render(request, "skills.html", "skills", skills_text=skills_text, mcp_text=mcp_text)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", overview, name="overview")
    app.router.add_get("/conversations", conversations, name="conversations")
    app.router.add_get("/conversation", conversation, name="conversation")
    app.router.add_get("/people", people, name="people")
    app.router.add_get("/approvals", approvals, name="approvals")
    app.router.add_get("/schedules", schedules, name="schedules")
    app.router.add_get("/tasks", tasks, name="tasks")
    app.router.add_get("/usage", usage, name="usage")
    app.router.add_get("/skills", skills, name="skills")
