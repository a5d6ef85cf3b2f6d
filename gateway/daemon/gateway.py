"""The gateway proper: intake (access, commands, journal), turns through the harness, delivery.

This is the one place where a channel's message meets the agent. The order of operations is the
design's backbone: decide → journal → (only then may the adapter acknowledge) → queue → run → deliver →
mark done. Whatever is journaled and not done is resumed at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.base import (
    Action,
    ActionAnswer,
    Channel,
    ChannelError,
    ChannelState,
    Inbound,
    InboundSink,
)
from gateway.agent_api import AgentHarness, sandbox_report
from gateway.commands import builtin as commands
from gateway.commands import skills as commands_skills
from gateway.config.schema import Config
from gateway.config.secrets import redactor_for
from gateway.daemon import command_io
from gateway.daemon.cluster import Leases
from gateway.delivery.pacing import PacerPool
from gateway.delivery.parking import Parking
from gateway.delivery.push import PUSH_PLATFORM, PushSender
from gateway.delivery.reply import Reply
from gateway.intake import access, profiles
from gateway.intake.access import Verdict, decide, is_admin
from gateway.intake.limits import Throttles
from gateway.intake.pairing import Pairing
from gateway.intake.slow_lane import FairLane
from gateway.ops import tracing
from gateway.ops.metrics import Metrics
from gateway.ops.tasks import TaskTracker
from gateway.schedules import confirm as schedule_confirm
from gateway.schedules.clock import ScheduleClock
from gateway.store.entries import AtClaim, JournalEntry, JournalKind, JournalState
from gateway.store.journal import Store
from gateway.turns import busy, choices, queued_sign, quiet, stopping, usage
from gateway.turns.approvals import Approvals
from gateway.turns.choices import Choices
from gateway.turns.inflight import InFlight
from gateway.turns.queue import TurnQueue
from gateway.turns.runner import TurnRunner

log = logging.getLogger(__name__)


class Gateway:
    def __init__(self, config: Config, store: Store, harness: AgentHarness, metrics: Metrics,
                 *, schedule_clock: ScheduleClock | None = None, cluster: Leases | None = None,
                 tasks: TaskTracker | None = None,
                 ) -> None:  # fmt: skip
        self.config = config
        self.store = store
        self.harness = harness
        self.metrics = metrics
        self.channels: dict[str, Channel] = {}
        self.redact = redactor_for(config)
        """Masks the daemon's secrets; every attached channel sends through it (channels/egress.py)."""
        self.turns = TurnQueue(
            config.concurrency.max_turns, self._run_claimed, metrics, lambda e: stopping.show_stopped(self, e)
        )
        self.slow_lane = FairLane(config.transcription.concurrency, config.transcription.per_user)
        """Transcriptions, outside the turn slots, fair per user (gateway/intake/slow_lane.py)."""
        self._pacers = PacerPool()
        self.tasks = tasks if tasks is not None else TaskTracker()
        """The gateway's background tasks: a child of the daemon's one tracker (gateway/ops/tasks.py)."""
        self.throttles = Throttles(config)
        """Pairing reminders and announcements, wrong codes, the per-user rate (gateway/intake/limits.py)."""
        self._pairing = Pairing(config, store, self.throttles, metrics, self._journal_notice, self.tell)
        """What a stranger in a DM gets (gateway/intake/pairing.py)."""
        self.inflight = InFlight(self._new_reply)
        """Journal keys handled by this process right now (queued, running or sending) and their live
        replies, shared by the queued sign, the turn, approvals and /stop (gateway/turns/inflight.py)."""
        self.signs = queued_sign.SignOrder()
        """Queued signs go out per conversation in order, below the answers ahead (turns/queued_sign.py)."""
        self.parking = Parking(store, metrics, config.delivery.retry_window, self._dispatch)
        self.push = PushSender(config, store, self.redact, self._keep, metrics)
        """Bark and ntfy targets: journaled notices sent over HTTP (gateway/delivery/push.py)."""
        self.approvals = Approvals(
            config, store, harness, metrics, self.channels, self.inflight, self.tasks, self._dispatch
        )
        """Tool calls waiting for a person's yes (gateway/turns/approvals.py)."""
        self.busy = busy.Busy(self)  # a message for a conversation whose turn runs (gateway/turns/busy.py)
        self.runner = TurnRunner(
            config=config, store=store, harness=harness, metrics=metrics, turns=self.turns,
            inflight=self.inflight, approvals=self.approvals, parking=self.parking, tasks=self.tasks,
            redact=self.redact, keep=self._keep, host=self, busy=self.busy,
        )  # fmt: skip
        """Runs each claimed turn (gateway/turns/runner.py)."""
        self.choices = Choices(config, store, harness, self.channels, self.start_turn)
        self.runner.choices = self.choices  # a question's options as buttons (gateway/turns/choices.py)
        if cluster is not None:
            self.runner.hand_on = self.hand_on
        self._connected: set[str] = set()
        self.schedule_clock = schedule_clock or ScheduleClock()  # shared with the ScheduleRunner
        self.confirmations = schedule_confirm.Confirmations(store, config, self.channels, self.schedule_clock)
        self._closing = False
        self.cluster = cluster
        """This daemon's leases, several sharing one database (gateway/daemon/cluster.py); None: alone."""
        self.approvals.timers.owned = cluster is None  # of several: the leader's (gateway/daemon/timers.py)
        self._claimed: dict[str, asyncio.Task[Any]] = {}
        """Entries whose lease this daemon took and works on now, with the task doing the work."""

    # -- wiring ---------------------------------------------------------------------------------
    def attach(self, channel: Channel) -> InboundSink:
        self.channels[channel.name] = channel
        channel.egress = self.redact
        channel.add_status_listener(self._on_channel_state)
        channel.on_action(self._on_action)
        malformed = self.metrics.malformed
        channel.on_malformed(lambda kind: malformed.labels(channel.name, kind).inc())
        return self.accept

    async def _on_action(self, action: Action) -> ActionAnswer:
        """A button press: a schedule's confirmation (gateway/schedules/confirm.py) or an approval."""
        if action.value.startswith(f"{schedule_confirm.PREFIX}:"):
            return await self.confirmations.on_action(action)
        if action.value.startswith(f"{commands_skills.PREFIX}:"):  # a draft skill's approval
            return await commands_skills.on_action(self.config, self.channels, action)
        if action.value.startswith(f"{choices.PREFIX}:"):  # an option of a question
            return await self.choices.on_action(action)
        return await self.approvals.on_action(action)

    def _on_channel_state(self, channel: Channel) -> None:
        """Every time a channel (re)connects, whatever waits for it goes out now: the previous
        run's unfinished entries at start-up, and replies parked by an outage since."""
        if channel.state is not ChannelState.CONNECTED:
            self._connected.discard(channel.name)
        elif channel.name not in self._connected and not self._closing:
            self._connected.add(channel.name)
            self.tasks.spawn(self.resume(channel.name), f"resume:{channel.name}")

    def _new_reply(self, entry: JournalEntry) -> Reply:
        channel = self.channels[entry.inbound.platform]
        rate_limited = self.metrics.rate_limited.labels(channel.name).inc
        pacer = self._pacers.get(channel.name, entry.inbound.chat_id, channel.capabilities, rate_limited)
        target = entry.inbound.target
        if entry.inbound.extra.get(access.STARTED_BY_BOT):
            # Nothing to reply to, unless a thread is reached only that way (access.THREAD_ANCHOR).
            target = dataclasses.replace(target, reply_to=entry.inbound.extra.get(access.THREAD_ANCHOR))
        return Reply(
            channel,
            target,
            entry.key,
            self.store,
            pacer,
            self.metrics,
            stream=self.config.delivery.stream and quiet.streams(entry.inbound),  # firings, background: no
            first_delay=self.config.delivery.first_edit_delay,
        )

    # -- intake ---------------------------------------------------------------------------------
    async def accept(self, inbound: Inbound) -> None:
        """The sink every channel calls. Returns once the message is journaled (or dropped)."""
        if not tracing.active():
            return await self._accept(inbound)
        with tracing.message(inbound):  # the message's root span (gateway/ops/tracing.py)
            return await self._accept(inbound)

    async def _accept(self, inbound: Inbound) -> None:
        name = inbound.platform
        if self._closing:
            # Not journaled and not acknowledged: the platform redelivers it after the restart.
            raise ChannelError("gateway is shutting down")
        if inbound.unreadable:
            # An event the adapter could not parse or journal (and has skipped): counted here; the
            # sender is told below, when the adapter recovered who and where it came from.
            self.metrics.messages_ignored.labels(name, "malformed").inc()
            if not (inbound.chat_id and inbound.sender_id and inbound.message_id):
                return
        policy = self.config.access_for(name)
        engaged = False
        if not inbound.is_direct and not inbound.addressed and inbound.thread_id:
            engaged = await self.store.thread_get(inbound.conversation) is not None
        decision = await decide(inbound, policy, self.store, engaged)

        if decision.verdict is Verdict.IGNORE:
            self.metrics.messages_ignored.labels(name, "not_for_bot").inc()
            return
        if decision.verdict is Verdict.PAIR:
            await self._pairing(inbound)
            return
        if decision.verdict is Verdict.DENY:
            await self._journal_notice(
                inbound, "Sorry, I only answer people I know. Send me a direct message to ask for access."
            )
            return
        admin = is_admin(policy, inbound)
        if admin and inbound.is_direct:  # where to tell them of pairing requests (Discord, Lark)
            await self.store.dm_chat_remember(inbound.user, inbound.chat_id)
        if inbound.unsupported:
            # Something the agent cannot use (a sticker, a game) or could not read: a journaled note
            # says so, instead of the empty-message note or an agent turn on nothing.
            kind = inbound.unsupported
            if inbound.unreadable and self.throttles.unreadable_notes.hit(inbound.user):
                self.metrics.messages_ignored.labels(name, "malformed_quiet").inc()
                return  # told a moment ago: a flood of unreadable events gets no flood of notes
            if inbound.unreadable:
                note = ("⚠️ I couldn't read that message (it arrived in a form I can't parse); "
                        "please send it again in another form.")  # fmt: skip
            else:
                what = kind if kind.endswith("s") or " " in kind else f"{kind}s"  # "sticker" too
                note = f"I can't use {what} yet; please describe what you need in words."
            await self._journal_notice(inbound, note)
            return

        answer = await self.approvals.text_answer(inbound)  # "approve CODE" where there are no buttons
        if answer is not None:
            await self._journal_notice(inbound, answer)
            return
        text = inbound.text.strip()
        command = commands.parse_command(text)
        command, asked, inbound = busy.one_off(command, inbound)  # `/steer text`: a turn in that mode
        if command is not None and not command.known and profiles.skill_for(self.config, text):
            command = None  # `/<skill> text`: a turn with that skill (gateway/intake/profiles.py)
        if command is not None:
            if command.known:
                if await self._journal(inbound, JournalKind.COMMAND):
                    entry = JournalEntry.new(inbound, JournalKind.COMMAND)
                    self._dispatch(entry)
            else:
                await self._journal_notice(inbound, commands.unknown_text(command.name))
            return
        limit = self.config.limits.max_message_chars
        if len(text) > limit:
            await self._journal_notice(
                inbound,
                f"⚠️ Your message is {len(text):,} characters long; I take at most {limit:,}. "
                "Please shorten it or send it as a file.",
            )
            return
        if not text and not inbound.attachments:
            await self._journal_notice(inbound, "I received an empty message. What can I do for you?")
            return
        _, waiting = self.turns.status(inbound.conversation)
        refusal = self.throttles.refusal(inbound.user, waiting, admin)
        if refusal is None:  # today's token budget spent (gateway/turns/usage.py)
            refusal = await usage.budget_refusal(self.store, self.config, inbound.user, admin)
        if refusal is not None:  # queue full or sending too fast: a note, journaled, sent once
            await self._journal_notice(inbound, refusal)
            return
        inbound, route = await self.busy.route(inbound, admin, asked)  # at once when nothing runs there
        lease = self._intake_lease()
        fresh, leased, at_claim = await self._journal_leased(inbound, JournalKind.TURN, "", lease)
        if fresh:
            entry = JournalEntry.new(inbound, JournalKind.TURN)
            entry.at_claim, entry.started = at_claim, at_claim is not None  # claimed by its insert
            await self.busy.journaled(entry, route)
            if leased or lease is None:
                self._dispatch(entry)
            # else: it waits behind another daemon's turn of this conversation; that daemon hands
            # it on when it finishes (hand_on), or a sweep takes it.

    async def hand_on(self, done: JournalEntry) -> None:
        """Start here the next turn of ``done``'s conversation, which another daemon journaled
        while this one ran ``done`` (docs/scale-out.md, "What coordination costs")."""
        if self.cluster is None:
            return
        try:
            entry = await self.cluster.claim_next(done.conversation)
            if entry is not None and not self.pick_up(entry) and not self.handles(entry.key):
                await self.cluster.release(entry)  # closing, or its channel is down here
        except Exception as exc:  # the sweep takes it instead
            log.warning("could not hand on %s's next turn: %s", done.conversation, exc)

    async def _journal(self, inbound: Inbound, kind: JournalKind, note: str = "") -> bool:
        return (await self._journal_leased(inbound, kind, note, self._intake_lease()))[0]

    async def _journal_leased(
        self, inbound: Inbound, kind: JournalKind, note: str, lease: tuple[str, float] | None
    ) -> tuple[bool, bool, AtClaim | None]:
        """Journal ``inbound`` (False: a redelivery), whether it got ``lease``, a turn's claim if made."""
        with tracing.journal_write(inbound):
            fresh, leased, at_claim = await self.store.journal_add_turn(inbound, kind, note, lease, True)
        if fresh:
            self.metrics.messages_in.labels(inbound.platform).inc()
        else:
            self.metrics.messages_ignored.labels(inbound.platform, "duplicate").inc()
            log.info("duplicate delivery of %s ignored", inbound.key)
        return fresh, leased, at_claim

    async def _journal_notice(self, inbound: Inbound, note: str) -> None:
        if await self._journal(inbound, JournalKind.NOTICE, note):
            entry = JournalEntry.new(inbound, JournalKind.NOTICE, note)
            self._dispatch(entry)

    async def tell(self, platform: str, chat_id: str, tag: str, text: str) -> None:
        """Send ``text`` into ``chat_id`` unprompted (an admin's DM, a stranger's), once per
        ``tag``: journaled as a notice keyed by chat and tag, so a re-run or restart sends it once."""
        if not chat_id or platform not in self.channels:
            return
        inbound = Inbound(
            platform=platform,
            chat_id=chat_id,
            message_id=tag,
            sender_id="",
            text="",
            is_direct=True,
            addressed=True,
            extra={access.STARTED_BY_BOT: True},
        )
        if await self.store.journal_add(inbound, JournalKind.NOTICE, text, self._intake_lease()):
            self._dispatch(JournalEntry.new(inbound, JournalKind.NOTICE, text))

    async def start_turn(
        self, inbound: Inbound, note: str = "", kind: JournalKind = JournalKind.TURN
    ) -> bool:
        """Journal and run a turn the gateway starts itself (a schedule firing, gateway/schedules/runner.py),
        once per key; ``note`` is shown above the answer (with ``kind`` NOTICE: it is the answer).
        False when the key is already journaled, its channel is not here, or the gateway is closing
        (then nothing is journaled)."""
        if self._closing or inbound.platform not in self.channels:
            return False
        if not await self.store.journal_add(inbound, kind, note, self._intake_lease()):
            return False
        self._dispatch(JournalEntry.new(inbound, kind, note))
        return True

    def pick_up(self, entry: JournalEntry) -> bool:
        """Handle an entry another process journaled (``chital send``, another daemon); False when
        its channel is not connected here (the next connect resumes it) or this process already
        handles it."""
        return self.connected(entry.inbound.platform) and self._dispatch(entry)

    def handles(self, key: str) -> bool:
        """This process is handling ``key`` now (queued, running or sending)."""
        return key in self.inflight

    def connected(self, platform: str) -> bool:
        """The channel is here and connected (what a resume waits for). Push targets wait for
        nothing (gateway/delivery/push.py): one no longer in the config fails with that reason."""
        return platform in self._connected or platform == PUSH_PLATFORM

    def _submit(self, entry: JournalEntry) -> None:
        ahead = self.turns.submit(entry)
        if ahead:
            self.tasks.spawn(queued_sign.show(self, entry, ahead), f"queued:{entry.key}")

    # -- dispatch, retry and resume -------------------------------------------------------------
    def _dispatch(self, entry: JournalEntry) -> bool:
        """Start handling ``entry`` unless this process already is; False when it was."""
        if self._closing or not self.inflight.take(entry.key):
            return False
        self.parking.unpark(entry.key)
        if entry.kind == JournalKind.TURN:
            self._submit(entry)
        elif entry.kind == JournalKind.NOTICE and entry.inbound.platform == PUSH_PLATFORM:
            self.tasks.spawn(self.release_after(entry, self.push.deliver), f"push:{entry.key}")
        elif entry.kind == JournalKind.NOTICE:
            self.tasks.spawn(self.release_after(entry, self.send_notice), f"notice:{entry.key}")
        else:
            cmd = commands.parse_command(entry.inbound.text)
            if cmd is None:
                self.inflight.release(entry.key)
                return False
            self.tasks.spawn(
                self.release_after(entry, lambda e: self._run_command(e, cmd)), f"cmd:{entry.key}"
            )
        return True

    def _intake_lease(self) -> tuple[str, float] | None:
        busy = self.turns.running_count + self.turns.queued_count >= self.config.concurrency.max_turns
        return None if self.cluster is None else self.cluster.intake_lease(busy)

    async def _claim(self, entry: JournalEntry, start: bool = False) -> bool:
        """This daemon may work on ``entry`` (always, when it is alone). ``start``: a turn about to
        run, which the claim marks running too (``entry.started``)."""
        if self.cluster is None:
            return True
        if await self.cluster.claim(entry, self.claimed(), start):
            task = asyncio.current_task()
            if task is not None:
                self._claimed[entry.key] = task
            return True
        log.debug("%s is another daemon's (or waits behind one's turn); left to it", entry.key)
        await self.cluster.release(entry)  # taken at intake, maybe: let the others' sweeps have it
        return False

    async def _run_claimed(self, entry: JournalEntry) -> None:
        try:
            claimed = await self._claim(entry, start=True)
        except Exception as exc:  # the database is unreachable: leave it to the next sweep
            log.warning("could not claim %s: %s", entry.key, exc)
            claimed = False
        if claimed:
            try:
                await self.runner.run(entry)
            finally:
                self._claimed.pop(entry.key, None)
        else:
            self.inflight.release(entry.key)

    def claimed(self) -> set[str]:
        """Keys of the entries this daemon holds the lease of and works on now (gateway/daemon/cluster.py)."""
        return set(self._claimed)

    def cut(self, keys: set[str]) -> int:
        """Stop working on ``keys`` at once, silently: their leases lapsed or another daemon holds
        them now, and that daemon answers. Their journal entries stay as they are (a shutdown's
        cut). Returns how many were running here."""
        cut = 0
        for key in keys:
            task = self._claimed.pop(key, None)
            if task is None or task.done():
                continue
            reply = self.inflight.live(key)
            if reply is not None:
                reply.abandon()  # its streaming edits stop too
            task.cancel()
            cut += 1
        return cut

    async def holds(self, entry: JournalEntry) -> bool:
        """This daemon holds ``entry``'s lease (always, when it is alone)."""
        return self.cluster is None or await self.cluster.holds(entry)

    async def _keep(self, entry: JournalEntry) -> bool:
        """Just before an answer goes out: still this daemon's to send (gateway/daemon/cluster.py)."""
        if self.cluster is None or await self.cluster.keep(entry):
            return True
        self.cut({entry.key})  # fenced (logged there): the daemon holding the lease answers
        return False

    async def release_after(
        self, entry: JournalEntry, work: Callable[[JournalEntry], Awaitable[None]]
    ) -> None:
        """Claim ``entry``, do ``work`` on it, and let go of it here whatever happens."""
        try:
            if await self._claim(entry):
                await work(entry)
        finally:
            self.inflight.release(entry.key)
            self._claimed.pop(entry.key, None)

    async def resume(self, platform: str) -> int:
        """Dispatch the open entries of ``platform`` this process is not handling: what a previous
        run left unfinished, and what an outage parked. Runs at every (re)connect. Returns how many."""
        await self.approvals.restore(platform)
        entries = [e for e in await self.store.journal_open() if e.inbound.platform == platform]
        started = sum(self._dispatch(e) for e in entries)
        if started:
            log.info("resuming %d unfinished %s message(s) from the journal", started, platform)
        return started

    # -- commands and notices -------------------------------------------------------------------
    async def send_notice(self, entry: JournalEntry) -> None:
        await self._deliver_fixed(entry, entry.note)  # a notice's note is its whole reply

    async def _deliver_fixed(self, entry: JournalEntry, text: str) -> None:
        try:
            reply = self.inflight.reply(entry)
            await reply.load()
            if not await self._keep(entry):
                return
            await reply.finish(text)
            await self.store.journal_set(entry.key, JournalState.DONE)
        except Exception as exc:
            self.metrics.errors.labels(entry.inbound.platform, "delivery").inc()
            if isinstance(exc, ChannelError) and await self.parking.park(entry, exc):
                return
            log.error("could not deliver a notice for %s: %s", entry.key, exc)
            with contextlib.suppress(Exception):
                await self.store.journal_set(entry.key, JournalState.FAILED)
        finally:
            self.inflight.drop_reply(entry.key)
            self.parking.settled(entry.key)

    def command_context(self) -> commands.CommandContext:
        """What command handlers may use (gateway/commands/registry.py): narrow parts, not the Gateway."""
        return commands.CommandContext(
            config=self.config,
            store=self.store,
            harness=self.harness,
            bad_codes=self.throttles.bad_codes,
            tell=self.tell,
            stop=lambda entry: stopping.stop(self, entry),
            cancel_approvals=self.approvals.cancel,
            turn_status=self.turns.status,
            running_turns=lambda: self.turns.running_count,
            sandbox_state=lambda: sandbox_report(self.harness)["state"],
            schedules=self.confirmations,
            download=command_io.downloader(self.channels),
            buttons=command_io.button_poster(self.channels),
            decide_approval=self.approvals.decide_as_operator,
            busy_changed=self.busy.forget,
            background=self.runner.background,
        )

    async def _run_command(self, entry: JournalEntry, cmd: commands.Command) -> None:
        """Run a command (gateway/commands/builtin.py: once per journal key) and deliver its reply."""
        try:
            text = await commands.execute(self.command_context(), entry, cmd)
        except Exception as exc:
            log.error("command /%s of %s failed: %s", cmd.name, entry.key, exc, exc_info=True)
            text = f"⚠️ Something went wrong on my side running /{cmd.name}. Please try again."
        await self._deliver_fixed(entry, text)
        with contextlib.suppress(Exception):
            await self.store.command_result_drop(entry.key)  # kept while the entry may run again

    # -- shutdown -------------------------------------------------------------------------------
    def stop_intake(self) -> None:
        """Take in and start nothing more, as while closing: what a channel delivers now is not
        journaled nor acknowledged (its platform delivers it again, to another daemon). For a
        daemon whose database schema moved beyond what it may write (gateway/daemon/cluster.py)."""
        self._closing = True
        self.parking.close()

    async def close(self, grace: float) -> int:
        self._closing = True
        self.parking.close()  # parked entries stay pending in the journal: the next start resumes them
        self.approvals.close()  # waiting entries and their requests stay in the store
        cut = await self.turns.drain(grace)
        await self.tasks.close()
        await self.push.close()
        return cut
