"""Approval before risky actions, the gateway side (docs/approvals.md).

A turn whose agent calls a gated tool ends with :class:`~agent.events.ApprovalRequested` events.
For each, this module records a row (gateway/store/approvals.py), posts the exact call with
Approve / Deny buttons (or, where the platform has none, asks for a text answer ``approve CODE``),
parks the journal entry as ``waiting`` and arms the timeout. A press (an
:class:`~channels.base.Action` from any adapter) or a text answer is checked (the requester or an
admin), settled exactly once in the table, shown on the buttons message, and the turn is resumed:
its journal entry runs again and :meth:`Approvals.events` continues the agent with the decision
instead of starting a new run, delivering into the same reply (its outbox rows are kept).

After a restart nothing is lost: the rows and the waiting entry are in SQLite, the timers are armed
again from the rows (gateway/turns/approval_timers.py: on the one daemon that owns the timers), and
a press on the old buttons works as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING

from agent.events import AgentEvent, ApprovalDecision, ApprovalRequested, SkillDrafted
from agent.untrusted import code_span
from channels.base import Action, ActionAnswer, Inbound, PermanentSendError
from gateway.config.durations import in_words
from gateway.config.secrets import redactor_for
from gateway.delivery.plan import PlanMessage
from gateway.delivery.reply import Reply
from gateway.intake.access import Verdict, decide, is_admin
from gateway.store.approvals import APPROVED, CANCELLED, DENIED, PENDING, TIMED_OUT, ApprovalRow
from gateway.store.entries import AtClaim, JournalEntry, JournalKind, JournalState
from gateway.turns import grants, skill_drafts
from gateway.turns.approval_text import request_text
from gateway.turns.approval_timers import ApprovalTimers
from gateway.turns.grants import PREFIX, TEXT_ANSWER, StandingGrants

if TYPE_CHECKING:
    from channels.base import Channel
    from gateway.agent_api import AgentHarness
    from gateway.config.schema import Config
    from gateway.ops.metrics import Metrics
    from gateway.ops.tasks import TaskTracker
    from gateway.store.journal import Store
    from gateway.turns.inflight import InFlight

log = logging.getLogger(__name__)

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
CODE_LEN = 8
WAITING_NOTE = "🔐 Waiting for approval (see below)."
NEWER = "a newer message came first"
STOPPED_WHY = "the answer was stopped"
"""Why a request is withdrawn when its turn was stopped and no one is named (the runner's side)."""
ENDED_WHY = "the answer it belonged to has ended"
OFF = "⛔ Standing permissions are off on this bot: Approve runs it once."
REFUSED = "refused always"
ADMINS_ONLY = "⛔ Only an admin can allow a tool everywhere; Approve or Allow here answer this one."
SETTLED = {
    APPROVED: "✅ Approved by {by}",
    DENIED: "❌ Denied by {by}",
    TIMED_OUT: "⌛ Timed out: not run",
    CANCELLED: "❌ Cancelled: {by}",
}


def _code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LEN))


def decision_of(row: ApprovalRow, timeout: float) -> ApprovalDecision:
    """What the agent is told of a settled request."""
    if row.state == APPROVED:
        return ApprovalDecision(True)
    if row.state == TIMED_OUT:
        return ApprovalDecision(False, f"no one approved it within {in_words(timeout)}")
    return ApprovalDecision(False, f"denied by {row.decided_by or 'the user'}")


