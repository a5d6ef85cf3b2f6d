"""Schedules and pushes: the messages the bot starts itself (docs/schedules.md).

- :class:`GatewayScheduler` is the agent's :class:`~agent.tools.schedule.Scheduler` over the store:
  it checks a request (cron rule, time, zone, limits) and records the schedule with the message
  that created it, whose chat, thread and reply data the firings reuse.
- :class:`ScheduleRunner` fires what is due and picks up ``chital send`` pushes. A firing is a
  journal entry keyed by (schedule, fire time): the insert is the claim, so a firing happens once
  even when the daemon dies between claiming it and moving the schedule on, and the turn then
  runs (and resumes after a crash) like any message, with the outbox keeping its reply single.
- ``/schedules`` and ``/unschedule`` are gateway/commands/schedules.py (with :func:`cancel`).
- A schedule made after the model read untrusted content waits for its owner's confirmation and
  runs with its text quoted as data (gateway/schedules/confirm.py).

Missed runs (the daemon was down): a one-shot fires late; a cron rule fires its latest missed run
once, late, and skips the ones before it. Either way the answer starts with a note that it is late.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from agent.tools.schedule import Caller, ScheduleError, ScheduleInfo, ScheduleRequest
from channels.base import Channel, ChannelState, Inbound
from gateway.config.durations import in_words
from gateway.config.schema import Config
from gateway.delivery.push import PUSH_PLATFORM
from gateway.intake.access import STARTED_BY_BOT, THREAD_ANCHOR, Verdict, decide, is_admin
from gateway.ops.tasks import TaskTracker
from gateway.schedules import confirm as schedule_confirm
from gateway.schedules.clock import ScheduleClock
from gateway.schedules.times import (
    check_cron,
    fmt,
    latest_run,
    next_run,
    parse_at,
    parse_delay,
    rule_text,
    zone_of,
)
from gateway.store.entries import BACKGROUND_MARK, JournalEntry, JournalKind, JournalState, conversation_of
from gateway.store.journal import Store
from gateway.store.limits import OverLimit
from gateway.store.schedules import ACTIVE, PUSH_MARK, SCHEDULE_MARK, Schedule
from gateway.turns import usage

log = logging.getLogger(__name__)

LATE_AFTER = 120.0
"""A firing this many seconds after its time says that it is late."""
MAX_SLEEP = 60.0
"""The runner looks again at least this often, so a jump of the wall clock is noticed soon."""
PUSH_EVERY = 1.0
"""Seconds between two looks for pushes journaled by ``chital send``."""
MAX_AHEAD = timedelta(days=5 * 366)
REPLY_INTO_THREAD = frozenset({"lark"})
"""Platforms whose API posts into a thread only as a reply to one of its messages: a firing there
replies to the message that made the schedule (elsewhere it is a new message in the thread)."""


def info_of(schedule: Schedule, defaulted: bool = False) -> ScheduleInfo:
    tz = ZoneInfo(schedule.tz)
    nxt = fmt(schedule.next_fire, tz) if schedule.next_fire is not None else None
    waits = schedule.provenance.describe() if schedule.unconfirmed else ""
    return ScheduleInfo(schedule.id, schedule.text, rule_text(schedule.cron), schedule.tz, nxt,
                        schedule.creator, defaulted, waits, schedule.provenance.sources)  # fmt: skip


def _template(inbound: Inbound) -> Inbound:
    """The creating message without its text and our own marks: what every firing is built on."""
    ours = (STARTED_BY_BOT, SCHEDULE_MARK, PUSH_MARK, THREAD_ANCHOR, BACKGROUND_MARK)  # a task's: the chat's
    extra = {k: v for k, v in inbound.extra.items() if k not in ours}
    anchor = str(inbound.extra.get(THREAD_ANCHOR) or inbound.message_id)  # made during a firing
    return Inbound(inbound.platform, inbound.chat_id, anchor, inbound.sender_id, "",
                   inbound.is_direct, True, inbound.thread_id, inbound.sender_name, inbound.chat_title,
                   extra=extra)  # fmt: skip


# -- the agent's scheduler --------------------------------------------------------------------------
class GatewayScheduler:
    """:class:`agent.tools.schedule.Scheduler` over the gateway's store."""

    def __init__(self, store: Store, config: Config, clock: ScheduleClock) -> None:
        self.store = store
        self.config = config
        self.clock = clock
        """The schedules' clock; poked when a schedule is added (the runner then looks again)."""
        self._unconfirmed: Callable[[Schedule, ScheduleInfo], None] = lambda s, i: None

    def on_unconfirmed(self, ask: Callable[[Schedule, ScheduleInfo], None]) -> None:
        """``ask`` is called with each new schedule that waits for its owner's confirmation."""
        self._unconfirmed = ask

    @property
    def default_timezone(self) -> str:
        return self.config.schedules.timezone

    async def _origin(self, caller: Caller) -> Inbound:
        """The message being answered: where the schedule's runs will be posted."""
        inbound = await self.store.journal_inbound(caller.message_id)
        if inbound is None or inbound.user != caller.user_id:
            raise ScheduleError("schedules can only be made while answering a chat message")
        # A background task's thread is its own conversation's (``<chat>:bg:<n>``); its schedules
        # are the chat's (``_template`` drops the task's mark, so a firing never poses as the task).
        if await self.store.thread_conversation(caller.thread_id) != conversation_of(inbound):
            raise ScheduleError("this conversation has moved on to a new thread; ask again")
        return inbound

    async def add(self, caller: Caller, request: ScheduleRequest) -> ScheduleInfo:
        limits = self.config.schedules
        text = request.text.strip()
        if not text:
            raise ScheduleError("the schedule needs a text: what to do when it fires")
        if len(text) > limits.max_text_chars:
            raise ScheduleError(f"the text is {len(text)} characters long; at most {limits.max_text_chars}")
        given = [name for name in ("cron", "at", "delay") if (getattr(request, name) or "").strip()]
        if len(given) != 1:
            raise ScheduleError("give exactly one of cron (repeating), at (a date and time) or delay")
        tz, defaulted = zone_of(request.timezone, limits.timezone)
        now = self.clock.now()
        cron = request.cron.strip() if request.cron and request.cron.strip() else None
        if cron is not None:
            first = check_cron(cron, tz, limits.min_interval, now)
        elif request.at and request.at.strip():
            first = parse_at(request.at, tz, now)
        else:
            first = now + parse_delay(request.delay or "")
        if first - now > MAX_AHEAD.total_seconds():
            raise ScheduleError("that is too far ahead (at most 5 years)")
        origin = await self._origin(caller)
        if origin.extra.get(SCHEDULE_MARK) and first - now < limits.min_interval:
            # A firing that schedules its own next run a second later would be a cron rule
            # running every second; chained one-shots obey the same floor as cron rules.
            raise ScheduleError(
                f"a scheduled run may not schedule work due in less than {in_words(limits.min_interval)}"
            )
        key = f"{caller.message_id}#{caller.call_id or int(now * 1e6)}"
        try:  # the limits are counted by the insert itself: they hold across daemons
            schedule, new = await self.store.schedule_add(
                origin=key, template=_template(origin), creator=caller.user_id, text=text, cron=cron,
                tz=tz.key, next_fire=first, provenance=caller.provenance,
                limits=(limits.max_per_conversation, limits.max_per_user),
            )  # fmt: skip
        except OverLimit as over:
            if over.scope == "conversation":
                raise ScheduleError(
                    f"this conversation already has {over.count} schedules (the limit); cancel one first"
                ) from None
            raise ScheduleError(
                f"you already have {over.count} schedules (the limit); cancel one first"
            ) from None
        info = info_of(schedule, defaulted)
        if new:
            log.info("schedule #%d added in %s (%s)%s", schedule.id, schedule.conversation, rule_text(cron),
                     " waiting for confirmation" if schedule.unconfirmed else "")  # fmt: skip
            self.clock.poke()
            if schedule.unconfirmed:
                self._unconfirmed(schedule, info)
        return info

    async def list(self, caller: Caller) -> Sequence[ScheduleInfo]:
        conversation = await self.store.thread_conversation(caller.thread_id)
        if conversation is None:
            return []
        return [info_of(s) for s in await self.store.schedules_active(conversation)]

    async def cancel(self, caller: Caller, schedule_id: int) -> ScheduleInfo:
        origin = await self._origin(caller)
        return info_of(await cancel(self.store, self.config, origin, schedule_id))


