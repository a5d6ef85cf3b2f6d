"""Schedules and pushes (gateway/schedules/runner.py, gateway/cli/send.py, agent/tools/schedule.py).

In process: the real gateway, store and runner with a FakeChannel and a FakeHarness whose turns
call the real :class:`GatewayScheduler`, and a clock the test moves. End to end (at the bottom): a
``chital run`` subprocess with the fake Telegram server and the fake model, which calls the
schedule tool itself.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from agent.provenance import MESSAGE, WEB_PAGE, Provenance, Source
from agent.tools.schedule import ScheduleError
from channels.base import ChannelError, ChannelState, Inbound
from gateway.cli.send import Refused, parse_target, push_inbound
from gateway.schedules.runner import (
    ScheduleRunner,
    check_cron,
    latest_run,
    next_run,
    parse_at,
    parse_delay,
    zone_of,
)
from gateway.store.entries import JournalKind
from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.fake_channel import FakeChannel
from tests.fakes.gateway_rig import ADMIN, USER, crash, dm, fake_rig, make_config, quiet, settled, until
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.schedules_support import OTHER, Clock, Scheduled, chat_posts, command, schedules_config

BERLIN = ZoneInfo("Europe/Berlin")


# -- the time rules ---------------------------------------------------------------------------------
def test_delays_in_the_forms_people_write() -> None:
    assert parse_delay("2h") == 7200
    assert parse_delay("in 90m") == 5400
    assert parse_delay("1d 3h") == 86400 + 3 * 3600
    assert parse_delay("1 hour and 30 minutes") == 5400
    assert parse_delay("45 seconds") == 45
    for bad in ("soon", "2 fortnights", "-5m", "2h tomorrow", "0m"):
        with pytest.raises(ScheduleError, match="cannot read the delay"):
            parse_delay(bad)


def test_zones_times_and_cron_rules_are_checked() -> None:
    assert zone_of(None, "Europe/Berlin") == (BERLIN, True)
    assert zone_of("America/New_York", "UTC")[1] is False
    with pytest.raises(ScheduleError, match="unknown time zone 'Mars/Olympus'"):
        zone_of("Mars/Olympus", "UTC")
    now = datetime(2026, 11, 23, 12, 0, tzinfo=BERLIN).timestamp()
    assert parse_at("2026-11-24T09:00", BERLIN, now) == datetime(2026, 11, 24, 9, tzinfo=BERLIN).timestamp()
    assert (
        parse_at("2026-11-24T09:00+00:00", BERLIN, now)
        == datetime(2026, 11, 24, 10, tzinfo=BERLIN).timestamp()
    )
    with pytest.raises(ScheduleError, match="already passed"):
        parse_at("2026-11-23T11:00", BERLIN, now)
    with pytest.raises(ScheduleError, match="cannot read the time"):
        parse_at("next tuesday", BERLIN, now)
    with pytest.raises(ScheduleError, match="not a 5-field cron rule"):
        check_cron("*/5 * * * * *", BERLIN, 60, now)
    with pytest.raises(ScheduleError, match="not a valid cron rule"):
        check_cron("0 25 * * *", BERLIN, 60, now)
    with pytest.raises(ScheduleError, match="more often than once every 10 minute"):
        check_cron("0,5 9 * * *", BERLIN, 600, now)
    first = check_cron("0 9 * * 1-5", BERLIN, 60, now)
    assert datetime.fromtimestamp(first, BERLIN) == datetime(2026, 11, 24, 9, tzinfo=BERLIN)


def test_cron_runs_keep_local_time_across_daylight_saving() -> None:
    before = datetime(2026, 3, 27, 12, tzinfo=BERLIN).timestamp()  # the switch is on the 29th
    runs = [before]
    for _ in range(4):
        runs.append(next_run("0 9 * * *", BERLIN, runs[-1]))
    assert [datetime.fromtimestamp(t, BERLIN).hour for t in runs[1:]] == [9, 9, 9, 9]
    assert runs[2] - runs[1] == 23 * 3600, "the night the clocks go forward is an hour short"
    at_nine = datetime(2026, 3, 30, 9, tzinfo=BERLIN).timestamp()
    assert latest_run("0 9 * * *", BERLIN, at_nine) == at_nine
    assert latest_run("0 9 * * *", BERLIN, at_nine - 1) == at_nine - 86400


# -- in process ---------------------------------------------------------------------------------------
@pytest.fixture
async def sched(tmp_path: Path) -> AsyncIterator[Scheduled]:
    async with fake_rig(tmp_path, schedules_config(), clock=(clock := Clock())) as rig:
        yield Scheduled(rig, clock)


async def test_a_reminder_fires_once_as_a_new_message_in_its_chat(sched: Scheduled) -> None:
    answer = await sched.ask(USER, {"text": "Remind them to stretch", "delay": "2h"})
    assert answer.startswith("scheduled #1 for ") and "(Europe/Berlin)" in answer
    assert await sched.fire() == 0, "not due yet"
    sched.clock.now += 2 * 3600 + 1
    assert await sched.fire() == 1
    await until(lambda: chat_posts(sched.rig, USER), what="the reminder")
    await settled(sched.rig.store)
    (post,) = chat_posts(sched.rig, USER)
    assert post.startswith("echo: [Scheduled task #1 (a one-time schedule, Europe/Berlin)")
    assert post.endswith("\nRemind them to stretch") and "Late" not in post
    turn = sched.rig.harness.calls[-1]
    assert turn.user_id == f"telegram:{USER}", "the turn runs as the user who scheduled it"
    assert turn.thread_id == sched.rig.harness.calls[0].thread_id, "in the conversation's thread"
    sched.clock.now += 7 * 86400
    assert await sched.fire() == 0, "a one-time schedule fires once"
    await quiet(0.2)
    assert len(chat_posts(sched.rig, USER)) == 1
    assert "No schedules in this conversation" in await command(sched.rig, USER, "/schedules")


async def test_a_tainted_schedule_waits_for_its_owner_and_then_runs_from_now(tmp_path: Path) -> None:
    """Made after reading a web page: asked about, never fired unconfirmed however long it waits;
    a stranger's press is refused; once confirmed, a cron rule starts at its next run (the runs it
    waited through are not made up) and a one-time schedule past its time runs at once."""
    channel = FakeChannel(buttons=True)
    async with fake_rig(tmp_path, schedules_config(), channel=channel, clock=(clock := Clock())) as rig:
        sched = Scheduled(rig, clock)
        page = "https://pages.example/x"
        answer = await sched.ask(USER, {"text": "post the PRs", "cron": "0 9 * * *", "after_reading": page})
        assert answer.startswith("scheduled #1")
        request = await until(lambda: next((m for m in channel.sent if m.buttons), None), what="the ask")
        assert "Confirm schedule #1?" in request.text and f"From: the web page {page}" in request.text
        (waiting,) = await rig.store.schedules_active(f"telegram:{USER}")
        assert waiting.next_fire is not None and waiting.unconfirmed
        sched.clock.now = waiting.next_fire + 3 * 86400  # three runs pass unconfirmed
        assert await sched.fire() == 0
        assert (await channel.press(request.message_id, "Run", OTHER, "Eve")).refused
        pressed = await channel.press(request.message_id, "Run", USER, "Alice")
        assert not pressed.refused and pressed.text.startswith("✅ Confirmed #1 by `Alice`: it runs ")
        (confirmed,) = await rig.store.schedules_active(f"telegram:{USER}")
        assert confirmed.next_fire == next_run("0 9 * * *", BERLIN, sched.clock.now)
        assert await sched.fire() == 0, "not before its next run"
        again = await channel.press(request.message_id, "Run", USER, "Alice")
        assert again.refused and "Already settled" in again.text
        sched.clock.now = confirmed.next_fire + 1
        assert await sched.fire() == 1
        await until(lambda: chat_posts(rig, USER), what="the run")
        (post,) = chat_posts(rig, USER)
        assert f"the web page {page}" in post and "\n> post the PRs\n" in post
        assert "Alice confirmed that it should run" in post and "\npost the PRs" not in post

        late = await sched.ask(USER, {"text": "call Bob", "delay": "1h", "after_reading": page})
        assert late.startswith("scheduled #2")
        sched.clock.now += 2 * 3600
        assert await sched.fire() == 0
        assert (await command(rig, USER, "/schedules confirm 2")).startswith("✅ Confirmed #2 by")
        assert await sched.fire() == 1, "past its time when confirmed: runs now"
        assert await command(rig, USER, "/schedules confirm 2") == (
            "Cannot confirm: there is no active schedule #2 in this conversation."
        )


async def test_two_runners_racing_fire_it_once(sched: Scheduled) -> None:
    await sched.ask(USER, {"text": "ping", "delay": "1m"})
    rig = sched.rig
    other = ScheduleRunner(rig.gateway, rig.store, rig.gateway.config, rig.gateway.schedule_clock, None)
    sched.clock.now += 61
    counts = await asyncio.gather(sched.fire(), other.fire_due(), sched.fire())
    assert sum(counts) >= 1
    await until(lambda: chat_posts(sched.rig, USER), what="the firing")
    await settled(sched.rig.store)
    await quiet(0.2)
    assert len(chat_posts(sched.rig, USER)) == 1


async def test_a_crash_between_claiming_and_moving_on_fires_once(tmp_path: Path) -> None:
    """The claim (the journal entry) is made, then the process dies before the schedule is moved
    on: the next process resumes that firing from the journal and does not claim another."""
    config, clock = schedules_config(), Clock()
    async with fake_rig(tmp_path, config, clock=clock) as rig:
        first = Scheduled(rig, clock)
        await first.ask(USER, {"text": "water the plants", "cron": "0 9 * * *"})
        (schedule,) = await rig.store.schedules_active(f"telegram:{USER}")
        assert schedule.next_fire is not None
        clock.now = schedule.next_fire + 5
        rig.harness.gate.clear()  # the firing's turn hangs: the process "dies" during it
        original = rig.store.schedule_advance

        async def dies(*args: Any) -> bool:
            raise asyncio.CancelledError

        rig.store.schedule_advance = dies  # type: ignore[method-assign]
        with pytest.raises(asyncio.CancelledError):
            await first.fire()
        rig.store.schedule_advance = original  # type: ignore[method-assign]
        await until(lambda: len(rig.harness.calls) == 2, what="the firing's turn started")
        await crash(rig)
        store, channel = rig.store, rig.channel
        async with fake_rig(tmp_path, config, store=store, channel=channel.restarted(), clock=clock) as rig2:
            second = Scheduled(rig2, clock)
            clock.now += 3600
            assert await second.fire() == 1
            await until(lambda: chat_posts(rig2, USER), what="the resumed firing")
            await settled(rig2.store)
            await quiet(0.2)
            (post,) = chat_posts(rig2, USER)
            assert "water the plants" in post
            (moved,) = await rig2.store.schedules_active(f"telegram:{USER}")
            assert moved.next_fire == schedule.next_fire + 86400


async def test_missed_runs_fire_the_latest_once_late_and_skip_the_rest(sched: Scheduled) -> None:
    await sched.ask(USER, {"text": "daily report", "cron": "0 9 * * *"})
    (schedule,) = await sched.rig.store.schedules_active(f"telegram:{USER}")
    assert schedule.next_fire is not None
    sched.clock.now = schedule.next_fire + 2 * 86400 + 3600  # down for three mornings
    assert await sched.fire() == 1
    await until(lambda: chat_posts(sched.rig, USER), what="the late run")
    await settled(sched.rig.store)
    (post,) = chat_posts(sched.rig, USER)
    due = datetime.fromtimestamp(schedule.next_fire + 2 * 86400, BERLIN).strftime("%a %Y-%m-%d %H:%M")
    assert post.startswith(f"⏰ Late: this was due {due} ")
    assert "2 earlier run(s) missed meanwhile were skipped" in post
    (moved,) = await sched.rig.store.schedules_active(f"telegram:{USER}")
    assert moved.next_fire == schedule.next_fire + 3 * 86400
    assert await sched.fire() == 0


async def test_requests_are_checked_and_limited(tmp_path: Path) -> None:
    async with fake_rig(
        tmp_path, schedules_config(max_per_conversation=2, max_text_chars=50), clock=(clock := Clock())
    ) as rig:
        sched = Scheduled(rig, clock)
        assert "refused: unknown time zone 'Atlantis'" in await sched.ask(
            USER, {"text": "x", "cron": "0 9 * * *", "timezone": "Atlantis"}
        )
        assert "refused: give exactly one of" in await sched.ask(
            USER, {"text": "x", "delay": "1h", "cron": "0 9 * * *"}
        )
        assert "refused: the text is 51 characters long; at most 50" in await sched.ask(
            USER, {"text": "y" * 51, "delay": "1h"}
        )
        assert "refused: that is too far ahead (at most 5 years)" in await sched.ask(
            USER, {"text": "a", "at": "2099-01-01T09:00"}
        )
        assert "(America/New_York)" in await sched.ask(
            USER, {"text": "a", "at": "2028-01-01T09:00", "timezone": "America/New_York"}
        )
        assert "scheduled #" in await sched.ask(USER, {"text": "b", "delay": "1d"})
        assert "refused: this conversation already has 2 schedules (the limit)" in await sched.ask(
            USER, {"text": "c", "delay": "2d"}
        )
        listing = await command(rig, USER, "/schedules")
        assert listing.startswith("Schedules here (2):")
        assert "#2 — next " in listing and "EST — once — by telegram:200: `a`" in listing


async def test_only_the_creator_or_an_admin_may_cancel(sched: Scheduled) -> None:
    rig = sched.rig
    group = "-100777"

    def in_group(user: int, text: str) -> Any:
        d = dm(user, text)
        return type(d)("telegram", group, d.message_id, str(user), text, False, True)

    for text in (
        'schedule {"text": "standup", "cron": "30 9 * * 1-5"}',
        'schedule {"text": "retro", "delay": "3d"}',
    ):
        await rig.channel.deliver(in_group(USER, text))
    await until(lambda: len(rig.channel.in_chat(group)) == 2, what="both scheduled")

    async def say(user: int, text: str) -> str:
        inbound = in_group(user, text)
        await rig.channel.deliver(inbound)
        (answer,) = await until(lambda: rig.channel.replies_to(inbound.message_id), what=text)
        return str(answer)

    listing = await say(OTHER, "/schedules")
    assert "#1 — next " in listing
    assert "cron 30 9 * * 1-5 (At 09:30 on Monday through Friday)" in listing and "retro" in listing
    refused = await say(OTHER, "/unschedule 1")
    assert refused == "Cannot cancel: only telegram:200, who made #1, or an admin can cancel it."
    assert "#1" in await say(OTHER, "/schedules")
    assert (await say(USER, "/schedules cancel 1")).startswith("🗑 Cancelled #1 (cron 30 9 * * 1-5")
    assert (await say(ADMIN, "/unschedule #2")).startswith("🗑 Cancelled #2 (once): `retro`")
    assert await say(USER, "/unschedule 2") == (
        "Cannot cancel: there is no active schedule #2 in this conversation."
    )
    assert await say(USER, "/unschedule") == "Usage: /unschedule ID (the number /schedules shows)"
    # A number that is no number says what is wrong with it (never "something went wrong").
    for typed in ("²", "①", "#٣", "1.5", "-1", "x"):
        assert await say(USER, f"/unschedule {typed}") == (
            f"Cannot cancel: `{typed}` is not a schedule number: write it in the digits 0-9, like 3."
        ), typed
    for typed in ("99999999999999999999999", "0", "#9223372036854775808"):
        assert await say(USER, f"/schedules cancel {typed}") == (
            f"Cannot cancel: `{typed}` is not a schedule number: they run from 1 to 9223372036854775807."
        ), typed
    assert await say(USER, "/schedules confirm ①") == (
        "Cannot confirm: `①` is not a schedule number: write it in the digits 0-9, like 3."
    )
    assert "No schedules in this conversation" in await say(USER, "/schedules")
    sched.clock.now += 10 * 86400
    assert await sched.fire() == 0, "cancelled schedules never fire"
    # Another conversation's schedule is not this one's to cancel (or to see).
    await sched.ask(USER, {"text": "private", "delay": "1h"})
    assert "no active schedule #3 in this conversation" in await say(ADMIN, "/unschedule 3")


async def test_a_push_is_delivered_once_also_after_the_channel_failed(sched: Scheduled) -> None:
    rig = sched.rig
    inbound = push_inbound("telegram", str(OTHER), None, "deploy-1")
    assert await rig.store.journal_add(inbound, JournalKind.NOTICE, "Deploy 1 finished ✅")
    assert not await rig.store.journal_add(inbound, JournalKind.NOTICE, "Deploy 1 finished ✅")
    rig.channel.fail("send", ChannelError("502 from the platform"), times=2)
    assert await sched.runner.pick_up_pushes() == 1
    await until(lambda: rig.channel.in_chat(str(OTHER)), timeout=10, what="the push")
    await settled(rig.store)
    assert await sched.runner.pick_up_pushes() == 0
    assert rig.channel.in_chat(str(OTHER)) == ["Deploy 1 finished ✅"]
    (msg,) = [m for m in rig.channel.sent if m.target.chat_id == str(OTHER)]
    assert msg.target.reply_to is None


async def test_firings_and_pushes_wait_while_the_channel_is_down(sched: Scheduled) -> None:
    rig = sched.rig
    await sched.ask(USER, {"text": "while down", "delay": "10m"})
    rig.channel.force_state(ChannelState.RECONNECTING, "network")
    push = push_inbound("telegram", str(USER), None, "while-down")
    await rig.store.journal_add(push, JournalKind.NOTICE, "pushed while down")
    sched.clock.now += 601
    assert await sched.fire() == 0 and await sched.runner.pick_up_pushes() == 0
    await quiet(0.2)
    assert chat_posts(rig, USER) == [], "nothing is sent into a channel that is not connected"
    assert await rig.store.journal_state(push.key) == "pending"
    rig.channel.force_state(ChannelState.CONNECTED)  # the gateway resumes the push
    assert await sched.fire() == 1
    await until(lambda: len(chat_posts(rig, USER)) == 2, what="both after the reconnect")
    await settled(rig.store)
    posts = chat_posts(rig, USER)
    assert "pushed while down" in posts and any(p.endswith("\nwhile down") for p in posts)


async def test_firings_go_to_the_thread_they_were_made_in(tmp_path: Path) -> None:
    """A Telegram topic gets a new message in the topic; Lark reaches a thread only by replying,
    so there the firing replies to the message that made the schedule."""
    clock = Clock()
    for name, thread in (("telegram", "77"), ("lark", "omt_9")):
        async with fake_rig(
            tmp_path / name, schedules_config(), channel=FakeChannel(name), clock=clock
        ) as rig:
            sched = Scheduled(rig, clock)
            request = json.dumps({"text": "standup", "delay": "1m"})
            made = Inbound(name, "chat-1", "m-1", str(USER), f"schedule {request}", False, True, thread)
            await rig.channel.deliver(made)
            await until(lambda: rig.channel.replies_to("m-1"), what="scheduled")
            clock.now += 61
            assert await sched.fire() == 1
            await until(lambda: len(rig.channel.sent) == 2, what="the firing")
            await settled(rig.store)
            firing = rig.channel.sent[-1]
            assert firing.target.thread_id == thread and "standup" in firing.text
            assert firing.target.reply_to == ("m-1" if name == "lark" else None)


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_the_schedule_store_on_both_engines(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Every statement of gateway/store/schedules.py, on SQLite and (rewritten) on PostgreSQL."""
    from gateway.store.journal import Store

    if engine == "postgres":
        store = await Store.open_postgres(request.getfixturevalue("pg_url"))
    else:
        store = await Store.open(tmp_path / "g.sqlite", reserve_bytes=0)
    try:
        made = dm(USER, "remind me")
        assert await store.journal_add(made, JournalKind.TURN)
        thread = await store.thread_for(made.conversation)
        assert await store.thread_conversation(thread) == made.conversation
        assert (await store.journal_inbound(made.key)) == made
        assert await store.journal_state(made.key) == "pending"
        now = time.time()
        args: dict[str, Any] = {"template": made, "creator": made.user, "text": "t", "tz": "UTC"}
        one, new = await store.schedule_add(origin="o-1", cron=None, next_fire=now + 60, **args)
        again, new2 = await store.schedule_add(origin="o-1", cron=None, next_fire=now + 999, **args)
        assert new and not new2 and again.id == one.id and again.next_fire == one.next_fire
        assert one.template.chat_id == str(USER) and one.template.message_id == made.message_id
        two, _ = await store.schedule_add(origin="o-2", cron="0 9 * * *", next_fire=now + 30, **args)
        assert two.id > one.id
        assert await store.schedule_counts(made.conversation, made.user) == (2, 2)
        assert [s.id for s in await store.schedules_active(made.conversation)] == [two.id, one.id]
        assert await store.schedule_next_time(["telegram"]) == pytest.approx(now + 30)
        assert await store.schedule_next_time(["slack"]) is None
        assert [s.id for s in await store.schedules_due(now + 45, ["telegram", "lark"])] == [two.id]
        assert await store.schedules_due(now + 45, []) == []
        assert await store.schedule_advance(two.id, now + 30, now + 86400)
        assert not await store.schedule_advance(two.id, now + 30, now + 86400), "moved once"
        assert await store.schedule_advance(one.id, now + 60, None)
        assert await store.schedule_cancel(two.id) and not await store.schedule_cancel(two.id)
        assert await store.schedules_active(made.conversation) == []
        done = await store.schedule_get(one.id)
        assert done is not None and done.state == "done" and done.next_fire is None
        assert await store.schedules_prune(3600) == 0, "finished just now: kept"
        assert await store.schedules_prune(-1) == 2, "finished and cancelled ones go"
        assert await store.schedule_get(one.id) is None
        # Made after reading untrusted content: stored with its sources, never due unconfirmed.
        sources = Provenance((Source(WEB_PAGE, "https://pages.example/x"), Source(MESSAGE, "Mallory")))
        tainted, _ = await store.schedule_add(
            origin="o-3", cron=None, next_fire=now + 10, provenance=sources, **args
        )
        assert tainted.provenance == sources and tainted.unconfirmed and tainted.confirmed is None
        again3 = await store.schedule_get(tainted.id)
        assert again3 is not None and again3.provenance == sources and again3.unconfirmed
        assert await store.schedules_due(now + 45, ["telegram"]) == []
        assert await store.schedule_next_time(["telegram"]) is None
        assert await store.schedule_confirm(tainted.id, "Olga", now + 20)
        assert not await store.schedule_confirm(tainted.id, "Eve", now + 20), "confirmed once"
        confirmed = await store.schedule_get(tainted.id)
        assert confirmed is not None and confirmed.confirmed == "Olga" and not confirmed.unconfirmed
        assert [s.id for s in await store.schedules_due(now + 45, ["telegram"])] == [tainted.id]
        assert await store.schedule_cancel(tainted.id)
        seen = await store.journal_last_rowid()
        push = push_inbound("telegram", "5", None, "k")
        await store.journal_add(push, JournalKind.NOTICE, "hello")
        ((rowid, inbound, note),) = await store.journal_pending_after(seen, JournalKind.NOTICE)
        assert rowid > seen and inbound.key == push.key and note == "hello"
    finally:
        await store.close()