class Approvals:
    """Requests, presses, timeouts and resumes of one daemon's paused turns.

    Given what it uses, not the Gateway: the channels by name (the Gateway's live mapping: adapters
    attach after this is made), the in-flight registry (a paused run must have left before its
    continuation is dispatched), the task tracker, and ``dispatch`` (handles an entry again)."""

    def __init__(
        self, config: Config, store: Store, harness: AgentHarness, metrics: Metrics,
        channels: Mapping[str, Channel], inflight: InFlight, tasks: TaskTracker,
        dispatch: Callable[[JournalEntry], bool],
    ) -> None:  # fmt: skip
        self.config = config
        self.store = store
        self.harness = harness
        self.metrics = metrics
        self.channels = channels
        self.inflight = inflight
        self.tasks = tasks
        self.dispatch = dispatch
        self.timers = ApprovalTimers(store, tasks, self._expire)
        """The timeouts, held while this daemon owns the timers (gateway/turns/approval_timers.py)."""
        self.standing = StandingGrants(config, store, metrics)

    @property
    def timeout(self) -> float:
        return self.config.agent.approvals.timeout

    # -- the turn ---------------------------------------------------------------------------------
    async def events(
        self,
        entry: JournalEntry,
        thread_id: str,
        reply: Reply,
        at_claim: AtClaim | None,
        fresh: Callable[[], AsyncIterator[AgentEvent]],
    ) -> AsyncIterator[AgentEvent]:
        """The agent's events for ``entry``: the continuation with the decisions taken since it
        paused, or ``fresh()`` (a new run) when there are none. Each ApprovalRequested is
        recorded and posted here (once per request, however often a replay asks again) and
        passed on, so the turn knows it paused. ``at_claim``: what its claim saw."""
        platform = entry.inbound.platform
        read = at_claim is None or at_claim.approvals  # else the claim saw none: nothing to read
        mine, waiting = (
            await self.store.approvals_at_turn(entry.key, entry.conversation, platform) if read else ([], [])
        )
        settled = [r for r in mine if r.state != PENDING]
        todo = [r for r in settled if not r.resumed]
        if not todo and not settled:
            await self.cancel(entry.conversation, platform, NEWER, keep=entry.key, pending=waiting)
        streams: list[Callable[[], AsyncIterator[AgentEvent]]] = []
        for row in todo:
            streams.append(self._resumer(entry, thread_id, row))
        if not streams:
            streams.append(fresh)
        resumed = [r.id for r in todo]
        # Answered already (a resume of one of several pending calls re-raises the others, same
        # ids): each is continued once, by its own resume, never approved or logged again.
        answered = {r.id for r in settled}
        while streams:
            stream, asked, allowed = streams.pop(0), False, []
            async for event in stream():
                if isinstance(event, SkillDrafted):  # the admins are told a draft waits for them
                    notice = skill_drafts.notify(
                        self.config, self.store, self.channels, entry.inbound, event.name,
                        redactor_for(self.config),
                    )  # fmt: skip
                    self.tasks.spawn(notice, f"skill-draft:{event.name}")
                if isinstance(event, ApprovalRequested):
                    if event.id in answered:
                        continue  # decided already: its own resume answers it
                    standing = await self.standing.approve(entry, event, reply.target, _code())
                    if standing is not None:  # a standing permission answered: no one is asked
                        answered.add(event.id)
                        allowed.append(standing)
                        continue
                    asked = True
                    if not reply.has_message:  # the reply first, the buttons under it
                        await reply.status(WAITING_NOTE)
                    await self.request(entry, event, reply)
                yield event
            if allowed and not asked:  # go on in this run; else with the person's answer
                streams.extend(self._resumer(entry, thread_id, r) for r in allowed)
                resumed.extend(r.id for r in allowed)
        if resumed:
            await self.store.approvals_resumed(resumed)

    def _resumer(
        self, entry: JournalEntry, thread_id: str, row: ApprovalRow
    ) -> Callable[[], AsyncIterator[AgentEvent]]:
        def stream() -> AsyncIterator[AgentEvent]:
            return self.harness.resume(
                thread_id,
                user_id=entry.inbound.user,
                message_id=entry.inbound.key,
                approval_id=row.id,
                decision=decision_of(row, self.timeout),
            )

        return stream

    async def request(self, entry: JournalEntry, event: ApprovalRequested, reply: Reply) -> None:
        """Record and post one request (once), where the turn's reply goes, and arm its timeout."""
        existing = await self.store.approval_get(event.id)
        if existing is not None and existing.message_id:
            self.timers.poke()
            return
        inbound = entry.inbound
        channel = self.channels[inbound.platform]
        buttons = channel.capabilities.buttons
        code = existing.code if existing else _code()
        name = inbound.sender_name or inbound.sender_id
        offered = self.standing.offered and self.standing.clean(event)
        text = request_text(event, name, self.timeout, code, buttons, offered)
        row = existing or await self.store.approval_add(
            event.id, code, entry.key, entry.conversation, reply.target, inbound.user, name,
            event.tool, text, time.time() + self.timeout,
        )  # fmt: skip
        part = channel.render(row.text)[0]
        key = f"approval:{row.id}"
        message_id = ""
        try:
            if buttons:
                message_id = await channel.send_buttons(
                    row.target, part, grants.buttons(row.code, offered), idempotency_key=key
                )
        except PermanentSendError as exc:
            log.warning(
                "approval %s: buttons refused on %s (%s); asking for text", row.code, channel.name, exc
            )
            text = request_text(event, name, self.timeout, code, False, offered)
            part = channel.render(text)[0]
        if not message_id:
            message_id = await channel.send(row.target, part, idempotency_key=key)
        await self.store.approval_sent(row.id, message_id)
        decided = await self.store.approval_get(row.id)
        if decided is not None and decided.state != PENDING:
            # Pressed before the message id was on record: the decision's own edit found no message.
            self.tasks.spawn(self._show(decided), f"approval-show:{row.code}")
        self.metrics.approvals.labels(channel.name, "asked").inc()
        log.info(
            "approval %s: %s asked in %s for %s", row.code, event.tool, entry.conversation, row.requester
        )
        self.timers.poke()

    async def pause(self, entry: JournalEntry) -> None:
        """The turn ended waiting: park its entry (a pause is not a failed attempt). A press that
        came before the turn had paused found nothing to resume, so that case goes on from here."""
        await self.store.journal_pause(entry.key)
        if not any(r.state == PENDING for r in await self.store.approvals_for(entry.key)):
            self.tasks.spawn(self._continue_when_free(entry.key), f"approval-continue:{entry.key}")

    async def _continue_when_free(self, key: str) -> None:
        """:meth:`_continue` once the paused run has left this process's in-flight registry (its own
        clean-up is a few statements away; the registry wakes this when it lets go of ``key``). 30 s
        at most, as before: a run stuck there must not keep its continuation waiting for ever."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                await self.inflight.released(key)
        await self._continue(key)

    # -- presses and text answers -----------------------------------------------------------------
    async def on_action(self, action: Action) -> ActionAnswer:
        """A button press from any adapter: checked, settled once, answered to the presser."""
        parts = action.value.split(":")
        if len(parts) != 3 or parts[0] != PREFIX or parts[1] not in grants.VERBS:
            return ActionAnswer("This button is not mine to answer.", refused=True)
        row = await self.store.approval_by_code(parts[2])
        if row is None or row.platform != action.platform:
            return ActionAnswer("This request no longer exists.", refused=True)
        if row.state == PENDING and await self._orphaned(row):
            # Its turn was stopped (or ended) while the buttons were live: nothing may run now.
            await self._settle_orphan(row)
            row = await self.store.approval_get(row.id) or row
        if row.state != PENDING:
            self._withdraw_pressed(row, action)
            return ActionAnswer(f"Already settled: {self._settled_note(row)}.", refused=True)
        if not self._may_answer(row, action):
            asker = code_span(row.requester_name) if row.requester_name else "the requester"
            who = "an admin" if self._admins_only else f"{asker} or an admin"
            log.info("approval %s: %s may not answer it", row.code, action.user)
            return ActionAnswer(f"⛔ Not yours to answer: only {who} can.", refused=True)
        if not self._is_admin(action) and not await self._still_allowed(row):
            log.info("approval %s: %s lost access since asking", row.code, action.user)
            return ActionAnswer(
                "⛔ You no longer have access to this bot; an admin can answer.", refused=True
            )
        return await self._answer(row, parts[1], action)

    async def _answer(self, row: ApprovalRow, verb: str, action: Action) -> ActionAnswer:
        """Settle ``row`` as ``verb`` says, from someone allowed to answer it; record who did."""
        lasting = verb in (grants.HERE, grants.ALWAYS)
        if lasting and not self.standing.offered:
            return ActionAnswer(OFF, refused=True)
        if verb == grants.ALWAYS and not self._is_admin(action):
            if not await self.store.approval_logged(action.platform, row.code, REFUSED, action.user):
                await self.standing.record(action, row.conversation, REFUSED, code=row.code, tool=row.tool)
            return ActionAnswer(ADMINS_ONLY, refused=True)
        mine = action.user == row.requester
        by = action.sender_name or (row.requester_name if mine else "") or action.sender_id
        note = grants.granted_note(verb, row.tool) if lasting else ""
        if not await self.decide(row, DENIED if verb == grants.DENY else APPROVED, by, note):
            fresh = await self.store.approval_get(row.id)
            return ActionAnswer(f"Already settled: {self._settled_note(fresh or row)}.", refused=True)
        return ActionAnswer(await self.standing.answered(verb, row, action))

    async def text_answer(self, inbound: Inbound) -> str | None:
        """``approve CODE`` / ``deny CODE`` typed in the chat (the fallback where there are no
        buttons, and always accepted): the note to send back, or None when it is no answer."""
        match = TEXT_ANSWER.match(inbound.text)
        if not match:
            return None
        code = match.group(2).upper()
        if await self.store.approval_by_code(code) is None:
            return None
        action = Action(
            platform=inbound.platform,
            chat_id=inbound.chat_id,
            sender_id=inbound.sender_id,
            value=f"{PREFIX}:{grants.TYPED[match.group(1).lower()]}:{code}",
            sender_name=inbound.sender_name,
            thread_id=inbound.thread_id,
        )
        return (await self.on_action(action)).text

    @property
    def _admins_only(self) -> bool:
        return self.config.agent.approvals.approvers == "admins"

    def _is_admin(self, action: Action) -> bool:
        probe = Inbound(action.platform, action.chat_id, "", action.sender_id, "", False, False)
        return is_admin(self.config.access_for(action.platform), probe)

    def _may_answer(self, row: ApprovalRow, action: Action) -> bool:
        if self._is_admin(action):
            return True
        return not self._admins_only and action.user == row.requester

    async def _still_allowed(self, row: ApprovalRow) -> bool:
        """The requester may still talk to the bot where they asked: one revoked (or whose group
        was removed from access) since must not approve their own pending call."""
        asked = await self.store.journal_inbound(row.key)
        if asked is None:
            return False
        decision = await decide(asked, self.config.access_for(asked.platform), self.store, True)
        return decision.verdict is Verdict.ALLOW

    @staticmethod
    def _settled_note(row: ApprovalRow) -> str:
        """``✅ Approved by `Name` `` (the presser's display name is theirs to choose: a code
        span, agent/untrusted.py); a cancellation's reason is the gateway's own sentence."""
        by = row.decided_by or "someone"
        return SETTLED.get(row.state, row.state).format(by=by if row.state == CANCELLED else code_span(by))

    # -- a turn stopped while its buttons were live ----------------------------------------------
    async def withdraw(self, key: str, why: str) -> int:
        """Cancel the pending requests of the turn ``key`` (stopped with ``/stop`` while it was
        asking, before it had paused): each is settled as cancelled, so no press can approve it,
        and its buttons are replaced by ``why``. The reply is the turn's ("Stopped"). How many."""
        cancelled = 0
        for row in await self.store.approvals_for(key):
            if row.state != PENDING or not await self.store.approval_decide(row.id, CANCELLED, why):
                continue
            cancelled += 1
            self.metrics.approvals.labels(row.platform, CANCELLED).inc()
            self.timers.forget(row.id)
            fresh = await self.store.approval_get(row.id)
            self.tasks.spawn(self._show(fresh or row), f"approval-withdraw:{row.code}")
            log.info("approval %s: withdrawn (%s)", row.code, why)
        return cancelled

    async def _orphaned(self, row: ApprovalRow) -> bool:
        """The turn that asked is no longer a turn that can go on (stopped: its entry is a notice
        now; or finished, failed, gone), yet the request is pending: a stop that landed between
        the buttons and the pause, or a crash between the stop's steps."""
        entry = await self.store.journal_entry(row.key)
        if entry is None or entry.kind is not JournalKind.TURN:
            return True
        return entry.state in (JournalState.DONE, JournalState.FAILED)

    async def _settle_orphan(self, row: ApprovalRow) -> None:
        entry = await self.store.journal_entry(row.key)
        why = STOPPED_WHY if entry is None or entry.kind is not JournalKind.TURN else ENDED_WHY
        await self.withdraw(row.key, why)

    def _withdraw_pressed(self, row: ApprovalRow, action: Action) -> None:
        """A press on a settled request whose buttons message is not the one on record (its send
        was cut short by a stop, so its id was never recorded): take the buttons off the message
        pressed, which shows the decision instead."""
        if not action.message_id or row.message_id == action.message_id:
            return
        self.tasks.spawn(self._show(row, action.message_id), f"approval-late:{row.code}")

    # -- settling ---------------------------------------------------------------------------------
    async def decide_as_operator(self, approval_id: str, approve: bool, by: str) -> str:
        """Approve or deny a pending request from outside its chat (the operator console): the
        operator may decide any, as an admin may; the decision shows on the request's buttons and
        the turn goes on, exactly as after a press. Returns the sentence for the operator."""
        row = await self.store.approval_get(approval_id)
        if row is None or row.state != PENDING:
            return "That request is no longer waiting: it was decided, timed out or cancelled."
        if await self._orphaned(row):
            await self._settle_orphan(row)
            return f"The turn that asked for {row.tool} ({row.code}) has ended: the request was cancelled."
        if not await self.decide(row, APPROVED if approve else DENIED, by):
            return "Someone decided it a moment earlier."
        return (
            f"{'Approved' if approve else 'Denied'}: {row.tool} ({row.code}); the turn goes on in its chat."
        )

    async def decide(self, row: ApprovalRow, state: str, by: str, note: str = "") -> bool:
        """Settle ``row`` (the first decision wins); then show it (with ``note``) and resume the turn."""
        if not await self.store.approval_decide(row.id, state, by):
            return False
        log.info("approval %s: %s by %s", row.code, state, by or "timeout")
        self.metrics.approvals.labels(row.platform, state).inc()
        self.timers.forget(row.id)
        settled = await self.store.approval_get(row.id)
        self.tasks.spawn(self._after(settled or row, note), f"approval:{row.code}")
        return True

    async def _after(self, row: ApprovalRow, note: str = "") -> None:
        await self._show(row, note=note)
        if row.state != CANCELLED:
            await self._continue(row.key)

    async def _show(self, row: ApprovalRow, message_id: str = "", note: str = "") -> None:
        channel = self.channels.get(row.platform)
        message_id = message_id or row.message_id
        if channel is None or not message_id:
            return
        part = channel.render(f"{row.text}\n\n{self._settled_note(row)}{note}")[0]
        try:
            await channel.close_buttons(row.target, message_id, part)
        except Exception as exc:  # the decision holds whether or not the message shows it
            log.warning("approval %s: could not show the decision: %s", row.code, exc)

    async def _continue(self, key: str) -> None:
        """Run the paused turn again once none of its requests is pending."""
        if any(r.state == PENDING for r in await self.store.approvals_for(key)):
            return
        if not await self.store.journal_unpause(key):
            return  # not waiting (a restart already flipped it, or it was cancelled)
        for entry in await self.store.journal_open():
            if entry.key == key:
                self.dispatch(entry)

    async def cancel(
        self, conversation: str, platform: str, why: str, *, keep: str = "",
        pending: list[ApprovalRow] | None = None,
    ) -> int:  # fmt: skip
        """End the paused turns of ``conversation`` (but ``keep``; ``pending``: its requests, if read
        already): requests cancelled (buttons say ``why``), replies say nothing ran, entries done. A
        new turn there does this, and so does ``/stop``. Returns how many requests were cancelled."""
        cancelled = 0
        for row in await self.store.approvals_pending(platform) if pending is None else pending:
            if row.conversation != conversation or row.key == keep:
                continue
            if not await self.store.approval_decide(row.id, CANCELLED, why):
                continue
            cancelled += 1
            self.metrics.approvals.labels(platform, CANCELLED).inc()
            self.timers.forget(row.id)
            fresh = await self.store.approval_get(row.id)
            self.tasks.spawn(self._show(fresh or row), f"approval-cancel:{row.code}")
            if await self.store.journal_unpause(row.key, JournalState.DONE.value):
                self.tasks.spawn(self._close_reply(row.key, why), f"approval-close:{row.code}")
        return cancelled

    async def close_request(self, approval_id: str, why: str) -> None:
        """Cancel one pending request whose asker is gone (a stopped turn's live request,
        gateway/turns/live_approvals.py): its buttons say ``why``."""
        if await self.store.approval_decide(approval_id, CANCELLED, why):
            self.timers.forget(approval_id)
            row = await self.store.approval_get(approval_id)
            if row is not None:
                self.tasks.spawn(self._show(row), f"approval-cancel:{row.code}")

    async def _close_reply(self, key: str, why: str) -> None:
        entry = await self.store.journal_entry(key)
        if entry is None:
            return
        try:
            reply = self.inflight.reply(entry)
            await reply.load()
            thread_id = await self.store.thread_for(entry.conversation)
            plan = PlanMessage(reply, redactor_for(self.config), lambda: self.harness.plan(thread_id))
            with contextlib.suppress(Exception):  # the plan's checklist, if any, ends unfinished
                await plan.close()
            await reply.finish(f"❌ Not run: the request was cancelled ({why}).")
        except Exception as exc:  # the buttons message already says it
            log.warning("approval: could not close the reply of %s: %s", key, exc)
        finally:
            self.inflight.drop_reply(key)

    # -- timeouts and restarts --------------------------------------------------------------------
    async def _expire(self, row: ApprovalRow) -> None:
        """A request's deadline passed (the timers' owner only): time it out, unless decided; one
        whose turn was stopped meanwhile is withdrawn instead, as a press on it would."""
        if await self._orphaned(row):
            await self._settle_orphan(row)
            return
        await self.decide(row, TIMED_OUT, "")

    async def restore(self, platform: str) -> None:
        """At every (re)connect of ``platform``: withdraw what a crash left pending for a stopped
        turn, give back to the journal a paused turn whose requests were all settled by a process
        that died before it could resume it, and (on the timers' owner) look at the timers again."""
        for row in await self.store.approvals_pending(platform):
            if await self._orphaned(row):  # a crash between a /stop's steps: withdrawn now
                await self._settle_orphan(row)
        for key in await self.store.journal_paused_settled(platform):
            await self.store.journal_unpause(key)
        self.timers.poke()

    def close(self) -> None:
        self.timers.close()