async def cancel(store: Store, config: Config, requester: Inbound, schedule_id: int) -> Schedule:
    """Cancel one of ``requester``'s conversation's schedules: only its creator or an admin may."""
    # A number beyond SQL's 64-bit integers (/unschedule 99999999999999999999) names none.
    schedule = await store.schedule_get(schedule_id) if 0 < schedule_id < 2**63 else None
    if schedule is None or schedule.conversation != requester.conversation or schedule.state != ACTIVE:
        raise ScheduleError(f"there is no active schedule #{schedule_id} in this conversation")
    if schedule.creator != requester.user and not is_admin(config.access_for(requester.platform), requester):
        raise ScheduleError(f"only {schedule.creator}, who made #{schedule_id}, or an admin can cancel it")
    return await cancel_as(store, schedule, requester.user)


async def cancel_as(store: Store, schedule: Schedule, actor: str) -> Schedule:
    """End an active schedule once its canceller was allowed, logged with its ``actor`` (a user's
    ``platform:id`` or the console's ``console:admin``): ``/unschedule``, the agent's tool and the
    console's Cancel button."""
    if not await store.schedule_cancel(schedule.id):
        raise ScheduleError(f"schedule #{schedule.id} has just finished or was cancelled")
    log.info("schedule #%d cancelled by %s", schedule.id, actor)
    return schedule


