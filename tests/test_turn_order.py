"""In process: /stop whatever state the turn is in, and queued signs below the answers ahead.

Real Gateway, TurnQueue, Store and delivery; a FakeChannel and a scripted FakeHarness whose turns
wait on events the test sets. The end-to-end versions (real SDKs, a daemon, kill -9) are in
tests/test_e2e_ordering.py; these cover the states a daemon cannot be put in on cue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.events import AgentEvent, Final
from gateway.store.entries import JournalEntry, JournalKind
from gateway.turns import stopping
from gateway.turns.queued_sign import WORKING
from tests.fakes.fake_channel import FakeChannel
from tests.fakes.fake_harness import Call, Script
from tests.fakes.gateway_rig import ADMIN, USER, Rig, fake_rig, make_config, settled, until

QUEUED_1 = "⏳ Queued behind the current answer; I'll answer here."


def silent_until(release: asyncio.Event, answer: str) -> Script:
    """A script with no text at all until ``release`` (a model whose first token is slow)."""

    async def script(call: Call) -> AsyncIterator[AgentEvent]:
        await release.wait()
        yield Final(answer)

    return script


async def test_a_stop_right_behind_its_message_stops_it_before_it_starts(rig: Rig) -> None:
    """The message and its /stop handed over back to back (one getUpdates batch): the turn's task
    exists but has not run a step when /stop cancels it."""
    ch, harness = rig.channel, rig.harness
    question, stop = ch.message(USER, "a question"), ch.message(USER, "/stop")
    await ch.deliver(question)
    await ch.deliver(stop)
    assert await until(lambda: ch.replies_to(question.message_id), what="outcome") == [stopping.STOPPED]
    assert await until(lambda: ch.replies_to(stop.message_id), what="stop reply") == [stopping.STOPPING]
    assert await settled(rig.store) == {"done": 2}
    assert "echo: a question" not in ch.in_chat(str(USER))
    assert rig.metric("chital_turns_total", outcome="stopped") == 1
    assert all(c.text != "a question" for c in harness.calls[1:]), "never run after the stop"


async def test_a_stop_takes_a_turn_waiting_for_a_slot_off_the_queue(tmp_path: Path) -> None:
    config = make_config(access={"allow_users": [str(USER), str(ADMIN)]}, concurrency={"max_turns": 1})
    async with fake_rig(tmp_path, config) as rig:
        ch, harness = rig.channel, rig.harness
        release = asyncio.Event()
        harness.on("hog", silent_until(release, "done hogging"))
        await ch.deliver(ch.message(ADMIN, "hog"))
        await until(lambda: harness.calls, what="hog running")
        waiting = ch.message(USER, "me too")
        await ch.deliver(waiting)
        assert await until(lambda: ch.replies_to(waiting.message_id), what="sign") == [QUEUED_1]
        stop = ch.message(USER, "/stop")
        await ch.deliver(stop)
        assert await until(lambda: ch.replies_to(stop.message_id), what="stop reply") == [stopping.STOPPING]
        await until(lambda: ch.replies_to(waiting.message_id) == [stopping.STOPPED], what="sign → Stopped")
        release.set()
        await until(lambda: "done hogging" in ch.in_chat(str(ADMIN)), what="hog answered")
        assert await settled(rig.store) == {"done": 3}
        assert [c.text for c in harness.calls] == ["hog"], "the stopped message never ran"
        sign = next(m for m in ch.sent if m.target.reply_to == waiting.message_id)
        assert sign.texts == [QUEUED_1, stopping.STOPPED], "the sign itself shows the outcome"


async def test_a_stop_run_again_stops_the_same_message_not_the_next(rig: Rig) -> None:
    """A /stop re-run after a restart (its reply never recorded) must not stop the turn that
    runs now: the first run recorded which one it stopped."""
    ch, harness = rig.channel, rig.harness
    first_go, second_go = asyncio.Event(), asyncio.Event()
    harness.on("first", silent_until(first_go, "first answer"))
    harness.on("second", silent_until(second_go, "second answer"))
    first, second = ch.message(USER, "first"), ch.message(USER, "second")
    await ch.deliver(first)
    await until(lambda: harness.calls, what="first running")
    await ch.deliver(second)
    stop = JournalEntry.new(ch.message(USER, "/stop"), JournalKind.COMMAND)
    assert await stopping.stop(rig.gateway, stop) == stopping.STOPPING
    await until(lambda: ch.replies_to(first.message_id) == [stopping.STOPPED], what="first stopped")
    await until(lambda: len(harness.calls) == 2, what="second running")
    assert await stopping.stop(rig.gateway, stop) == stopping.STOPPING  # the re-run
    second_go.set()
    await until(lambda: ch.replies_to(second.message_id) == ["second answer"], what="second answered")


async def test_a_stop_while_the_answer_is_being_sent_leaves_it_whole(rig: Rig) -> None:
    ch = rig.channel
    ch.hold("send")
    question = ch.message(USER, "quick one")
    await ch.deliver(question)
    await until(lambda: ch.held("send") == 1, what="the answer on its way")
    stop = ch.message(USER, "/stop")
    await ch.deliver(stop)
    while await rig.store.command_result(stop.key) is None:  # decided; its reply waits in the pacer
        await asyncio.sleep(0.01)
    ch.release("send")
    assert await until(lambda: ch.replies_to(stop.message_id), what="stop reply") == [stopping.TOO_LATE]
    assert await until(lambda: ch.replies_to(question.message_id), what="answer") == ["echo: quick one"]
    assert await settled(rig.store) == {"done": 2}


async def test_a_stopped_reply_the_network_lost_is_sent_again(rig: Rig) -> None:
    from channels.base import ChannelError

    ch, harness = rig.channel, rig.harness
    harness.on("long", silent_until(asyncio.Event(), "never"))
    question = ch.message(USER, "long")
    await ch.deliver(question)
    await until(lambda: harness.calls, what="running")
    ch.fail("send", ChannelError("connection reset"), times=2)  # the stop's reply and "Stopped"
    stop = ch.message(USER, "/stop")
    await ch.deliver(stop)
    await until(lambda: ch.replies_to(stop.message_id) == [stopping.STOPPING], timeout=15, what="retried")
    await until(lambda: ch.replies_to(question.message_id) == [stopping.STOPPED], timeout=15, what="retried")
    assert await settled(rig.store, timeout=15) == {"done": 2}


# -- the queued sign, in the modes the end-to-end tests do not run ----------------------------------------
@pytest.mark.parametrize("mode", ["drafts", "no streaming"])
async def test_the_queued_sign_reads_below_the_answer_it_waits_for(tmp_path: Path, mode: str) -> None:
    config = make_config(
        access={"allow_users": [str(USER)]},
        delivery={"first_edit_delay": 0.05, "stream": mode != "no streaming"},
    )
    async with fake_rig(tmp_path, config, channel=FakeChannel(drafts=mode == "drafts")) as rig:
        ch, harness = rig.channel, rig.harness
        release = asyncio.Event()
        harness.on("m0", silent_until(release, "answer zero"))
        m0, m1 = ch.message(USER, "m0"), ch.message(USER, "m1")
        await ch.deliver(m0)
        await until(lambda: harness.calls, what="m0 running")
        await ch.deliver(m1)
        await until(lambda: ch.replies_to(m1.message_id) == [QUEUED_1], what="m1's sign")
        assert ch.in_chat(str(USER)) == [WORKING, QUEUED_1], "m0's reply is posted above the sign"
        release.set()
        await until(
            lambda: ch.in_chat(str(USER)) == ["answer zero", "echo: m1"], what="both answers in order"
        )
