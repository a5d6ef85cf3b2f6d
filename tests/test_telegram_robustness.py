"""Telegram field reliability, through python-telegram-bot against FakeTelegram: malformed updates
never stop polling, every non-text kind gets a visible outcome, a passing 401/5xx is not fatal.

Outcomes are asserted as the user sees them (the fake's record of what the bot sent), with the real
gateway (journal, notices, metrics) and an echo harness in place of the agent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from channels.base import ChannelState, FatalChannelError
from channels.telegram import TelegramChannel
from gateway.ops.metrics import Metrics
from gateway.ops.supervisor import Backoff, ChannelSupervisor, run_once
from tests.fakes import telegram_kinds as kinds
from tests.fakes.gateway_rig import Rig, running
from tests.fakes.malformed import SECRET, Case, leaked, malformed_total, put, variants
from tests.fakes.telegram_server import FakeTelegram

USER = 4242
OTHER = 5151


@pytest.fixture
def allowed_users() -> list[str]:
    return [str(USER), str(OTHER)]


GROUP = -1009876


@pytest.fixture
def channel(tg: FakeTelegram) -> TelegramChannel:
    return TelegramChannel(
        tg.token, base_url=tg.base_url, base_file_url=tg.base_file_url, poll_timeout=1,
        auth_recheck_delay=0.05,
    )  # fmt: skip


def bot_says(tg: FakeTelegram, chat: int, needle: str) -> Callable[[], list[str]]:
    return lambda: [t for t in tg.bot_texts(chat) if needle in t]


# -- malformed updates ---------------------------------------------------------------------------
MALFORMED: dict[str, dict[str, Any]] = {
    "missing date": {"drop": ("date",)},
    "missing message_id": {"drop": ("message_id",)},
    "old-shape poll": {"drop": ("text",), "override": kinds.old_poll()},
    "string for the sender": {"override": {"from": "someone"}},
    "object for the text": {"override": {"text": {"secret": "words"}}},
    "string for the entities": {"override": {"entities": "secret words"}},
    "date that is words": {"override": {"date": "secret words yesterday"}},
}


@pytest.mark.parametrize("shape", list(MALFORMED))
async def test_malformed_update_is_skipped_and_its_sender_told(
    shape: str, tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)  # PTB logs whole API answers at DEBUG, by design
    first = tg.inject_message(USER, USER, "first good one")
    bad = tg.inject_malformed(USER, USER, "secret words", **MALFORMED[shape])
    tg.inject_message(OTHER, OTHER, "second good one")
    async with running(channel, adapter_rig):
        await tg.wait_for(bot_says(tg, USER, "echo: first good one"), what="first answered")
        await tg.wait_for(bot_says(tg, OTHER, "echo: second good one"), what="second answered")
        notes = await tg.wait_for(bot_says(tg, USER, "couldn't read that message"), what="note")
        await tg.wait_for(lambda: not tg.pending_updates, what="all updates confirmed")
        assert channel.state is ChannelState.CONNECTED
    assert len(notes) == 1 and "another form" in notes[0]
    offsets = [c.params.get("offset") for c in tg.calls_to("getUpdates")]
    assert max(o or 0 for o in offsets) > bad["update_id"] > first["update_id"]
    assert channel.unreadable_events == 1
    assert adapter_rig.metric("chital_messages_ignored_total", channel="telegram", reason="malformed") == 1
    critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert critical and f"update {bad['update_id']}" in critical[0].getMessage()
    assert str(USER) in critical[0].getMessage()
    for record in caplog.records:  # neither the text nor the raw payload reaches any log line
        text = record.getMessage() + (record.exc_text or "")
        assert "secret" not in text, record.getMessage()


async def test_unrecoverable_update_is_counted_and_skipped(
    tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig
) -> None:
    tg.inject_message(USER, USER, "before")
    tg.push_update({"message": "not even an object"})
    tg.inject_malformed(USER, USER, override={"chat": "oops"})  # no chat id to answer into
    tg.inject_message(USER, USER, "after")
    async with running(channel, adapter_rig):
        await tg.wait_for(bot_says(tg, USER, "echo: after"), what="the last one answered")
        await tg.wait_for(lambda: not tg.pending_updates, what="all updates confirmed")
    assert bot_says(tg, USER, "echo: before")()
    assert not bot_says(tg, USER, "couldn't read")(), "no chat id: nobody to tell"
    assert adapter_rig.metric("chital_messages_ignored_total", channel="telegram", reason="malformed") == 2
    assert "chital_messages_ignored_total" in adapter_rig.metrics_text()


async def test_group_chatter_that_cannot_be_read_is_not_answered(
    tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig
) -> None:
    tg.inject_malformed(GROUP, USER, "just chatting", drop=("date",), chat_type="supergroup")
    tg.inject_malformed(GROUP, USER, f"@{tg.username} help", drop=("date",), chat_type="supergroup")
    tg.inject_mention(GROUP, USER, "are you there")
    async with running(channel, adapter_rig):
        await tg.wait_for(bot_says(tg, GROUP, "echo: are you there"), what="mention answered")
        await tg.wait_for(bot_says(tg, GROUP, "couldn't read"), what="note for the mention")
    assert len(bot_says(tg, GROUP, "couldn't read")()) == 1, "only the one addressed to the bot"


async def test_lone_surrogate_is_replaced_and_answered(
    tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig
) -> None:
    tg.inject_message(USER, USER, "bad \ud800 char", entities=[{"type": "bold", "offset": 0, "length": 3}])
    tg.inject_message(USER, USER, "next one")
    async with running(channel, adapter_rig):
        await tg.wait_for(bot_says(tg, USER, "echo: next one"), what="next answered")
        (answer,) = await tg.wait_for(bot_says(tg, USER, "echo: bad"), what="surrogate answered")
    assert answer == "echo: bad \ufffd char"
    assert adapter_rig.harness.seen[0][0] == "bad \ufffd char"


async def test_a_message_the_journal_refuses_is_skipped_not_retried(
    tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data error from the journal for one message's content is that message's fault: it gets the
    note and polling moves on. (Lone surrogates never get this far: they are replaced at parse.)"""
    real = adapter_rig.gateway.store.journal_add

    async def picky(inbound: Any, kind: str, note: str = "", lease: Any = None) -> bool:
        if "poison" in inbound.text:
            raise UnicodeEncodeError("utf-8", inbound.text, 0, 1, "surrogates not allowed")
        return await real(inbound, kind, note, lease)

    monkeypatch.setattr(adapter_rig.gateway.store, "journal_add", picky)
    tg.inject_message(USER, USER, "poison pill")
    tg.inject_message(USER, USER, "fine")
    async with running(channel, adapter_rig):
        await tg.wait_for(bot_says(tg, USER, "echo: fine"), what="next answered")
        await tg.wait_for(bot_says(tg, USER, "couldn't read"), what="note for the refused one")
        await tg.wait_for(lambda: not tg.pending_updates, what="both confirmed")