def test_send_targets_are_checked_per_platform() -> None:
    config = make_config(channels={"telegram": {"token": "1:x"}, "slack": {"enabled": False}})
    assert parse_target("telegram:-1001234:42", config) == ("telegram", "-1001234", "42")
    assert parse_target("Telegram:12345", config) == ("telegram", "12345", None)
    for target, why in [
        (
            "signal:123",
            "unknown platform 'signal'; use one of dingtalk, discord, lark, matrix, slack, telegram, web, wecom, whatsapp",
        ),
        ("slack:C0123ABCD", "channel slack is off in this config"),
        ("telegram:@channel", "'@channel' is not a telegram chat id: expected a number"),
        ("telegram:123:topic", "'topic' is not a telegram thread id"),
    ]:
        with pytest.raises(Refused, match=why):
            parse_target(target, config)


def test_every_registered_platform_takes_its_own_chat_ids() -> None:
    """`chital send` to each platform of the registry: a well-formed id is taken (a Matrix room id
    holds a colon of its own), a malformed one is refused naming the shape, never a crash."""
    config = make_config(
        channels={
            "matrix": {"homeserver": "https://m.example", "user_id": "@bot:m.example", "access_token": "t"},
            "whatsapp": {"phone_number_id": "1", "access_token": "t", "app_secret": "s", "verify_token": "v"},
            "dingtalk": {"client_id": "c", "client_secret": "s"},
            "wecom": {"bot_id": "b", "secret": "s"},
        }
    )
    taken = {
        "matrix:!AbCdEf:m.example": ("matrix", "!AbCdEf:m.example", None),
        "matrix:!AbCdEf:m.example:8448": ("matrix", "!AbCdEf:m.example:8448", None),
        "matrix:!Zm9vYmFyYmF6": ("matrix", "!Zm9vYmFyYmF6", None),  # room version 12: no server part
        "whatsapp:15551234567": ("whatsapp", "15551234567", None),
        "dingtalk:manager4521": ("dingtalk", "manager4521", None),
        "dingtalk:cidAbC+d/EF==": ("dingtalk", "cidAbC+d/EF==", None),
        "wecom:zhangsan": ("wecom", "zhangsan", None),
    }
    for target, parsed in taken.items():
        assert parse_target(target, config) == parsed, target
    for target, why in [
        ("matrix:#room:m.example", "is not a matrix chat id: expected a room id"),
        ("matrix:!AbCdEf:m.example:$thread", "matrix threads cannot be posted into directly"),
        ("whatsapp:+15551234567", "is not a whatsapp chat id: expected a phone number"),
        ("dingtalk:a b", "is not a dingtalk chat id"),
        ("wecom:" + "x" * 65, "is not a wecom chat id"),
        ("wecom:zhang\nsan", "is not a wecom chat id"),
    ]:
        with pytest.raises(Refused, match=re.escape(why)):
            parse_target(target, config)
    assert push_inbound("whatsapp", "15551234567", None, "k").is_direct
    assert not push_inbound("dingtalk", "cidAbC==", None, "k").is_direct
    assert push_inbound("dingtalk", "manager4521", None, "k").is_direct


