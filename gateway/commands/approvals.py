"""``/approvals``: the standing permissions that apply in this conversation, revoking one, and
(admins) the latest decisions (docs/approvals.md, "Standing permissions"; gateway/turns/grants.py)."""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from agent.untrusted import code_span
from gateway.config.durations import in_words
from gateway.intake.access import is_admin
from gateway.turns.grants import scope_words

if TYPE_CHECKING:
    from channels.base import Inbound
    from gateway.commands.registry import Command, CommandContext
    from gateway.store.entries import JournalEntry
    from gateway.store.grants import Grant

log = logging.getLogger(__name__)

LISTED = 20
"""Permissions and log lines ``/approvals`` shows at most."""
_ID = re.compile(r"#?([0-9]{1,18})")


async def approvals_command(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """``/approvals``: the standing permissions that apply here; ``/approvals revoke ID`` ends one
    (its granter, the person it covers, or an admin); ``/approvals log``: the latest decisions."""
    inbound = entry.inbound
    words = cmd.args.split()
    if words and words[0].lower() == "revoke":
        return await _revoke(ctx, inbound, entry.conversation, words[1:])
    if words and words[0].lower() == "log":
        return await _log(ctx, inbound, entry.conversation)
    if words:
        return "Usage: /approvals (list), /approvals revoke ID, /approvals log."
    grants = await ctx.store.grants_visible(inbound.platform, entry.conversation, LISTED + 1)
    more, grants = len(grants) > LISTED, grants[:LISTED]
    if not grants:
        if not ctx.config.agent.approvals.standing:
            return "No standing permissions: this bot asks for every call (agent.approvals.standing is off)."
        return (
            "No standing permissions here: every gated call asks. Allow here / Always on a request adds one."
        )
    now = time.time()
    lines = ["Standing permissions that apply here (a call after reading others' content still asks):"]
    for g in grants:
        by = code_span(g.granted_by_name or g.granted_by, 60)
        ago = in_words(now - g.created, 1)
        lines.append(f"#{g.id} {code_span(g.tool, 60)} for {scope_words(g)}, by {by} {ago} ago")
    if more:
        lines.append(f"… and older ones (the newest {LISTED} are shown; revoke some to see the rest).")
    lines.append("/approvals revoke ID ends one (its granter, the person it covers, or an admin).")
    return "\n".join(lines)


async def _revoke(ctx: CommandContext, inbound: Inbound, conversation: str, args: list[str]) -> str:
    match = _ID.fullmatch(args[0]) if len(args) == 1 else None
    if match is None:
        return "Usage: /approvals revoke ID (the number /approvals shows)."
    grant = await ctx.store.grant_get(int(match.group(1)))
    if grant is None or grant.platform != inbound.platform or grant.revoked is not None:
        return f"No live standing permission #{match.group(1)} here."
    if grant.conversation and grant.conversation != conversation:
        return f"No live standing permission #{grant.id} here."
    admin = is_admin(ctx.config.access_for(inbound.platform), inbound)
    if not admin and inbound.user not in (grant.granted_by, grant.user):
        return f"⛔ Not yours to revoke: #{grant.id} is its granter's, the person's it covers, or an admin's."
    if not await revoke_grant(ctx, grant, inbound.user, inbound.sender_name):
        return f"No live standing permission #{grant.id} here."
    return f"🗑 Revoked #{grant.id}: {code_span(grant.tool, 60)} asks again from the next call."


async def _log(ctx: CommandContext, inbound: Inbound, conversation: str) -> str:
    if not is_admin(ctx.config.access_for(inbound.platform), inbound):
        return "⛔ The decision log is for admins."
    rows = await ctx.store.approval_log(inbound.platform, conversation, LISTED)
    if not rows:
        return "No decisions recorded here yet."
    now = time.time()
    lines = ["Latest approval decisions here (newest first):"]
    for r in rows:
        what = r.action + (f" {code_span(r.tool, 60)}" if r.tool else "")
        ref = f" #{r.grant_id}" if r.grant_id is not None else ""
        ref += f" ({r.code})" if r.code else ""
        who = code_span(r.by_user, 60) + (f" {code_span(r.by_name, 40)}" if r.by_name else "")
        lines.append(f"{in_words(now - r.at, 1)} ago: {what}{ref} by {who}")
    return "\n".join(lines)


async def revoke_grant(ctx: CommandContext, grant: Grant, actor: str, actor_name: str) -> bool:
    """End a standing permission its revoker may end, in the approvals log and the daemon's log
    with its ``actor``: ``/approvals revoke`` and the console's Revoke button. False when it was not
    live (another revocation won)."""
    if not await ctx.store.grant_revoke(grant.id, actor):
        return False
    await ctx.store.approval_log_add(
        grant.platform, grant.conversation, "revoke", actor, actor_name, tool=grant.tool, grant_id=grant.id
    )
    log.info("standing permission #%d revoked by %s", grant.id, actor)
    return True