# -- non-text kinds ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "agent_reads"),
    [
        (kinds.location(52.52, 13.405), "📍 location: 52.52, 13.405"),
        (kinds.venue("Cafe Einstein", "Kurfürstenstraße 58"),
         "📍 location: 52.5, 13.35 (Cafe Einstein, Kurfürstenstraße 58)"),
        (kinds.contact("Ada", "Lovelace", "+441234567"), "👤 contact: Ada Lovelace, phone +441234567"),
        (kinds.poll("Lunch?", ("pizza", "sushi")), "📊 poll: Lunch?\n- pizza\n- sushi"),
        (kinds.dice(4), "🎲 rolled 4"),
        (kinds.dice(6, "🎯"), "🎯 rolled 6"),
    ],
    ids=["location", "venue", "contact", "poll", "dice", "darts"],
)  # fmt: skip
async def test_usable_kinds_become_text_the_agent_answers(
    content: dict[str, Any], agent_reads: str, tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig
) -> None:
    up = tg.inject_content(USER, USER, content)
    async with running(channel, adapter_rig):
        (reply,) = await tg.wait_for(lambda: tg.bot_messages(USER), what="a reply")
    assert adapter_rig.harness.seen == [(agent_reads, [])]
    first_line = agent_reads.splitlines()[0]
    assert reply.text.startswith(f"echo: {first_line}")  # what the user sees (Markdown rendered)
    assert reply.reply_to == up["message"]["message_id"]


@pytest.mark.parametrize(
    ("content", "kind"), [(kinds.sticker(), "stickers"), (kinds.game(), "games")], ids=["sticker", "game"]
)
async def test_unusable_kinds_get_a_plain_note(
    content: dict[str, Any], kind: str, tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig
) -> None:
    up = tg.inject_content(USER, USER, content)
    async with running(channel, adapter_rig):
        (reply,) = await tg.wait_for(lambda: tg.bot_messages(USER), what="a reply")
    assert reply.text == f"I can't use {kind} yet; please describe what you need in words."
    assert reply.reply_to == up["message"]["message_id"]
    assert adapter_rig.harness.seen == [], "the agent is not asked about what it cannot use"