# -- firing -----------------------------------------------------------------------------------------
class Host(Protocol):
    """What the runner uses of the gateway (gateway/daemon/gateway.py has it): the channels, where
    a firing starts its turn and a push is picked up, and the task tracker a confirmation request
    runs on."""

    @property
    def channels(self) -> Mapping[str, Channel]: ...

    async def start_turn(self, inbound: Inbound, note: str = ..., kind: JournalKind = ...) -> bool: ...

    def pick_up(self, entry: JournalEntry) -> bool: ...

    @property
    def tasks(self) -> TaskTracker: ...


class ScheduleRunner:
    """Fires due schedules (sleeping until the next is due, woken by new ones) and delivers
    ``chital send`` pushes. Runs as one of the daemon's background tasks until cancelled.

    Made after the gateway, with the :class:`~gateway.schedules.clock.ScheduleClock` made before
    both: the gateway wakes the runner through it, the runner needs the gateway's ``start_turn``."""

    def __init__(
        self,
        host: Host,
        store: Store,
        config: Config,
        clock: ScheduleClock,
        scheduler: GatewayScheduler | None,
        *,
        push_every: float = PUSH_EVERY,
        max_sleep: float = MAX_SLEEP,
    ) -> None:
        """``max_sleep``: look at the schedules at least this often (with several daemons, shorter:
        a schedule made on another daemon wakes only that one's clock)."""
        self.host = host
        self.store = store
        self.config = config
        self.clock = clock
        self.confirmations = schedule_confirm.Confirmations(store, config, host.channels, clock)
        self.push_every = push_every
        self.max_sleep = max_sleep
        self.enabled = scheduler is not None
        self._push_seen = 0
        if scheduler is not None:
            scheduler.on_unconfirmed(self._ask)
        for channel in host.channels.values():
            channel.add_status_listener(self._on_channel_state)

    def _ask(self, schedule: Schedule, info: ScheduleInfo) -> None:
        ask = self.confirmations.ask(schedule, info.rule, info.next_fire or "")
        self.host.tasks.spawn(ask, f"schedule-confirm:{schedule.id}")

    def _on_channel_state(self, channel: Channel) -> None:
        if channel.state is ChannelState.CONNECTED:
            self.poke()  # what waited for this channel goes out now

    def _live(self) -> list[str]:
        """Channels connected now: firings and pushes wait for theirs (a reconnect wakes us)."""
        return [name for name, ch in self.host.channels.items() if ch.state is ChannelState.CONNECTED]

    def poke(self) -> None:
        """Look at the schedules again now (one was added, or a test moved the clock)."""
        self.clock.poke()

    async def run(self) -> None:
        """Every daemon: pick up ``chital send`` pushes (the journal's lease decides who sends)."""
        await self._push_loop()

    async def run_timers(self) -> None:
        """The daemon that owns the timers only (gateway/daemon/timers.py): fire what is due and
        prune finished schedules. Cancelled when another daemon takes the timers over; a firing
        under way is then claimed or not (its journal insert is the claim), and the next owner
        fires what is due from the rows."""
        loops = [self._prune_loop()]
        if self.enabled:
            loops.append(self._fire_loop())
        await asyncio.gather(*loops)

    async def _prune_loop(self) -> None:
        """Finished schedules go after ``storage.retention_days``, at the journal's pace."""
        storage = self.config.storage
        while True:
            try:
                gone = await self.store.schedules_prune(storage.retention_days * 86400)
                if gone:
                    log.info("schedules: %d finished schedule(s) pruned", gone)
            except Exception as exc:
                log.warning("schedules: prune failed: %s", exc)
            await asyncio.sleep(storage.prune_interval)

    async def _fire_loop(self) -> None:
        while True:
            try:
                await self.fire_due()
                due = await self.store.schedule_next_time(self._live())
            except Exception as exc:  # the database may be busy or full: try again in a while
                log.error("schedules: %s", exc, exc_info=True)
                due = None
            cap = self.max_sleep
            await self.clock.sleep(cap if due is None else min(cap, due - self.clock.now()))

    async def fire_due(self) -> int:
        """Fire every due schedule of the channels connected now (the others wait for theirs to
        connect, or to be switched on), once each. Returns how many fired."""
        fired = 0
        for schedule in await self.store.schedules_due(self.clock.now(), self._live()):
            if not await self._fire(schedule):
                break  # the gateway is closing
            fired += 1
        return fired

    async def _fire(self, schedule: Schedule) -> bool:
        assert schedule.next_fire is not None
        now, due, tz = self.clock.now(), schedule.next_fire, ZoneInfo(schedule.tz)
        fire_at, after, skipped = due, None, 0
        if schedule.cron is not None:
            fire_at = max(due, latest_run(schedule.cron, tz, now))
            after = next_run(schedule.cron, tz, max(now, fire_at))
            if fire_at > due:
                if await self.store.journal_seen(self._key(schedule, due)):
                    # A previous run claimed ``due`` and died before moving on: that firing resumes
                    # from the journal; the runs missed since are skipped, not fired as well.
                    await self.store.schedule_advance(schedule.id, due, after)
                    return True
                skipped = _count_runs(schedule.cron, tz, due, fire_at)
        inbound = self._inbound(schedule, fire_at)
        note = _late_note(fire_at, now, tz, skipped)
        if not await self._allowed(schedule, inbound):
            return True
        kind = JournalKind.TURN
        refusal = await self._budget_refusal(inbound)
        if refusal is not None:  # the note instead of the turn, once for this run
            kind, note = JournalKind.NOTICE, f"⏰ Scheduled task #{schedule.id} was not run. {refusal}"
        if not await self.host.start_turn(inbound, note, kind):
            if not await self.store.journal_seen(inbound.key):
                return False  # closing: not claimed, the next start fires it
        log.info("schedule #%d fired (%s)", schedule.id, inbound.key)
        await self.store.schedule_advance(schedule.id, due, after)
        return True

    async def _allowed(self, schedule: Schedule, inbound: Inbound) -> bool:
        """The creator may still talk to the bot there (a revoked user's, or a group's that was
        removed from access, schedules must not go on running the agent in their name): else the
        schedule is cancelled."""
        policy = self.config.access_for(inbound.platform)
        decision = await decide(inbound, policy, self.store, True)
        if decision.verdict is Verdict.ALLOW:
            return True
        if await self.store.schedule_cancel(schedule.id):
            log.warning(
                "schedule #%d cancelled: %s may no longer use the bot in %s (%s)",
                schedule.id, schedule.creator, schedule.conversation, decision.verdict.value,
            )  # fmt: skip
        return False

    async def _budget_refusal(self, inbound: Inbound) -> str | None:
        """A firing spends the creator's daily token budget like a message they send."""
        config = self.config
        admin = is_admin(config.access_for(inbound.platform), inbound)
        return await usage.budget_refusal(self.store, config, inbound.user, admin)

    @staticmethod
    def _key(schedule: Schedule, fire_at: float) -> str:
        return _firing(schedule, fire_at).key

    def _inbound(self, schedule: Schedule, fire_at: float) -> Inbound:
        base = _firing(schedule, fire_at)
        tz = ZoneInfo(schedule.tz)
        rule = "a one-time schedule" if schedule.cron is None else f"the repeating schedule {schedule.cron}"
        if schedule.provenance.tainted:  # quoted, with where it came from
            return _with_text(base, schedule_confirm.firing_text(schedule, rule, fmt(fire_at, tz)))
        header = (
            f"[Scheduled task #{schedule.id} ({rule}, {schedule.tz}), set by {schedule.creator}; due "
            f"{fmt(fire_at, tz)}. Do it now: your answer is posted to this chat as a new message. For a "
            "reminder, write the reminder itself.]"
        )
        return _with_text(base, f"{header}\n{schedule.text}")

    # -- pushes from `chital send` -----------------------------------------------------------------
    async def _push_loop(self) -> None:
        while True:
            try:
                await self.pick_up_pushes()
            except Exception as exc:
                log.error("pushes: %s", exc)
            await asyncio.sleep(self.push_every)

    async def pick_up_pushes(self) -> int:
        """Dispatch the pushes journaled since the last look; returns how many were started."""
        started = 0
        pending = await self.store.journal_pending_after(self._push_seen, JournalKind.NOTICE)
        for rowid, inbound, note in pending:
            self._push_seen = rowid
            if not inbound.extra.get(PUSH_MARK):
                continue
            entry = JournalEntry(inbound.key, inbound.conversation, JournalKind.NOTICE, inbound,
                                 JournalState.PENDING, note=note, from_journal=True)  # fmt: skip
            if inbound.platform not in self._live() and inbound.platform != PUSH_PLATFORM:
                # Left pending: the gateway's resume sends it when the channel (re)connects.
                log.info("push %s waits for channel %s", inbound.key, inbound.platform)
            elif self.host.pick_up(entry):
                started += 1
        return started


