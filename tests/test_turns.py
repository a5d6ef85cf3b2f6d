"""Queueing, in process: order per conversation, parallel across them, the queued sign, /stop.

Real Gateway, TurnQueue, Store and delivery; a FakeChannel and a scripted FakeHarness whose turns
wait on events the test sets, so "busy" and "done" are exact, not timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from agent.events import AgentEvent, Final, TextDelta
from tests.fakes.fake_harness import Call, Script
from tests.fakes.gateway_rig import ADMIN, USER, Rig, fake_rig, make_config, quiet, replied, settled, until

QUEUED_1 = "⏳ Queued behind the current answer; I'll answer here."


def blocked_until(release: asyncio.Event, answer: str) -> Script:
    """A script: streams a little, then waits for ``release`` before its final answer."""

    async def script(call: Call) -> AsyncIterator[AgentEvent]:
        yield TextDelta("working on it")
        await release.wait()
        yield Final(answer)

    return script


async def test_one_conversation_runs_in_arrival_order(rig: Rig) -> None:
    ch, harness = rig.channel, rig.harness
    harness.gate.clear()
    msgs = [ch.message(USER, f"m{i}") for i in range(4)]
    for msg in msgs:
        await ch.deliver(msg)
    await until(lambda: len(harness.calls) == 1, what="first turn started")
    await quiet(0.1)
    assert len(harness.calls) == 1, "the next turn waits for the running one"
    harness.gate.set()
    for msg in msgs:
        await until(replied(ch, msg, f"echo: {msg.text}"), what=msg.text)
    assert [c.text for c in harness.calls] == ["m0", "m1", "m2", "m3"]
    first_reply_ids = [next(m for m in ch.sent if m.target.reply_to == msg.message_id) for msg in msgs]
    assert [int(m.message_id) for m in first_reply_ids] == sorted(int(m.message_id) for m in first_reply_ids)


async def test_conversations_run_in_parallel(rig: Rig) -> None:
    ch, harness = rig.channel, rig.harness
    release = asyncio.Event()
    harness.on("slow one", blocked_until(release, "finally"))
    slow = ch.message(USER, "slow one")
    fast = ch.message(ADMIN, "fast one")
    await ch.deliver(slow)
    await until(lambda: harness.calls, what="slow turn running")
    await ch.deliver(fast)
    assert await until(lambda: ch.replies_to(fast.message_id), what="fast answer") == ["echo: fast one"]
    assert not release.is_set() and ch.replies_to(slow.message_id) in ([], ["working on it"])
    release.set()
    assert await until(lambda: ch.replies_to(slow.message_id) == ["finally"], what="slow answer")


async def test_the_global_cap_queues_visibly_across_conversations(tmp_path: Path) -> None:
    config = make_config(access={"allow_users": [str(USER), str(ADMIN)]}, concurrency={"max_turns": 1})
    async with fake_rig(tmp_path, config) as rig:
        ch, harness = rig.channel, rig.harness
        release = asyncio.Event()
        harness.on("hog", blocked_until(release, "done hogging"))
        await ch.deliver(ch.message(USER, "hog"))
        await until(lambda: harness.calls, what="hog running")
        other = ch.message(ADMIN, "me too")
        await ch.deliver(other)
        assert await until(lambda: ch.replies_to(other.message_id), what="queued sign") == [QUEUED_1]
        assert len(harness.calls) == 1
        release.set()
        await until(lambda: ch.replies_to(other.message_id) == ["echo: me too"], what="answer")
        assert len(ch.replies_to(other.message_id)) == 1, "the sign became the answer"


async def test_a_waiting_message_gets_a_queued_sign_that_becomes_its_answer(rig: Rig) -> None:
    ch, harness = rig.channel, rig.harness
    release = asyncio.Event()
    harness.on("first", blocked_until(release, "first answer"))
    first, second, third = (ch.message(USER, t) for t in ("first", "second", "third"))
    await ch.deliver(first)
    await until(lambda: harness.calls, what="first running")
    await ch.deliver(second)
    await ch.deliver(third)
    assert await until(lambda: ch.replies_to(second.message_id), what="sign 2") == [QUEUED_1]
    assert await until(lambda: ch.replies_to(third.message_id), what="sign 3") == [
        "⏳ Queued behind 2 messages; I'll answer here."
    ]
    sign_id = next(m.message_id for m in ch.sent if m.target.reply_to == second.message_id)
    release.set()
    await until(lambda: ch.replies_to(third.message_id) == ["echo: third"], what="third answer")
    assert ch.replies_to(second.message_id) == ["echo: second"]
    assert ch.platform.messages[sign_id].texts == [QUEUED_1, "echo: second"], "edited, not re-sent"


async def test_a_quick_turn_gets_no_queued_sign(rig: Rig) -> None:
    ch = rig.channel
    msgs = [ch.message(USER, f"q{i}") for i in range(3)]
    for msg in msgs:
        await ch.deliver(msg)
    for msg in msgs:
        await until(replied(ch, msg, f"echo: {msg.text}"), what=msg.text)
    assert all(texts == [texts[-1]] for texts in (m.texts for m in ch.sent)), "no sign was ever shown"


async def test_stop_cancels_the_running_turn_and_the_queue_goes_on(rig: Rig) -> None:
    ch, harness, store = rig.channel, rig.harness, rig.store
    never = asyncio.Event()
    harness.on("endless", blocked_until(never, "unreachable"))
    endless, after = ch.message(USER, "endless"), ch.message(USER, "after")
    await ch.deliver(endless)
    await until(lambda: harness.calls, what="endless running")
    await ch.deliver(after)
    stop = ch.message(USER, "/stop")
    await ch.deliver(stop)
    assert await until(lambda: ch.replies_to(stop.message_id), what="stop reply") == [
        "⏹ Stopping the current answer."
    ]
    assert await until(lambda: ch.replies_to(endless.message_id) == ["⏹ Stopped."], what="stopped")
    assert await until(lambda: ch.replies_to(after.message_id) == ["echo: after"], what="next in queue")
    await until(lambda: rig.metric("chital_turns_total", outcome="stopped") == 1, what="outcome")
    # A stopped turn is finished, not resumed later (waited for: the last reply can reach the
    # platform a moment before its entry is marked done, longer on PostgreSQL).
    assert await settled(store) == {"done": 3}

    idle_stop = ch.message(USER, "/stop")
    await ch.deliver(idle_stop)
    assert await until(lambda: ch.replies_to(idle_stop.message_id), what="idle stop") == [
        "Nothing is running."
    ]
