"""``/schedules`` and ``/unschedule``: list, cancel or confirm this conversation's schedules.

The handlers of the command layer over the schedules below it (gateway/schedules/): cancelling is
:func:`gateway.schedules.runner.cancel` (the agent's tool cancels the same way), confirming is
the :class:`~gateway.schedules.confirm.Confirmations` the command context carries (the same the
Gateway answers button presses with, so both read one clock and wake one runner).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from agent.tools.schedule import ScheduleError
from agent.untrusted import code_span
from channels.base import Inbound
from gateway.schedules.runner import cancel, info_of
from gateway.schedules.times import fmt, rule_text
from gateway.store.schedules import ACTIVE, Schedule
from gateway.turns.quiet import SILENT

if TYPE_CHECKING:
    from gateway.commands.registry import Command, CommandContext
    from gateway.schedules.confirm import Confirmations
    from gateway.store.journal import JournalEntry, Store

LIST_TEXT = 120
"""Characters of a schedule's text a listing shows."""


async def command(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """``/schedules`` lists this conversation's schedules; ``/schedules cancel ID`` and
    ``/unschedule ID`` cancel one (its creator or an admin)."""
    args = cmd.args.split()
    confirm = False
    if cmd.name == "schedules" and args and args[0].lower() in ("cancel", "delete", "rm", "stop", "confirm"):
        confirm, args = args[0].lower() == "confirm", args[1:]
    elif cmd.name == "schedules":
        if args:
            return "Usage: /schedules, /schedules cancel ID or /schedules confirm ID"
        return await _listing(ctx.store, entry.conversation)
    verb = "/schedules confirm" if confirm else "/unschedule"
    if len(args) != 1:
        return f"Usage: {verb} ID (the number /schedules shows)"
    try:
        number = schedule_number(args[0])
        if confirm:
            return await _confirm(ctx.schedules, entry.inbound, number)
        done = await cancel(ctx.store, ctx.config, entry.inbound, number)
    except ScheduleError as exc:
        return f"Cannot {'confirm' if confirm else 'cancel'}: {exc}."
    return f"🗑 Cancelled #{done.id} ({rule_text(done.cron)}): {_short(done.text)}"


_NUMBER = re.compile(r"#?([0-9]+)")
MAX_ID = 2**63 - 1
"""SQL's largest integer: a number beyond it names no schedule."""


def schedule_number(text: str) -> int:
    """A schedule's number as typed (``3`` or ``#3``): ASCII digits only (``str.isdigit`` takes
    ``²`` and ``①``, which ``int`` then refuses), within SQL's integers, else a ScheduleError
    saying what is wrong with it."""
    shown = code_span(text, 40)  # what they typed, shown literally (agent/untrusted.py)
    match = _NUMBER.fullmatch(text.strip())
    if match is None:
        return _bad_number(f"{shown} is not a schedule number: write it in the digits 0-9, like 3")
    number = int(match.group(1))
    if number == 0 or number > MAX_ID:
        return _bad_number(f"{shown} is not a schedule number: they run from 1 to {MAX_ID}")
    return number


def _bad_number(why: str) -> int:
    raise ScheduleError(why)


async def _confirm(confirmations: Confirmations, requester: Inbound, schedule_id: int) -> str:
    """``/schedules confirm ID``: its creator or an admin lets a schedule made after reading
    untrusted content run."""
    schedule = await confirmations.store.schedule_get(schedule_id)
    if schedule is None or schedule.conversation != requester.conversation or schedule.state != ACTIVE:
        raise ScheduleError(f"there is no active schedule #{schedule_id} in this conversation")
    if not schedule.unconfirmed:
        return f"#{schedule_id} needs no confirmation: it runs as scheduled."
    who = (requester.platform, requester.sender_id, requester.chat_id)
    if not confirmations.may_answer(schedule, *who):
        raise ScheduleError(f"only {schedule.creator}, who made #{schedule_id}, or an admin can confirm it")
    return await confirmations.decide(schedule, True, requester.sender_name or requester.user)


async def _listing(store: Store, conversation: str) -> str:
    found = await store.schedules_active(conversation)
    finished = [
        f"#{s.id} ({rule_text(s.cron)}){_last_run(s)}: {_short(s.text)}"
        for s in await store.schedules_finished(conversation)
    ]
    ran = ["Finished recently:", *finished] if finished else []
    if not found:
        return "\n".join(
            ["No schedules in this conversation. Ask me, e.g. “remind me in 2 hours to …”.", *ran]
        )
    lines = [f"Schedules here ({len(found)}):"]
    for s in found:
        info = info_of(s)
        waits = f" — ⚠️ waits for confirmation (/schedules confirm {s.id})" if s.unconfirmed else ""
        lines.append(
            f"#{s.id} — next {info.next_fire} — {info.rule} — by {s.creator}{_last_run(s)}{waits}:"
            f" {_short(s.text)}"
        )
    lines.append("Cancel one with /unschedule ID.")
    return "\n".join([*lines, *ran])


def _last_run(schedule: Schedule) -> str:
    """`` — last run …, silent`` when it ran before: a quiet check-in that posted nothing
    (gateway/turns/quiet.py) still shows that it ran."""
    if schedule.last_run is None:
        return ""
    when = fmt(schedule.last_run, ZoneInfo(schedule.tz))
    how = "silent (nothing to report)" if schedule.last_outcome == SILENT else "posted"
    return f" — last run {when}, {how}"


def _short(text: str) -> str:
    """A schedule's text in a listing: one line, bounded, in a code span (it is the user's or the
    model's text: agent/untrusted.py)."""
    return code_span(text, LIST_TEXT)
