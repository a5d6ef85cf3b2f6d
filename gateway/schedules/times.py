"""The time rules of schedules: delays, dates, zones and cron rules as people and models write them.

Pure functions (no store, no clock of their own), so each rule is tested on its own; every refusal
is a :class:`~agent.tools.schedule.ScheduleError` whose text says what was wrong and how to write
it instead. Numbers are ASCII digits (``[0-9]``, not ``\\d``, which also matches other scripts'
digits).
"""

from __future__ import annotations

import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from agent.tools.schedule import ScheduleError
from gateway.config.durations import in_words

GAP_SAMPLES = 1500
"""Runs of a cron rule checked against ``schedules.min_interval`` (a day of minutes and more)."""
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DELAY = re.compile(
    r"([0-9]+(?:\.[0-9]+)?)\s*(seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d|weeks?|w)(?![a-z])"
)
_DELAY_GLUE = re.compile(r"[\s,]*(?:and)?[\s,]*")


# -- time rules -------------------------------------------------------------------------------------
def parse_delay(text: str) -> float:
    """``2h``, ``90m``, ``1d 3h``, ``45 minutes``, ``1 hour and 30 minutes`` → seconds."""
    s = text.strip().lower().removeprefix("in ").strip()
    total, pos = 0.0, 0
    for m in _DELAY.finditer(s):
        if not _DELAY_GLUE.fullmatch(s[pos : m.start()]):
            break
        total += float(m.group(1)) * _UNIT[m.group(2)[0]]
        pos = m.end()
    if pos == 0 or s[pos:].strip(" ,.") or total <= 0:
        raise ScheduleError(f"cannot read the delay {text!r}; write it like '2h', '90m' or '1d 3h'")
    return total


def zone_of(name: str | None, default: str) -> tuple[ZoneInfo, bool]:
    """The zone ``name`` (or ``default`` when none is given) and whether the default was used."""
    wanted = (name or "").strip()
    try:
        return (ZoneInfo(wanted), False) if wanted else (ZoneInfo(default), True)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown time zone {wanted!r}; use an IANA name such as 'Europe/Berlin' or 'America/New_York'"
        ) from None


def parse_at(text: str, tz: ZoneInfo, now: float) -> float:
    """An ISO 8601 date and time (in ``tz`` unless it has an offset) → epoch seconds, in the future."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ScheduleError(f"cannot read the time {text!r}; use ISO 8601 like '2026-12-24T18:00'") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=tz)
    ts = when.timestamp()
    if ts <= now:
        raise ScheduleError(f"{fmt(ts, tz)} has already passed (it is now {fmt(now, tz)})")
    return ts


def check_cron(expr: str, tz: ZoneInfo, min_interval: float, now: float) -> float:
    """Validate a 5-field cron rule; returns its first run after ``now``."""
    if len(expr.split()) != 5:
        raise ScheduleError(
            f"{expr!r} is not a 5-field cron rule (minute hour day-of-month month day-of-week)"
        )
    try:
        runs = CronSim(expr, datetime.fromtimestamp(now, tz))
        first = next(runs)
    except (CronSimError, StopIteration) as exc:
        raise ScheduleError(f"{expr!r} is not a valid cron rule: {exc or 'it never runs'}") from None
    previous = first
    for _ in range(GAP_SAMPLES):
        following = next(runs, None)
        if following is None:
            break
        if (following - previous).total_seconds() < min_interval:
            raise ScheduleError(
                f"{expr!r} runs more often than once every {in_words(min_interval)}, "
                "which this bot does not allow"
            )
        previous = following
    return first.timestamp()


def next_run(expr: str, tz: ZoneInfo, after: float) -> float:
    """The first run of ``expr`` strictly after ``after``."""
    return next(CronSim(expr, datetime.fromtimestamp(after, tz))).timestamp()


def latest_run(expr: str, tz: ZoneInfo, now: float) -> float:
    """The last run of ``expr`` at or before ``now``."""
    return next(CronSim(expr, datetime.fromtimestamp(int(now) + 1, tz), reverse=True)).timestamp()


def fmt(ts: float, tz: ZoneInfo) -> str:
    return datetime.fromtimestamp(ts, tz).strftime("%a %Y-%m-%d %H:%M %Z")


def rule_text(cron: str | None) -> str:
    if cron is None:
        return "once"
    try:
        return f"cron {cron} ({CronSim(cron, datetime.now()).explain()})"
    except Exception:  # explain() does not cover every rule it can run
        return f"cron {cron}"