def _firing(schedule: Schedule, fire_at: float) -> Inbound:
    t = schedule.template
    extra = {**t.extra, STARTED_BY_BOT: True, SCHEDULE_MARK: schedule.id}
    extra.update(schedule_confirm.firing_extra(schedule))  # a tainted one's sources go on
    if t.platform in REPLY_INTO_THREAD and t.thread_id:
        extra[THREAD_ANCHOR] = t.message_id  # the message that made the schedule, in that thread
    return Inbound(t.platform, t.chat_id, f"schedule-{schedule.id}-{int(fire_at)}", t.sender_id, "",
                   t.is_direct, True, t.thread_id, t.sender_name, t.chat_title, extra=extra)  # fmt: skip


def _with_text(inbound: Inbound, text: str) -> Inbound:
    return Inbound(inbound.platform, inbound.chat_id, inbound.message_id, inbound.sender_id, text,
                   inbound.is_direct, True, inbound.thread_id, inbound.sender_name, inbound.chat_title,
                   extra=inbound.extra)  # fmt: skip


def _count_runs(cron: str, tz: ZoneInfo, start: float, end: float, limit: int = 10_000) -> int:
    """Runs of ``cron`` in [start, end): the ones a late firing skips."""
    count, t = 1, start
    for _ in range(limit):
        t = next_run(cron, tz, t)
        if t >= end:
            break
        count += 1
    return count


def _late_note(fire_at: float, now: float, tz: ZoneInfo, skipped: int) -> str:
    if now - fire_at < LATE_AFTER:
        return ""
    note = f"⏰ Late: this was due {fmt(fire_at, tz)}; I was offline then."
    if skipped:
        note += f" {skipped} earlier run(s) missed meanwhile were skipped."
    return note