@pytest.mark.parametrize("maker", [kinds.video_note, kinds.voice], ids=["video_note", "voice"])
async def test_video_notes_and_voice_reach_the_agent_as_files(
    maker: Callable[..., dict[str, Any]], tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig
) -> None:
    stored = tg.add_file(b"\x00" * 64, file_name="clip.bin")
    tg.inject_content(USER, USER, maker(stored["file_id"], size=64))
    async with running(channel, adapter_rig):
        (reply,) = await tg.wait_for(lambda: tg.bot_texts(USER), what="a reply")
    kind = "video_note" if maker is kinds.video_note else "voice"
    assert "echo: " in reply and f"[files: {kind}_" in reply
    if kind == "voice":  # no transcriber configured: the user is told, the agent has the file
        assert reply.startswith("🎙 I cannot listen to voice notes here")
    else:
        assert reply.startswith("echo: ")
    assert tg.calls_to("getFile"), "the file was fetched for the agent"


async def test_service_messages_still_get_no_reply(
    tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig
) -> None:
    tg.inject_content(GROUP, USER, {"new_chat_members": [{"id": 5, "is_bot": False, "first_name": "N"}]},
                        chat_type="supergroup")  # fmt: skip
    tg.inject_mention(GROUP, USER, "hello")
    async with running(channel, adapter_rig):
        await tg.wait_for(bot_says(tg, GROUP, "echo: hello"), what="mention answered")
        await tg.wait_for(lambda: not tg.pending_updates, what="confirmed")
    assert tg.bot_texts(GROUP) == ["echo: hello"]


# -- transient vs fatal token errors -------------------------------------------------------------
@pytest.mark.parametrize(("method", "status"), [("getMe", 401), ("getMe", 502), ("getUpdates", 401),
                                                ("getUpdates", 502)])  # fmt: skip
async def test_a_single_401_or_502_is_retried(
    method: str, status: int, tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig
) -> None:
    tg.fail_next(method, status)
    async with running(channel, adapter_rig):
        await tg.wait_for(lambda: any(c.status == status for c in tg.calls_to(method)), what="the error")
        tg.inject_message(USER, USER, "still there?")
        await tg.wait_for(bot_says(tg, USER, "echo: still there?"), what="answered after the blip")
        assert channel.state is ChannelState.CONNECTED


async def test_persistent_401_ends_failed_with_a_clear_reason(
    tg: FakeTelegram, channel: TelegramChannel
) -> None:
    tg.fail_next("getMe", 401, times=10)
    with pytest.raises(FatalChannelError) as info:
        await asyncio.wait_for(run_once(channel, lambda _i: asyncio.sleep(0)), 5)
    assert channel.state is ChannelState.FAILED
    assert "401" in str(info.value) and "3 checks in a row" in str(info.value)
    assert tg.token not in str(info.value)
    assert len(tg.calls_to("getMe")) == 3


async def test_revoked_while_polling_ends_failed_under_the_supervisor(
    tg: FakeTelegram, channel: TelegramChannel
) -> None:
    metrics = Metrics()
    sup = ChannelSupervisor(channel, lambda _i: asyncio.sleep(0), metrics, Backoff(base=0.05, cap=0.1))
    sup.start()
    try:
        await tg.wait_for(lambda: channel.state is ChannelState.CONNECTED, what="connected")
        tg.revoke_token()
        await tg.wait_for(lambda: channel.state is ChannelState.FAILED, what="failed")
        assert "rejected the bot token" in (channel.reason or "")
    finally:
        await sup.stop()


async def test_getme_5xx_that_persists_is_left_to_the_supervisor(
    tg: FakeTelegram, channel: TelegramChannel
) -> None:
    """Four 502s exhaust one start's retries; the supervisor's restart then connects."""
    tg.fail_next("getMe", 502, times=4)
    sup = ChannelSupervisor(channel, lambda _i: asyncio.sleep(0), Metrics(), Backoff(base=0.05, cap=0.1))
    sup.start()
    try:
        await tg.wait_for(lambda: channel.state is ChannelState.CONNECTED, timeout=15, what="connected")
        assert len([c for c in tg.calls_to("getMe") if c.status == 502]) == 4
    finally:
        await sup.stop()


