"""The console's actions: each calls the function its chat command calls (one implementation), with
the console's user as the actor, so the same log lines and tables record who did it.

Every action is a POST the gate has checked (session, Origin, CSRF); its outcome is the command's
own sentence, shown once on the page it returns to (303, so a reload does not repeat it).
"""

from __future__ import annotations

import logging
import re

from aiohttp import web

from agent.tools.schedule import ScheduleError
from gateway.commands.admin import revoke_user, settle_pairing
from gateway.commands.approvals import revoke_grant
from gateway.commands.background import stop_task
from gateway.commands.registry import CommandContext
from gateway.console.auth import PATH
from gateway.console.forms import form_of
from gateway.console.request import HOST_KEY, session_of
from gateway.intake import access
from gateway.schedules.runner import cancel_as
from gateway.store.access import normalize_code
from gateway.store.schedules import ACTIVE

log = logging.getLogger(__name__)

_NUMBER = re.compile(r"[0-9]{1,18}")
ACTOR_NAME = "the operator console"


def context_of(request: web.Request) -> CommandContext:
    ctx = request.app[HOST_KEY].context()
    if ctx is None:
        raise web.HTTPServiceUnavailable(text="The daemon is still starting: try again in a moment.")
    return ctx


async def field(request: web.Request, name: str) -> str:
    value = form_of(request).get(name)
    return value.strip()[:200] if isinstance(value, str) else ""


def back(request: web.Request, page: str, notice: str) -> web.HTTPSeeOther:
    session_of(request).notice = notice
    return web.HTTPSeeOther(f"{PATH}{page}")


def number(text: str) -> int | None:
    return int(text) if _NUMBER.fullmatch(text) and 0 < int(text) < 2**63 else None


async def pairing(request: web.Request) -> web.StreamResponse:
    """Approve or deny a pending pairing request by its code (``/approve``, ``/deny``)."""
    ctx = context_of(request)
    approve = request.match_info["verb"] == "approve"
    code = normalize_code(await field(request, "code"))
    pending = await ctx.store.pairing_get(code) if code else None
    if pending is None:
        raise back(request, "/people", f"No pending pairing code {code!r}: it was decided or has expired.")
    text = await settle_pairing(ctx, pending, approve, session_of(request).actor)
    raise back(request, "/people", text)


async def revoke(request: web.Request) -> web.StreamResponse:
    """Take back access granted by code (``/revoke``)."""
    ctx = context_of(request)
    user = access.qualify_user(await field(request, "user"), "")
    if user is None or not user.partition(":")[0]:
        raise back(request, "/people", "Name the user as platform:id, e.g. telegram:12345.")
    removed = await revoke_user(ctx, user, session_of(request).actor)
    raise back(request, "/people", f"Revoked {user}." if removed else f"{user} was not approved by code.")


async def schedule_cancel(request: web.Request) -> web.StreamResponse:
    """Cancel an active schedule (``/unschedule``); the console's user may cancel any."""
    ctx = context_of(request)
    sid = number(await field(request, "id"))
    schedule = await ctx.store.schedule_get(sid) if sid else None
    if schedule is None or schedule.state != ACTIVE:
        raise back(request, "/schedules", "No such active schedule: it ended or was cancelled.")
    try:
        await cancel_as(ctx.store, schedule, session_of(request).actor)
    except ScheduleError as exc:
        raise back(request, "/schedules", f"Cannot cancel: {exc}.") from None
    raise back(request, "/schedules", f"Cancelled schedule #{schedule.id}.")


async def grant_revoke(request: web.Request) -> web.StreamResponse:
    """End a standing permission (``/approvals revoke``)."""
    ctx = context_of(request)
    gid = number(await field(request, "id"))
    grant = await ctx.store.grant_get(gid) if gid else None
    if grant is None or grant.revoked is not None:
        raise back(request, "/approvals", "No such live standing permission.")
    done = await revoke_grant(ctx, grant, session_of(request).actor, ACTOR_NAME)
    text = f"Revoked standing permission #{grant.id}." if done else "It was revoked already."
    raise back(request, "/approvals", text)


async def approval_decide(request: web.Request) -> web.StreamResponse:
    """Approve or deny a pending tool approval (what its buttons do in the chat)."""
    ctx = context_of(request)
    approval_id = await field(request, "id")
    if ctx.decide_approval is None or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", approval_id):
        raise back(request, "/approvals", "No such pending approval.")
    approve = request.match_info["verb"] == "approve"
    raise back(
        request, "/approvals", await ctx.decide_approval(approval_id, approve, session_of(request).actor)
    )


async def task_stop(request: web.Request) -> web.StreamResponse:
    """Stop a running background task (``/tasks stop``)."""
    ctx = context_of(request)
    tid = number(await field(request, "id"))
    task = await ctx.store.background_get(tid) if tid else None
    if task is None or not task.running:
        raise back(request, "/tasks", "No such running background task.")
    raise back(request, "/tasks", await stop_task(ctx, task, session_of(request).actor))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/people/{verb:approve|deny}", pairing, name="pairing")
    app.router.add_post("/people/revoke", revoke, name="revoke")
    app.router.add_post("/schedules/cancel", schedule_cancel, name="schedule_cancel")
    app.router.add_post("/approvals/revoke", grant_revoke, name="grant_revoke")
    app.router.add_post("/tasks/stop", task_stop, name="task_stop")
    app.router.add_post("/approvals/{verb:approve|deny}", approval_decide, name="approval_decide")