# -- end to end: `chital run` with the fake Telegram server and the fake model -----------------------
E2E_OWNER, E2E_OTHER, E2E_GROUP = 1001, 1002, -100200300


def model_brain(slow: dict[str, float]) -> Callable[[dict[str, Any]], Reply]:
    """The fake model: calls ``schedule_task`` when asked to remind or to repeat, says what the
    tool answered, and answers a firing with a reminder naming the schedule (slowly when
    ``slow`` says so, for the kill -9)."""

    def reply(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last.get("role") == "tool":
            return Reply(text=f"Done: {last.get('content')}")
        text = last_user_text(body)
        fired = re.search(r"\[Scheduled task #(\d+)", text)
        if fired:
            number = fired.group(1)
            delay = slow.get(number, 0.0)
            return Reply(text=f"⏰ Time to stretch! (#{number})", chunks=8, chunk_delay=delay / 8)
        if "remind me" in text:
            args = {"text": "Remind the user to stretch", "delay": "3s"}
            return Reply(tool_calls=[ToolCall("schedule_task", args)])
        if "every weekday" in text:
            args = {"text": "Post the open PRs", "cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}
            return Reply(tool_calls=[ToolCall("schedule_task", args)])
        return Reply(text=f"echo: {text}")

    return reply


@pytest.fixture
async def e2e(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"]["telegram"] = tg.channel_settings()
    cfg["access"] = {"allow_users": [str(E2E_OWNER), str(E2E_OTHER)], "group_policy": "mention"}
    cfg["agent"]["memory"] = {"enabled": False}  # its model calls would meet the scripted brain
    d = DaemonProcess(tmp_path, cfg)
    await d.start()
    yield d
    await d.close()


def stretches(tg: FakeTelegram, number: int) -> list[str]:
    return [m.text for m in tg.bot_messages(E2E_OWNER) if f"Time to stretch! (#{number})" in m.text]


async def e2e_answer(
    tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str, timeout: float = 20
) -> str:
    mid = update["message"]["message_id"]

    def check() -> str | None:
        for m in tg.bot_messages(chat):
            if m.reply_to == mid and needle in m.text:
                return m.text
        return None

    return str(await tg.wait_for(check, timeout=timeout, what=f"a reply containing {needle!r}"))


async def test_e2e_reminders_fire_once_across_a_restart_and_a_kill(
    e2e: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    slow: dict[str, float] = {"2": 6.0}
    model.add_rule(lambda _text: True, model_brain(slow))

    # 1. The model calls the tool; the daemon is restarted before the reminder is due.
    up = tg.inject_message(E2E_OWNER, E2E_OWNER, "remind me in 3 seconds to stretch")
    done = await e2e_answer(tg, E2E_OWNER, up, "Done: Scheduled #1: once; next run")
    assert "UTC (the default zone: none was named)" in done
    assert await e2e.terminate() == 0
    await asyncio.sleep(3)
    await e2e.start()
    await tg.wait_for(lambda: stretches(tg, 1), timeout=20, what="the reminder after the restart")

    # 2. kill -9 while the firing's turn is being answered: it resumes and posts once.
    up = tg.inject_message(E2E_OWNER, E2E_OWNER, "remind me again, in 3 seconds")
    await e2e_answer(tg, E2E_OWNER, up, "Done: Scheduled #2")
    await tg.wait_for(
        lambda: any("[Scheduled task #2" in last_user_text(b) for b in model.requests),
        timeout=20,
        what="the firing's turn reached the model",
    )
    await asyncio.sleep(1.0)
    e2e.kill9()
    await e2e.wait_exit()
    slow["2"] = 0.0
    await e2e.start()
    await tg.wait_for(lambda: stretches(tg, 2), timeout=30, what="the resumed firing")
    await asyncio.sleep(2.0)
    assert len(stretches(tg, 1)) == 1 and len(stretches(tg, 2)) == 1, tg.bot_texts(E2E_OWNER)
    for m in tg.bot_messages(E2E_OWNER):
        if "Time to stretch" in m.text:
            assert m.reply_to is None, "a firing is a new message, not a reply"


async def test_e2e_schedules_command_lists_and_only_the_creator_cancels(
    e2e: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.add_rule(lambda _text: True, model_brain({}))
    up = tg.inject_mention(E2E_GROUP, E2E_OWNER, "every weekday at 9 post the open PRs")
    done = await e2e_answer(tg, E2E_GROUP, up, "Done: Scheduled #1: cron 0 9 * * 1-5")
    assert "Europe/Berlin" in done and "09:00" in done
    listing = await e2e_answer(tg, E2E_GROUP, tg.inject_command(E2E_GROUP, E2E_OTHER, "schedules"), "#1")
    assert listing.startswith("Schedules here (1):")
    assert (
        "cron 0 9 * * 1-5 (At 09:00 on Monday through Friday) — by telegram:1001: Post the open PRs"
        in listing
    )
    refused = await e2e_answer(
        tg, E2E_GROUP, tg.inject_command(E2E_GROUP, E2E_OTHER, "unschedule", "1"), "Cannot cancel"
    )
    assert refused == "Cannot cancel: only telegram:1001, who made #1, or an admin can cancel it."
    cancelled = await e2e_answer(
        tg, E2E_GROUP, tg.inject_command(E2E_GROUP, E2E_OWNER, "schedules", "cancel 1"), "Cancelled"
    )
    assert cancelled.startswith("🗑 Cancelled #1 (cron 0 9 * * 1-5")
    await e2e_answer(tg, E2E_GROUP, tg.inject_command(E2E_GROUP, E2E_OTHER, "schedules"), "No schedules")


async def test_e2e_chital_send_reaches_the_chat_once_also_through_an_outage(
    e2e: DaemonProcess, tg: FakeTelegram
) -> None:
    chat = E2E_OTHER
    await e2e_answer(tg, chat, tg.inject_message(chat, chat, "hello"), "echo: hello")  # the chat exists
    code, out = await e2e.cli("send", f"telegram:{chat}", "hi from CI")
    assert code == 0 and out.strip().startswith(f"telegram:{chat}:push-"), out
    await tg.wait_for(lambda: "hi from CI" in tg.bot_texts(chat), timeout=10, what="the push")

    code, out = await e2e.cli("send", "telegram:not-a-chat", "x")
    assert code == 2 and "'not-a-chat' is not a telegram chat id" in out
    code, out = await e2e.cli("send", "irc:1", "x")
    assert code == 2 and "unknown platform 'irc'" in out

    tg.down_methods |= {"sendMessage"}
    code, out = await e2e.cli("send", f"telegram:{chat}", "deploy finished", "--key", "deploy-7")
    assert code == 0, out
    code, out = await e2e.cli("send", f"telegram:{chat}", "deploy finished", "--key", "deploy-7")
    assert code == 0 and "already journaled" in out
    await asyncio.sleep(4)
    assert "deploy finished" not in tg.bot_texts(chat), "the platform is down"
    tg.down_methods.clear()
    await tg.wait_for(
        lambda: "deploy finished" in tg.bot_texts(chat), timeout=25, what="the push after the outage"
    )
    code, out = await e2e.cli("send", f"telegram:{chat}", "with wait", "--wait", "--timeout", "20")
    assert code == 0 and out.strip().endswith("delivered"), out
    await asyncio.sleep(1.5)
    texts = tg.bot_texts(chat)
    assert [texts.count(t) for t in ("hi from CI", "deploy finished", "with wait")] == [1, 1, 1], texts
    code, out = await e2e.cli("send", "telegram:424242", "nobody there", "--wait", "--timeout", "20")
    assert code == 1 and "the platform refused the message" in out, "a chat the bot is not in"
