"""Running one journal entry's turn: the agent, its stream into the reply, the final answer and
what follows it (files, the done mark, reactions), and every way a turn can end with the outcome
the user sees. Split from gateway/daemon/gateway.py (intake, dispatch, shutdown), which makes one and hands it
each claimed turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NamedTuple

from agent.events import (
    AgentEvent,
    ApprovalRequested,
    Clarification,
    FileOut,
    Final,
    PlanUpdated,
    StatusUpdate,
    TextDelta,
    ToolProgress,
    TurnFailed,
)
from agent.plan import TOOL as PLAN_TOOL
from agent.turn import TurnOptions
from channels.base import Channel, ChannelError, Inbound
from gateway.config.durations import in_words
from gateway.delivery.plan import PlanMessage
from gateway.intake.attachments import Uploads, deliver_files, fetch_attachments
from gateway.ops import tracing
from gateway.store.disk import StorageFull
from gateway.store.entries import BACKGROUND_MARK, AtClaim, JournalEntry, JournalState
from gateway.turns import push_copy, quiet
from gateway.turns.approvals import STOPPED_WHY, WAITING_NOTE
from gateway.turns.options import turn_options
from gateway.turns.outcome import TurnOutcome
from gateway.turns.spoken import Speaker
from gateway.turns.stopping import STOPPED, stopped_notice

if TYPE_CHECKING:
    from agent.redact import Redactor
    from gateway.agent_api import AgentHarness
    from gateway.config.schema import Config
    from gateway.delivery.parking import Parking
    from gateway.delivery.reply import Reply
    from gateway.intake.host import IntakeHost
    from gateway.ops.metrics import Metrics
    from gateway.ops.tasks import TaskTracker
    from gateway.store.journal import Store
    from gateway.turns.approvals import Approvals
    from gateway.turns.background import BackgroundTasks
    from gateway.turns.busy import Busy
    from gateway.turns.choices import Choices
    from gateway.turns.inflight import InFlight
    from gateway.turns.queue import TurnQueue

log = logging.getLogger("gateway.daemon.gateway")  # the same name as before the split: operators filter on it

TYPING_EVERY = 4.5
TYPING_AFTER = 0.3
"""An answer faster than this needs no typing indicator (saves a platform call per message)."""
MAX_ATTEMPTS = 3
AFTER_ANSWER_PART = 30_000
"""Outbox part of the note under an answer when something failed after it (files use 10,000+, the
plan's checklist 20,000: gateway/delivery/plan.py)."""
AFTER_ANSWER_NOTE = (
    "⚠️ Something went wrong on my side after this answer: the answer above is complete, "
    "but a file or a follow-up it announced may be missing."
)


class Leftovers(NamedTuple):
    """What a turn may have left for after its answer, each looked up in the database only when it
    may: a question's options (from the checkpoint) and presented files (from the store). Both
    False only for a turn the harness started here that sent neither (``Final.fresh``)."""

    options: bool
    files: bool


class TurnRunner:
    """Runs journal entries' turns. An object with the dependencies it declares, made by the Gateway
    (gateway/daemon/gateway.py) after the parts it needs: the journal, the agent seam, the turn
    queue (to know a /stop), the in-flight registry (the live reply, and letting go of the key),
    approvals, parking, the task tracker, the secret masker, ``keep`` (whether this daemon still
    holds the entry's lease before an answer goes out) and ``host``, what intake's per-turn helpers
    read (attachments, thread context, images, profile: gateway/intake/host.py)."""

    def __init__(
        self,
        *,
        config: Config,
        store: Store,
        harness: AgentHarness,
        metrics: Metrics,
        turns: TurnQueue,
        inflight: InFlight,
        approvals: Approvals,
        parking: Parking,
        tasks: TaskTracker,
        redact: Redactor,
        keep: Callable[[JournalEntry], Awaitable[bool]],
        host: IntakeHost,
        busy: Busy | None = None,
    ) -> None:
        self.config, self.store, self.harness, self.metrics = config, store, harness, metrics
        self.turns, self.inflight, self.approvals, self.parking = turns, inflight, approvals, parking
        self.tasks, self.redact, self._keep, self.host = tasks, redact, keep, host
        self.busy = busy
        """Busy modes: the turn's inbox of steered messages, what it interrupted (gateway/turns/busy.py)."""
        self.speaker = Speaker(config, store, redact, turns)
        """Spoken replies (``/voice``): the answer as audio after its text (gateway/turns/spoken.py)."""
        self.choices: Choices | None = None
        """Questions with options as buttons (gateway/turns/choices.py), set by the daemon."""
        self.hand_on: Callable[[JournalEntry], Coroutine[Any, Any, None]] | None = None
        """With several daemons (set by the gateway): start the conversation's next turn here, one
        that another daemon journaled while this one ran the turn just finished
        (gateway/daemon/gateway.py ``hand_on``)."""
        self.background: BackgroundTasks | None = None
        """Background tasks (gateway/turns/background.py), set by the daemon: a task stopped, revoked
        or forgotten meanwhile ends before it runs and before its answer goes out."""

    # -- turns ----------------------------------------------------------------------------------
    async def run(self, entry: JournalEntry) -> None:
        """Run ``entry``'s turn to one of its outcomes; the key is let go of here at the end."""
        with tracing.turn(entry):  # its span, and the queue wait's (gateway/ops/tracing.py)
            await self._run(entry)

    async def _run(self, entry: JournalEntry) -> None:
        inbound = entry.inbound
        started = time.monotonic()
        reply = self.inflight.reply(entry)
        typing: asyncio.Task[None] | None = None
        outcome: TurnOutcome = TurnOutcome.ERROR
        answered = cut = False
        plan: PlanMessage | None = None
        try:
            if entry.from_journal:
                await reply.load()
            if not entry.started:  # else its claim, or its insert, did (several daemons)
                await self.store.journal_set(entry.key, JournalState.RUNNING)
            entry.started, at_claim, entry.at_claim = False, entry.at_claim, None
            entry.attempts += 1
            if entry.attempts > MAX_ATTEMPTS:
                await self._give_up(entry, reply)
                outcome = TurnOutcome.ABANDONED
                return
            if self.background is not None and await self.background.halted(entry, reply):
                outcome = TurnOutcome.STOPPED
                return
            if entry.attempts > 1 and reply.has_message:
                with contextlib.suppress(Exception):
                    await reply.status("♻️ I was restarted while answering; picking up where I left off…")
            picked_up = reply.channel.capabilities.picked_up_reaction
            if picked_up:
                self.tasks.spawn(self._react(reply.channel, inbound, picked_up), f"react:{entry.key}")
            if quiet.schedule_of(inbound) is None:  # a scheduled run may end silent: no sign of it
                typing = asyncio.create_task(self._keep_typing(reply))
            thread_id = await self.store.thread_for(entry.conversation)  # a background task's own
            if self.choices is not None:  # open buttons of this conversation are answered now
                await self.choices.close(entry, at_claim)
            plan = self._plan(reply, thread_id)
            uploads = await fetch_attachments(self.host, reply.channel, entry, thread_id)
            async with self._slot(entry):
                turn = self._agent_turn(entry, thread_id, uploads, reply, plan, at_claim)
                final, outcome, left = await turn
            if typing is not None:
                typing.cancel()
            if not await self._keep(entry):  # lost to another daemon meanwhile: it answers
                outcome = TurnOutcome.FENCED
                return
            if self.background is not None and await self.background.halted(entry, reply):
                outcome = TurnOutcome.STOPPED
                return
            if outcome is TurnOutcome.WAITING:  # paused for approval: resumed by gateway/turns/approvals.py
                await plan.stop()  # the plan goes on when the turn does
                await reply.finish(final)
                await self.approvals.pause(entry)
                return
            # From here /stop leaves the turn alone: its answer goes out whole (gateway/turns/stopping.py).
            self.turns.finishing(entry.key)
            await self._close_plan(plan)
            final, silent = await quiet.settle(self.store, entry.key, inbound, final, outcome)
            if silent:  # a scheduled run with nothing to report (gateway/turns/quiet.py)
                await quiet.finish_silent(reply, inbound)
            else:
                spoken = _answer_only(final, uploads)
                if entry.note:  # the gateway's own word above the answer (a schedule firing late)
                    final = f"{entry.note}\n\n{final}"
                await reply.finish(final)
                answered = True
                await push_copy.journal_copies(self.store, self.config, entry.key, inbound, final)
                if left.files:
                    await deliver_files(self.harness, self.store, reply, entry.key, thread_id)
                if outcome is TurnOutcome.OK:
                    await self.speaker.deliver(reply, entry, spoken, self.metrics)
                if self.choices is not None and outcome is TurnOutcome.OK and left.options:
                    await self.choices.post(entry, thread_id)  # the options, under it
            # Several daemons: the conversation's next turn, journaled elsewhere meanwhile, starts
            # here (unless one is queued here already, which goes first).
            look = self.hand_on is not None and not self.turns.status(entry.conversation)[1]
            if await self.store.journal_done(entry.key, look_next=look) and self.hand_on:
                self.tasks.spawn(self.hand_on(entry), f"hand-on:{entry.key}")
            await quiet.record(self.store, inbound, silent)
            done = reply.channel.capabilities.done_reaction
            if done:
                await self._react(reply.channel, inbound, done)
        except asyncio.CancelledError:
            if typing is not None:
                typing.cancel()
            if not self.turns.was_stopped(entry.key):
                cut = True
                raise  # shutdown: stays 'running' in the journal, resumed at next start
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            outcome = TurnOutcome.STOPPED
            # Buttons posted while the stop was landing (a send under way when /stop withdrew the
            # turn's requests) are withdrawn now: the turn can post nothing more.
            with contextlib.suppress(Exception):
                await self.approvals.withdraw(entry.key, STOPPED_WHY)
            await self._close_plan(plan)
            await self._show_stopped(entry, reply)
        except Exception as exc:
            if typing is not None:
                typing.cancel()
            self.metrics.errors.labels(inbound.platform, type(exc).__name__).inc()
            expected = isinstance(exc, ChannelError | StorageFull)
            log.error("turn %s failed: %s", entry.key, exc, exc_info=not expected)
            parked = False
            if isinstance(exc, ChannelError):
                with contextlib.suppress(Exception):
                    parked = await self.parking.park(entry, exc)
            # the answer did not reach the user (yet)
            outcome = TurnOutcome.PARKED if parked else TurnOutcome.ERROR
            if not parked and answered:
                outcome = TurnOutcome.OK
                await self._after_answer_failed(entry, reply)
            elif not parked:
                await self._close_plan(plan)
                text = (
                    "⚠️ My server's disk is full, so I could not finish this answer. "
                    "I told the admin; please try again later."
                    if isinstance(exc, StorageFull)
                    else "⚠️ Something went wrong on my side while answering. Please try again."
                )
                with contextlib.suppress(Exception):
                    await reply.finish(text)
                with contextlib.suppress(Exception):
                    await self.store.journal_set(entry.key, JournalState.FAILED)
        finally:
            if plan is not None:
                plan.abandon()  # shutdown or fenced: a send under way completes, nothing new starts
            if self.busy is not None:  # the messages steered into it are done with it, or run next
                await self.busy.settle(entry.key, None if cut or outcome is TurnOutcome.FENCED else outcome)
            self.inflight.release(entry.key)
            self.inflight.drop_reply(entry.key)
            self.parking.settled(entry.key)
            self.metrics.turns.labels(outcome).inc()
            tracing.outcome(outcome)
            self.metrics.turn_seconds.observe(time.monotonic() - started)

    def _slot(self, entry: JournalEntry) -> contextlib.AbstractAsyncContextManager[None]:
        """Where the agent works: a background task in a slot of its own, beside the chats'
        (gateway/turns/background.py); any other turn in the one it holds already."""
        if self.background is None:
            return contextlib.nullcontext()
        return self.background.slot(entry, self.turns)

    def _plan(self, reply: Reply, thread_id: str) -> PlanMessage:
        """The turn's checklist (gateway/delivery/plan.py): nothing is sent unless the agent plans."""
        return PlanMessage(reply, self.redact, lambda: self.harness.plan(thread_id))

    @staticmethod
    async def _close_plan(plan: PlanMessage | None) -> None:
        """The checklist in its final state before the answer; a failure here costs the checklist
        its last edit, never the answer."""
        if plan is None:
            return
        try:
            await plan.close()
        except Exception as exc:
            log.warning("could not close the plan's checklist: %s", exc)

    async def _show_stopped(self, entry: JournalEntry, reply: Reply) -> None:
        """The user stopped this turn, and the journal already says so (a pending notice,
        gateway/turns/stopping.py): should this process die before the done mark, the restart shows
        this same reply, once. A send that fails for a reason worth retrying is retried as that
        notice: the stop never ends without a visible outcome."""
        note = self.turns.stop_note(entry.key)  # a message interrupted it: under its text so far
        text = STOPPED if note is None else f"{reply.partial}\n\n{note}" if reply.partial.strip() else note
        try:
            if entry.from_journal:
                await reply.load()  # the stop may have landed while it loaded: edit, not re-send
            await reply.finish(text)
        except ChannelError as exc:
            log.warning("could not show that %s was stopped: %s", entry.key, exc)
            with contextlib.suppress(Exception):
                if await self.parking.park(stopped_notice(entry, note or STOPPED), exc):
                    return
            with contextlib.suppress(Exception):
                await self.store.journal_set(entry.key, JournalState.FAILED)
            return
        except Exception as exc:  # the database: the notice stays pending, a restart shows it
            log.warning("could not show that %s was stopped: %s", entry.key, exc)
            return
        with contextlib.suppress(Exception):
            await self.store.journal_set(entry.key, JournalState.DONE)

    async def _after_answer_failed(self, entry: JournalEntry, reply: Reply) -> None:
        """Something failed after the answer went out (a file the platform refused, the database
        marking the entry done). The answer stays as it is, never replaced by an error, and a note
        under it says what is missing. The entry is done: running it again would answer twice. If
        the database cannot say so now, it is retried in the background; should the daemon stop
        first, the restarted turn finds its parts in the outbox and sends nothing new."""
        with contextlib.suppress(Exception):
            await reply.note(AFTER_ANSWER_PART, AFTER_ANSWER_NOTE)
        try:
            await self.store.journal_set(entry.key, JournalState.DONE)
        except Exception as exc:
            log.warning("could not mark %s done (%s); retrying in the background", entry.key, exc)
            self.tasks.spawn(self._mark_done_later(entry.key), f"done:{entry.key}")

    async def _mark_done_later(self, key: str, tries: int = 60, pause: float = 5.0) -> None:
        for _ in range(tries):
            await asyncio.sleep(pause)
            try:
                await self.store.journal_set(key, JournalState.DONE)
            except Exception:
                continue
            log.info("%s marked done after the database came back", key)
            return
        log.error("could not mark %s done; it may run again after a restart", key)

    async def _agent_turn(
        self,
        entry: JournalEntry,
        thread_id: str,
        uploads: Uploads,
        reply: Reply,
        plan: PlanMessage,
        at_claim: AtClaim | None = None,
    ) -> tuple[str, TurnOutcome, Leftovers]:
        inbound = entry.inbound
        text, final, outcome = "", "", TurnOutcome.OK
        asked, presented, fresh = False, False, False
        message = uploads.message(inbound.text)  # with what a voice note said (gateway/intake/media.py)
        if self.choices is not None:  # a typed "2" answers an open question with its option
            message = await self.choices.typed(entry, thread_id, message)
        message = self.redact(message)  # the daemon's secrets never go to the model provider
        background = BACKGROUND_MARK in inbound.extra  # a background task has its own time limit
        limit = self.config.tasks.timeout if background else self.config.concurrency.turn_timeout
        try:
            options = await turn_options(self.host, entry, thread_id, uploads, at_claim)
            options = masked_context(options, self.redact)
            if self.busy is not None:
                options = self.busy.with_inbox(entry, options)
            async with asyncio.timeout(limit):
                stream = self.approvals.events(
                    entry,
                    thread_id,
                    reply,
                    at_claim,
                    lambda: self.harness.run(
                        thread_id,
                        user_id=inbound.user,
                        message_id=inbound.key,
                        text=message,
                        files=uploads.files,
                        options=options,
                    ),
                )
                async for event in stream:
                    if isinstance(event, FileOut):
                        # Recorded before anything is sent: a replay after a crash still sends it.
                        await self.store.files_add(entry.key, event.path, event.caption)
                        presented = True
                        continue
                    if isinstance(event, PlanUpdated):
                        plan.update(event.items)
                        continue
                    asked = asked or isinstance(event, Clarification)
                    fresh = fresh or (isinstance(event, Final) and event.fresh)
                    text, final, outcome = self._on_event(event, text, final, outcome, reply)
        except TimeoutError:
            took = in_words(limit)
            final, outcome = f"⚠️ This took longer than {took}, so I stopped.", TurnOutcome.TIMEOUT
        if outcome == TurnOutcome.WAITING:
            final = (text + "\n\n" if text else "") + WAITING_NOTE
        elif not final:
            final, outcome = text or "⚠️ The agent ended without an answer.", outcome
        if uploads.notes:
            final = "\n".join(uploads.notes) + "\n\n" + final
        return final, outcome, Leftovers(options=asked or not fresh, files=presented or not fresh)

    @staticmethod
    def _on_event(
        event: AgentEvent,
        text: str,
        final: str,
        outcome: TurnOutcome,
        reply: Reply,
    ) -> tuple[str, str, TurnOutcome]:
        if isinstance(event, TextDelta):
            text += event.text
            reply.stream(text)
        elif isinstance(event, ToolProgress):
            if event.phase == "start" and event.name != PLAN_TOOL:  # the checklist shows the plan
                reply.stream((text + "\n\n" if text else "") + f"🔧 {event.name}…")
        elif isinstance(event, StatusUpdate):
            reply.stream((text + "\n\n" if text else "") + event.text)
        elif isinstance(event, Clarification):
            final = f"❓ {event.question}"
        elif isinstance(event, Final):
            final = final or event.text
        elif isinstance(event, TurnFailed):
            final, outcome = f"⚠️ {event.message}", TurnOutcome.ERROR
        elif isinstance(event, ApprovalRequested):
            outcome = TurnOutcome.WAITING
        return text, final, outcome

    async def _give_up(self, entry: JournalEntry, reply: Reply) -> None:
        """The turn kept dying: a note instead of an answer, and the checklist a run before posted
        (if any) closed from the checkpoint's plan, so it does not look as if work went on."""
        try:
            thread_id = await self.store.thread_for(entry.conversation)
            await self._close_plan(self._plan(reply, thread_id))
        except Exception as exc:  # the note still goes out; say why the checklist stayed open
            why = f"{type(exc).__name__}: {exc}"
            log.warning("could not close the checklist of %s, given up: %s", entry.key, why)
        with contextlib.suppress(Exception):
            await reply.finish("⚠️ I could not finish this answer after several tries. Please ask again.")
        await self.store.journal_set(entry.key, JournalState.FAILED)

    @staticmethod
    async def _react(channel: Channel, inbound: Inbound, emoji: str) -> None:
        with contextlib.suppress(Exception):
            await channel.react(inbound.target, emoji)

    async def _keep_typing(self, reply: Reply) -> None:
        with contextlib.suppress(Exception):
            await asyncio.sleep(TYPING_AFTER)
            while True:
                await reply.channel.typing(reply.target)
                await asyncio.sleep(TYPING_EVERY)


def _answer_only(final: str, uploads: Uploads) -> str:
    """The agent's answer without the notes about the message's files above it (what is spoken)."""
    notes = "\n".join(uploads.notes) + "\n\n" if uploads.notes else ""
    return final.removeprefix(notes)


def masked_context(options: TurnOptions, redact: Redactor) -> TurnOptions:
    """``options`` with the daemon's secrets masked in the thread context it quotes (someone may
    have pasted a token into the thread; the model provider must not get it)."""
    if not options.context:
        return options
    context = tuple(
        dataclasses.replace(c, author=redact(c.author), text=redact(c.text)) for c in options.context
    )
    return dataclasses.replace(options, context=context)
