"""The admin's chat commands: ``/approve``, ``/deny`` and ``/revoke`` of pairing (docs/access.md).

Only admins reach these handlers (gateway/commands/builtin.py checks the row's ``who``); each still
checks that the admin administers the platform a code or user belongs to.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING

from agent.untrusted import code_span
from gateway.config.durations import about, in_words
from gateway.intake import access
from gateway.store.access import PAIRING_ALPHABET, PAIRING_CODE_LEN, normalize_code

if TYPE_CHECKING:
    from gateway.commands.registry import Command, CommandContext
    from gateway.store.access import PairingRequest
    from gateway.store.entries import JournalEntry

log = logging.getLogger(__name__)

LIST_MAX = 30
_CODE = re.compile(f"[{PAIRING_ALPHABET}]{{{PAIRING_CODE_LEN}}}")


async def decide(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """``/approve CODE`` and ``/deny CODE``. Unknown codes count against the admin (a window of
    :data:`gateway.intake.limits.BAD_CODES`), codes of channels they do not administer look unknown."""
    inbound, store, name, args = entry.inbound, ctx.store, cmd.name, cmd.args
    if not args:
        return await _pending_list(ctx, entry) if name == "approve" else "Usage: /deny CODE"
    wait = ctx.bad_codes.wait(inbound.user)
    if wait:
        return f"Too many unknown codes. Try again in {about(wait)}."
    code = normalize_code(args)
    request = await store.pairing_get(code) if _CODE.fullmatch(code) else None
    if request is None or not access.may_administer(ctx.config, inbound, request.platform):
        user = await store.approved_by_code(code) if name == "approve" else None
        if user and access.may_administer(ctx.config, inbound, user.partition(":")[0]):
            return f"✅ {code_span(user)} is approved (code {code})."
        ctx.bad_codes.add(inbound.user)
        return (
            f"No pending pairing code {code_span(code, PAIRING_CODE_LEN + 8)}. "
            "Send /approve alone to list the pending requests."
        )
    return await settle_pairing(ctx, request, name == "approve", inbound.user)


async def settle_pairing(ctx: CommandContext, request: PairingRequest, approve: bool, actor: str) -> str:
    """Approve or deny a pending request, log it with its ``actor`` (an admin's ``platform:id``, or
    the console's ``console:admin``) and tell the requester. The one implementation behind
    ``/approve``, ``/deny`` and the console's buttons (gateway/console/actions.py)."""
    code = request.code
    if not approve:
        ttl = ctx.config.access_for(request.platform).pairing_code_ttl
        await ctx.store.pairing_deny(code, ttl)
        log.info("pairing: %s denied %s (code %s)", actor, request.user, code)
        await ctx.tell(request.platform, request.chat_id, f"denied-{code}", access.denied_text())
        return f"🚫 Denied {request.chat_label()}. They get no new code for {in_words(ttl)}."
    if request.expired():
        return f"Code {code} has expired. Ask {request.chat_label()} to message me again for a new one."
    user = await ctx.store.pairing_approve(code)
    if user is None:  # lapsed between the two reads
        return f"Code {code} has expired. Ask {request.chat_label()} to message me again for a new one."
    log.info("pairing: %s approved %s (code %s)", actor, user, code)
    await ctx.tell(request.platform, request.chat_id, f"approved-{code}", access.approved_text())
    return f"✅ Approved {request.chat_label()}. They can talk to me now."


async def revoke(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """``/revoke USER`` takes back access granted by code; alone, lists who has it."""
    inbound = entry.inbound
    if not cmd.args:
        return await _approved_list(ctx, entry)
    user = access.qualify_user(cmd.args, inbound.platform)
    if user is None:
        return "Usage: /revoke USER — the user's id, e.g. /revoke telegram:12345"
    if not access.may_administer(ctx.config, inbound, user.partition(":")[0]):
        return (
            f"You are not an admin of {code_span(user.partition(':')[0])}; use `chital pairing revoke USER`."
        )
    removed = await revoke_user(ctx, user, inbound.user)
    text = (
        f"🚫 Revoked {code_span(user)}: they get a pairing code again if they write."
        if removed
        else (f"{code_span(user)} was not approved by code.")
    )
    if access.config_allowed(ctx.config, user):
        text += " They are also let in by config.yaml (access.allow_users / admins): remove them there."
    return text


async def revoke_user(ctx: CommandContext, user: str, actor: str) -> bool:
    """Take back ``user``'s access granted by code, logged with its ``actor``: ``/revoke`` and the
    console's Revoke button. False when they were not approved by code."""
    removed = await ctx.store.revoke(user)
    if removed:
        log.info("pairing: %s revoked %s", actor, user)
    return removed


async def _pending_list(ctx: CommandContext, entry: JournalEntry) -> str:
    if not entry.inbound.is_direct:
        return "I list pending requests only in a direct message."
    now = time.time()
    mine = [
        r
        for r in await ctx.store.pairing_list()
        if not r.expired(now) and access.may_administer(ctx.config, entry.inbound, r.platform)
    ]
    if not mine:
        return "No pending pairing requests."
    lines = [f"Pending requests ({len(mine)}):"]
    for r in mine[:LIST_MAX]:
        state = "denied" if r.denied else f"expires in {about(r.expires - now)}"
        lines.append(f"{r.code} — {r.chat_label()} — {state}")
    lines.append("Approve one with /approve CODE, refuse it with /deny CODE.")
    return "\n".join(lines)


async def _approved_list(ctx: CommandContext, entry: JournalEntry) -> str:
    if not entry.inbound.is_direct:
        return "I list approved users only in a direct message."
    users = [
        u
        for u, _ in await ctx.store.approved_list()
        if access.may_administer(ctx.config, entry.inbound, u.partition(":")[0])
    ]
    if not users:
        return "Nobody is approved by code."
    more = f" (first {LIST_MAX})" if len(users) > LIST_MAX else ""
    shown = "\n".join(code_span(u) for u in users[:LIST_MAX])
    return f"Approved by code{more}:\n{shown}\nRevoke with /revoke USER."
