"""Standing permissions: "Allow here" and "Always" beside Approve / Deny (docs/approvals.md,
"Standing permissions").

Asking every time trains people to press Approve without reading; never asking is what approvals
exist to prevent. So a person may answer a request once for the future, narrowly:

- **Allow here** (the requester, or an admin for them): this person's calls of this tool in this
  conversation run without asking from now on;
- **Always** (admins only; shown to everyone, refused to others with nothing recorded): everyone's
  calls of this tool on this platform. Admins are per platform (``access_for``), so is this.

A permission never covers a call made after the turn read content its user did not write (the
request's ``untrusted``, agent/provenance.py): a web page or a forwarded message could be steering
that call, so it asks as before, saying why. It names a tool, never its arguments: an "Always" on
``execute`` lets any command run, which is why it is an admin's to give, and ``/approvals`` shows
and revokes it (its granter, the person it covers, or an admin).

Every decision is appended to ``approval_log`` (gateway/store/grants.py) with the platform's
verified user id of who took it: approve, deny, allow here, always, a refused Always, a call run
under a permission, a revocation.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import time
from typing import TYPE_CHECKING

from agent.provenance import TOOL
from agent.untrusted import code_span
from channels.base import Action, Button, ReplyTarget
from gateway.intake.access import Verdict, decide, is_admin
from gateway.store.approvals import APPROVED, ApprovalRow

if TYPE_CHECKING:
    from agent.events import ApprovalRequested
    from channels.base import Inbound
    from gateway.config.schema import Config
    from gateway.ops.metrics import Metrics
    from gateway.store.entries import JournalEntry
    from gateway.store.grants import Grant
    from gateway.store.journal import Store

log = logging.getLogger(__name__)

PREFIX = "appr"
"""Button values are ``appr:VERB:CODE`` (short: Telegram allows 64 bytes of callback data)."""
APPROVE, DENY, HERE, ALWAYS = "approve", "deny", "here", "always"
VERBS = (APPROVE, DENY, HERE, ALWAYS)
TYPED = {"approve": APPROVE, "deny": DENY, "allow": HERE, "always": ALWAYS}
"""What a typed answer's first word means (``allow CODE``: Allow here)."""
TEXT_ANSWER = re.compile(r"^\s*(approve|deny|allow|always)\s+([A-Za-z0-9]{8})\s*$", re.IGNORECASE)


def buttons(code: str, standing: bool) -> list[Button]:
    """Approve and Deny, with Allow here and Always between them when ``standing``."""
    row = [Button("✅ Approve", f"{PREFIX}:{APPROVE}:{code}", "primary")]
    if standing:
        row += [
            Button("💬 Allow here", f"{PREFIX}:{HERE}:{code}"),
            Button("♾ Always", f"{PREFIX}:{ALWAYS}:{code}"),
        ]
    return [*row, Button("❌ Deny", f"{PREFIX}:{DENY}:{code}", "danger")]


def typed_help(code: str, buttons_shown: bool, standing: bool) -> str:
    """The line under a request that says what may be typed."""
    how = f"{'Or reply' if buttons_shown else 'Reply'} `approve {code}` or `deny {code}`"
    if standing:
        how += f"; `allow {code}` also allows it here from now on (admins: `always {code}`, everywhere)"
    return how + "."


def scope_words(grant: Grant) -> str:
    return (
        "everyone, everywhere on this platform" if grant.everywhere else f"{code_span(grant.user, 60)} here"
    )


def granted_note(verb: str, tool: str) -> str:
    """What the settled request shows after Approve for an "Allow here" / "Always" answer."""
    where = "everywhere" if verb == ALWAYS else "here"
    return f" · {code_span(tool, 60)} is allowed {where} from now on (/approvals)"


