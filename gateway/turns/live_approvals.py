"""Approval buttons for a request made *during* a tool call: a coding agent's permission request
(agent/acp/tool.py, docs/coding-agents.md).

The approvals of gateway/turns/approvals.py pause the turn and resume it later; an ACP session is a
live process that cannot wait across a pause, so here the turn keeps running while the same
request message (the exact ask, Approve / Deny buttons, the text answer ``approve CODE``, the same
who-may-answer rules and timeout) waits for a decision. The row is recorded like any other, so a
press is checked and settled once, and marked given-to-the-agent at once, so a re-run of the turn
never tries to resume it. No answer within the timeout, a lost turn, a stopped turn: rejected.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

from agent.acp.tool import TOOL_NAME, PermissionAsk
from agent.events import ApprovalRequested
from gateway.store.approvals import APPROVED, PENDING
from gateway.turns.approvals import Approvals

POLL = 0.5
"""Seconds between two looks at the request's row: a press may land on another daemon (several
share one database), so the row, not an in-process signal, is what decides."""


async def ask_live(approvals: Approvals, request: PermissionAsk) -> bool:
    """Post ``request`` with approval buttons where its turn replies; True only on Approve."""
    if not request.message_id:
        return False
    entry = await approvals.store.journal_entry(request.message_id)
    if entry is None:
        return False
    reply = approvals.inflight.reply(entry)
    event = ApprovalRequested(
        id=f"acp-{uuid.uuid4().hex}",
        tool=f"{TOOL_NAME} ({request.agent})",
        args={
            "coding agent": request.agent,
            "asks to": request.title,
            **({"details": request.detail} if request.detail else {}),
        },
        description=f"The coding agent {request.agent} asks for permission.",
        standing_ok=False,  # answered once, live: a permission could not answer it later
    )
    try:
        if not reply.has_message:  # the reply first, the buttons under it (as for paused turns)
            await reply.status(f"🔐 The coding agent {request.agent} asks for permission (see below).")
        await approvals.request(entry, event, reply)
        async with asyncio.timeout(approvals.timeout + 30):
            while True:
                row = await approvals.store.approval_get(event.id)
                if row is None:
                    return False
                if row.state != PENDING:
                    return row.state == APPROVED
                await asyncio.sleep(POLL)
    except TimeoutError:
        return False
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            # The asker is gone: the turn was stopped, or the agent's session ended (it exited,
            # crashed, timed out or broke a rule) with this prompt unanswered; either way no
            # press can still reach it, so the buttons say so rather than wait for the timeout.
            why = "the coding agent's session ended before an answer"
            await asyncio.shield(approvals.close_request(event.id, why))
        raise
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(approvals.store.approvals_resumed([event.id]))


__all__ = ["ask_live"]
