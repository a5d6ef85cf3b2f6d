"""End to end: answers read in the order they were asked, and a /stop is final.

`chital run` as a subprocess, the real SDKs against the fake platforms, the fake model. What is
asserted is the chat as its members read it: the bot's messages in the order they were posted
(message id / post order), with their current text (drafts are not messages).

Ordering: m0's model call is held until the test has seen m1's "Queued behind" sign, so m1 always
waits behind an answer that has no text yet (a real model's first token takes longer than the 0.4 s
grace): the sign must still read below m0's answer, in every streaming mode.

/stop: a message and its /stop fetched in one getUpdates batch, and a kill -9 between a stop and its
visible "Stopped.": the message gets one "Stopped." reply, is never answered, and a restart neither
answers it nor shows the outcome twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.gateway_rig import daemon_rows
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram, Seen

OWNER = 1001
GROUP = -100200300
SLACK_USER, SLACK_DM = "U_FRIEND", "D_FRIEND"
DISCORD_USER = "424242424242424242"
FIRST, SECOND = "first question", "second question"
FIRST_ANSWER, SECOND_ANSWER = "the first answer", f"echo: {SECOND}"
QUEUED = "Queued behind"
STOPPED = "⏹ Stopped."


def owner_config(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> dict[str, Any]:
    """Telegram on, only OWNER allowed (no pairing)."""
    return chat_config(tmp_path, model.base_url, tg, allow=[str(OWNER)], group_policy="mention")


def held_first_answer(model: FakeOpenAI) -> asyncio.Event:
    """m0's model call answers only once the returned event is set."""
    release = asyncio.Event()
    model.add_rule(lambda t: t.endswith(FIRST), Reply(text=FIRST_ANSWER, hold=release))
    return release


async def asked(model: FakeOpenAI, text: str) -> None:
    """Wait until the model has the request of ``text``'s turn: that turn runs, without any text."""
    for _ in range(3000):
        if any(last_user_text(r).endswith(text) for r in model.requests):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the model never got {text!r}")


def in_order(posted: list[tuple[int, str]]) -> list[str]:
    """The texts of the bot's messages as read top to bottom (by post order)."""
    return [text for _, text in sorted(posted)]


def assert_read_in_order(texts: list[str]) -> None:
    """m0's answer above m1's, each once, and nothing left over (no sign, no placeholder)."""
    assert texts == [FIRST_ANSWER, SECOND_ANSWER], texts


# -- Telegram: a DM (drafts) and a group (edits) ----------------------------------------------------------
@pytest.mark.parametrize("where", ["dm", "group"])
async def test_telegram_queued_sign_never_reads_above_the_answer_it_waits_for(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, where: str
) -> None:
    release = held_first_answer(model)
    chat = OWNER if where == "dm" else GROUP

    def send(text: str) -> dict[str, Any]:
        if where == "dm":
            return tg.inject_message(OWNER, OWNER, text)
        return tg.inject_mention(GROUP, OWNER, text)

    def bot(chat_id: int) -> list[Seen]:
        return tg.bot_messages(chat_id)

    async with started_daemon(tmp_path, owner_config(tmp_path, tg, model)):
        m0 = send(FIRST)
        await asked(model, FIRST)
        m1 = send(SECOND)
        m1_id = m1["message"]["message_id"]
        sign = await tg.wait_for(
            lambda: next((m for m in bot(chat) if m.reply_to == m1_id and QUEUED in m.text), None),
            timeout=30,
            what="m1's queued sign",
        )
        above = [m for m in bot(chat) if m.message_id < sign.message_id]
        assert [m.reply_to for m in above] == [m0["message"]["message_id"]], "m0's reply is above the sign"
        release.set()
        await tg.wait_for(
            lambda: [m.text for m in bot(chat)] == [FIRST_ANSWER, SECOND_ANSWER],
            timeout=30,
            what=f"both answers: {[m.text for m in bot(chat)]}",
        )
        assert_read_in_order(in_order([(m.message_id, m.text) for m in bot(chat)]))
        assert tg.message(chat, sign.message_id).text == SECOND_ANSWER, "the sign became m1's answer"