# -- table-driven malformed variants (channels/malformed.py) ---------------------------------------
MESSAGE_CASES = variants({
    ("message", "date"): (("missing", "string", "object"), True),
    ("message", "message_id"): (("missing", "string", "null", "float"), True),
    ("message", "chat"): (("string", "null", "list"), False),
    ("message", "chat", "id"): (("string", "null", "huge id"), False),
    ("message", "from"): (("string", "list", "null"), True),  # a private chat: its id is the sender's
    ("message", "from", "id"): (("string", "null"), True),
    ("message", "text"): (("object", "number", "list", "null"), True),
    ("message", "entities"): (("string", "object", "nested nulls"), True),
    ("message",): (("null", "string", "number", "list"), False),
})  # fmt: skip
PRESS_CASES = variants({
    ("callback_query", "data"): (("missing", "number", "object"), True),
    ("callback_query", "from"): (("string", "null"), True),  # the query id is enough to answer
    ("callback_query", "message"): (("null", "string"), True),
    ("callback_query", "id"): (("number", "missing", "huge id"), False),
    ("callback_query",): (("null", "string"), False),
})  # fmt: skip


async def serves_after(tg: FakeTelegram) -> None:
    tg.inject_message(USER, USER, "still there?")
    await tg.wait_for(bot_says(tg, USER, "echo: still there?"), what="a normal message answered after")
    await tg.wait_for(lambda: not tg.pending_updates, what="every update confirmed")


@pytest.mark.parametrize("case", MESSAGE_CASES, ids=lambda c: c.id)
async def test_every_malformed_update_is_confirmed_counted_and_answered(
    case: Case, tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    template = tg.message_template(USER, USER, SECRET)
    bad = tg.push_update(put({"message": template}, case.path, case.value))
    async with running(channel, adapter_rig):
        if case.told:
            await tg.wait_for(bot_says(tg, USER, "couldn't read that message"), what="the note")
        await serves_after(tg)
    offsets = [c.params.get("offset") or 0 for c in tg.calls_to("getUpdates")]
    assert max(offsets) > bad["update_id"], "the offset moved past it: Telegram will not send it again"
    assert malformed_total(adapter_rig, "telegram") == 1
    assert bool(bot_says(tg, USER, "couldn't read")()) is case.told
    assert not leaked(caplog.records)


@pytest.mark.parametrize("case", PRESS_CASES, ids=lambda c: c.id)
async def test_every_malformed_press_is_confirmed_counted_and_refused(
    case: Case, tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    query = {"id": "Q77", "from": {"id": USER, "is_bot": False, "first_name": "U"}, "chat_instance": "1",
             "message": tg.message_template(USER, 1, SECRET), "data": "chital:approve:ZZ"}  # fmt: skip
    bad = tg.push_update(put({"callback_query": query}, case.path, case.value))
    async with running(channel, adapter_rig):
        if case.told:
            await tg.wait_for(lambda: tg.calls_to("answerCallbackQuery"), what="the press answered")
        await serves_after(tg)
    offsets = [c.params.get("offset") or 0 for c in tg.calls_to("getUpdates")]
    assert max(offsets) > bad["update_id"]
    assert malformed_total(adapter_rig, "telegram") == 1
    answers = tg.calls_to("answerCallbackQuery")
    assert bool(answers) is case.told
    for answer in answers:
        assert "couldn't read that button" in answer.params["text"]
        assert str(answer.params["show_alert"]).lower() == "true"
    assert not leaked(caplog.records)


async def test_a_malformed_update_whose_marker_cannot_be_journaled_is_dropped_not_retried(
    tg: FakeTelegram, channel: TelegramChannel, adapter_rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = adapter_rig.gateway.store.journal_add

    async def failing_for_markers(inbound: Any, kind: str, note: str = "", lease: Any = None) -> bool:
        if inbound.unreadable:
            raise RuntimeError("the journal refuses this one")
        return await real(inbound, kind, note, lease)

    monkeypatch.setattr(adapter_rig.gateway.store, "journal_add", failing_for_markers)
    bad = tg.push_update(put({"message": tg.message_template(USER, USER, SECRET)}, ("message", "date"), "x"))
    async with running(channel, adapter_rig):
        await serves_after(tg)
    offsets = [c.params.get("offset") or 0 for c in tg.calls_to("getUpdates")]
    assert max(offsets) > bad["update_id"], "acknowledged all the same"
    assert adapter_rig.metric("chital_malformed_events_total", platform="telegram", kind="dropped") == 1
    assert adapter_rig.metric("chital_malformed_events_total", platform="telegram", kind="message") == 1
    assert not bot_says(tg, USER, "couldn't read")()