class StandingGrants:
    """Matching, granting and listing; given the config and the store, nothing of the Gateway."""

    def __init__(self, config: Config, store: Store, metrics: Metrics) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics

    @property
    def offered(self) -> bool:
        return self.config.agent.approvals.standing

    def is_admin(self, action: Action) -> bool:
        return is_admin(self.config.access_for(action.platform), _probe(action))

    def clean(self, event: ApprovalRequested) -> bool:
        """Whether a standing permission may answer ``event``: the thread read nothing its user
        did not write, beyond the results of earlier calls of this same gated tool (without this,
        one granted ``execute`` would make every later call in the thread ask again). Another
        gated tool's output does not pass: approving an MCP tool that reads an issue vouches for
        the call, not for what a stranger wrote in the issue. Deny by default: sources said but
        not given (an unreadable state) count."""
        if not event.standing_ok or (event.untrusted and not event.sources):
            return False
        gated = self.config.agent.approvals.tools
        return all(s.kind == TOOL and s.label == event.tool and _named(s.label, gated) for s in event.sources)

    async def covering(self, entry: JournalEntry, event: ApprovalRequested) -> Grant | None:
        """The live permission under which ``event`` runs without asking, if any: never for a
        call made after the turn read content its user did not write (:meth:`clean`)."""
        if not self.offered or not self.clean(event):
            return None
        inbound = entry.inbound
        grant = await self.store.grant_match(event.tool, inbound.platform, entry.conversation, inbound.user)
        if grant is None:
            return None
        # In force only while those it rests on still hold their standing: the requester may still
        # use the bot (a revoked pairing, a user taken off the list: a schedule or a background
        # task of theirs still runs turns), and an Always's granter is still an admin.
        access = self.config.access_for(inbound.platform)
        if (
            not is_admin(access, inbound)
            and (await decide(inbound, access, self.store, True)).verdict is not Verdict.ALLOW
        ):
            log.info("standing permission #%d: %s no longer has access; asking", grant.id, inbound.user)
            return None
        if grant.everywhere and not is_admin(access, _person(inbound.platform, grant.granted_by)):
            log.info("standing permission #%d: its granter is no longer an admin; asking", grant.id)
            return None
        return grant

    async def approve(
        self, entry: JournalEntry, event: ApprovalRequested, target: ReplyTarget, code: str
    ) -> ApprovalRow | None:
        """The request recorded as approved when a standing permission covers it (once: a replay
        finds it settled), or None: a person is asked."""
        grant = await self.covering(entry, event)
        if grant is None:
            return None
        inbound = entry.inbound
        by = f"standing permission #{grant.id}"
        row = await self.store.approval_get(event.id) or await self.store.approval_add(
            event.id, code, entry.key, entry.conversation, target, inbound.user,
            inbound.sender_name or inbound.sender_id, event.tool, by, time.time(),
        )  # fmt: skip
        await self.store.approval_decide(row.id, APPROVED, by)
        await self.store.approval_log_add(
            inbound.platform, entry.conversation, "run under permission", grant.granted_by, "",
            code=row.code, tool=event.tool, grant_id=grant.id,
        )  # fmt: skip
        self.metrics.approvals.labels(inbound.platform, "standing").inc()
        log.info("approval %s: %s runs under standing permission #%d", row.code, event.tool, grant.id)
        return await self.store.approval_get(row.id) or row

    async def grant(self, verb: str, tool: str, conversation: str, requester: str, action: Action) -> Grant:
        """Record the permission an Allow here / Always answer gave (the caller checked who may)."""
        everywhere = verb == ALWAYS
        grant = await self.store.grant_add(
            tool, action.platform, "" if everywhere else conversation, "" if everywhere else requester,
            action.user, action.sender_name or action.sender_id, "",
        )  # fmt: skip
        log.info("standing permission #%d: %s for %s by %s", grant.id, tool, scope_words(grant), action.user)
        return grant

    async def answered(self, verb: str, row: ApprovalRow, action: Action) -> str:
        """Record a person's settled answer (and the permission it gave); the note for them."""
        grant = None
        if verb in (HERE, ALWAYS):
            grant = await self.grant(verb, row.tool, row.conversation, row.requester, action)
        where = "" if verb == ALWAYS else row.conversation  # logged where it applies
        await self.record(
            action, where, verb, code=row.code, tool=row.tool, grant=grant.id if grant else None
        )
        if grant is not None:
            return f"✅ Approved; from now on it runs without asking for {scope_words(grant)} (#{grant.id})."
        return "❌ Denied; the agent is told." if verb == DENY else "✅ Approved; continuing."

    async def record(
        self,
        action: Action,
        conversation: str,
        what: str,
        *,
        code: str = "",
        tool: str = "",
        grant: int | None = None,
    ) -> None:
        """Append one decision to the log, under the presser's verified id."""
        await self.store.approval_log_add(
            action.platform, conversation, what, action.user, action.sender_name or "",
            code=code, tool=tool, grant_id=grant,
        )  # fmt: skip


def _probe(action: Action) -> Inbound:
    from channels.base import Inbound

    return Inbound(action.platform, action.chat_id, "", action.sender_id, "", False, False)


def _person(platform: str, user: str) -> Inbound:
    """A probe for the access checks of the person ``user`` (``platform:id``)."""
    from channels.base import Inbound

    sender = user.split(":", 1)[1] if user.startswith(f"{platform}:") else ""
    return Inbound(platform, "", "", sender, "", True, True)


def _named(tool: str, patterns: list[str]) -> bool:
    """``tool`` is gated by ``agent.approvals.tools`` (names or fnmatch patterns, as agent/approvals.py
    reads them)."""
    return any(tool == p or fnmatch.fnmatchcase(tool, p) for p in patterns)