# -- Slack and Discord DMs ----------------------------------------------------------------------------
async def test_slack_queued_sign_never_reads_above_the_answer_it_waits_for(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    release = held_first_answer(model)
    cfg = chat_config(tmp_path, model.base_url, slack, allow=[f"slack:{SLACK_USER}"], group_policy="mention")
    async with started_daemon(tmp_path, cfg, slack):

        def posted() -> list[tuple[int, str]]:
            return [(i, p.text) for i, p in enumerate(slack.posts) if p.channel == SLACK_DM]

        await slack.inject_dm(SLACK_DM, SLACK_USER, FIRST)
        await asked(model, FIRST)
        await slack.inject_dm(SLACK_DM, SLACK_USER, SECOND)
        signs = await slack.wait_for(lambda: [i for i, t in posted() if QUEUED in t], timeout=30)
        assert len(posted()[: signs[0]]) == 1, "m0's reply is posted above the sign"
        release.set()
        await slack.wait_for(lambda: in_order(posted()) == [FIRST_ANSWER, SECOND_ANSWER] or None, timeout=30)
        assert_read_in_order(in_order(posted()))


async def test_discord_queued_sign_never_reads_above_the_answer_it_waits_for(
    tmp_path: Path, dc: FakeDiscord, model: FakeOpenAI
) -> None:
    release = held_first_answer(model)
    cfg = chat_config(tmp_path, model.base_url, dc, allow=[f"discord:{DISCORD_USER}"], group_policy="mention")
    async with started_daemon(tmp_path, cfg, dc):
        channel = dc.dm_channel(DISCORD_USER)

        def posted() -> list[tuple[int, str]]:
            return [(int(m.id), m.content) for m in dc.bot_messages(channel)]

        m0 = await dc.inject_dm(DISCORD_USER, FIRST)
        await asked(model, FIRST)
        m1 = await dc.inject_dm(DISCORD_USER, SECOND)
        sign = await dc.wait_for(
            lambda: next(
                (m for m in dc.bot_messages(channel) if m.reply_to == m1 and QUEUED in m.content), None
            ),
            timeout=30,
        )
        above = [m for m in dc.bot_messages(channel) if int(m.id) < int(sign.id)]
        assert [m.reply_to for m in above] == [m0], "m0's reply is above the sign"
        release.set()
        await dc.wait_for(lambda: in_order(posted()) == [FIRST_ANSWER, SECOND_ANSWER] or None, timeout=30)
        assert_read_in_order(in_order(posted()))


# -- /stop ------------------------------------------------------------------------------------------------
def replies_to(tg: FakeTelegram, update: dict[str, Any]) -> list[str]:
    mid = update["message"]["message_id"]
    return [m.text for m in tg.bot_messages(OWNER) if m.reply_to == mid]


async def shows(tg: FakeTelegram, update: dict[str, Any], needle: str) -> list[str]:
    return await tg.wait_for(
        lambda: [t for t in replies_to(tg, update) if needle in t],
        timeout=30,
        what=f"a reply with {needle!r}",
    )


async def journal_settled(cfg: dict[str, Any], updates: list[dict[str, Any]]) -> None:
    keys = tuple(f"telegram:{OWNER}:{u['message']['message_id']}" for u in updates)
    sql = f"SELECT key FROM journal WHERE state = 'done' AND key IN ({', '.join('?' * len(keys))})"
    for _ in range(3000):
        if len(daemon_rows(cfg["storage"], sql, keys)) == len(keys):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the journal never marked them done")


def stop_command(tg: FakeTelegram) -> dict[str, Any]:
    return tg.inject_command(OWNER, OWNER, "stop", chat_type="private", at=None)


async def still_unanswered_after_a_later_turn(
    tg: FakeTelegram, model: FakeOpenAI, stopped: dict[str, Any]
) -> None:
    """A later message of the same chat is answered; had the stopped one been resumed, it would
    have run first (one conversation runs in arrival order). It shows "Stopped." once, no answer."""
    later = tg.inject_message(OWNER, OWNER, "and now something else")
    await shows(tg, later, "echo: and now something else")
    texts = replies_to(tg, stopped)
    assert len(texts) == 1 and STOPPED in texts[0], texts
    assert not any("never shown" in t or "echo: please stop me" in t for t in tg.bot_texts(OWNER))


async def test_stop_in_the_same_batch_is_the_messages_outcome_and_a_restart_keeps_it(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    cfg = owner_config(tmp_path, tg, model)
    async with started_daemon(tmp_path, cfg) as daemon:
        question = tg.inject_message(OWNER, OWNER, "please stop me")
        stop = stop_command(tg)  # no await in between: one getUpdates batch carries both
        assert [u["update_id"] for u in tg.pending_updates][-2:] == [question["update_id"], stop["update_id"]]
        await shows(tg, question, STOPPED)
        await shows(tg, stop, "Stopping the current answer")
        # Killed once both are recorded (a kill while Telegram's answer to a send is in flight
        # posts it twice, the inherent case of docs/durability.md): the restart has nothing to do.
        await journal_settled(cfg, [question, stop])
        daemon.kill9()
        await daemon.wait_exit()
        await daemon.start()
        await still_unanswered_after_a_later_turn(tg, model, question)
        key = f"telegram:{OWNER}:{question['message']['message_id']}"
        rows = daemon_rows(cfg["storage"], "SELECT kind, state FROM journal WHERE key = ?", (key,))
        assert rows == [("notice", "done")], "the stop is its outcome, and nothing is left to resume"


@pytest.mark.parametrize("when", ["same batch", "while running"])
async def test_kill_between_a_stop_and_its_outcome_shows_it_once_after_the_restart(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, when: str
) -> None:
    hold = asyncio.Event()
    model.add_rule(lambda t: t.endswith("please stop me"), Reply(text="never shown", hold=hold))
    async with started_daemon(tmp_path, owner_config(tmp_path, tg, model)) as daemon:
        killed = asyncio.Event()
        tg.before_call = kill_at_the_outcome(daemon, tg, killed)
        question = tg.inject_message(OWNER, OWNER, "please stop me")
        if when == "while running":
            await asked(model, "please stop me")
        stop_command(tg)
        await asyncio.wait_for(killed.wait(), 30)
        await daemon.wait_exit()
        tg.before_call = None
        assert replies_to(tg, question) == [], "the outcome never reached the chat"
        await daemon.start()
        await shows(tg, question, STOPPED)
        await still_unanswered_after_a_later_turn(tg, model, question)
        hold.set()


def kill_at_the_outcome(
    daemon: DaemonProcess, tg: FakeTelegram, killed: asyncio.Event
) -> Callable[[str, dict[str, Any]], None]:
    """A hook for the fake: kill -9 the daemon as its "Stopped." reaches Telegram, which then
    never posts it (the connection drops): the stop is decided, its outcome not yet shown."""

    def hook(method: str, params: dict[str, Any]) -> None:
        if method == "sendMessage" and STOPPED in str(params.get("text", "")) and not killed.is_set():
            daemon.kill9()
            tg.fail_next(method, 0)
            killed.set()

    return hook


async def test_a_lost_stopped_reply_is_retried_and_a_kill_meanwhile_does_not_lose_it(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The network drops the running turn's "Stopped." (nothing posted): it is retried, not
    forgotten; a kill -9 while the retry waits leaves it to the restart, which shows it once."""
    hold = asyncio.Event()
    model.add_rule(lambda t: t.endswith("please stop me"), Reply(text="never shown", hold=hold))
    cfg = owner_config(tmp_path, tg, model)
    async with started_daemon(tmp_path, cfg) as daemon:
        dropped = asyncio.Event()

        def drop_once(method: str, params: dict[str, Any]) -> None:
            if method == "sendMessage" and STOPPED in str(params.get("text", "")) and not dropped.is_set():
                tg.fail_next(method, 0)
                dropped.set()

        tg.before_call = drop_once
        question = tg.inject_message(OWNER, OWNER, "please stop me")
        await asked(model, "please stop me")
        stop = stop_command(tg)
        await shows(tg, stop, "Stopping the current answer")
        await asyncio.wait_for(dropped.wait(), 30)
        await journal_settled(cfg, [stop])
        daemon.kill9()
        await daemon.wait_exit()
        await daemon.start()
        await shows(tg, question, STOPPED)
        await still_unanswered_after_a_later_turn(tg, model, question)
        hold.set()
