"""In process: busy modes at the moments a daemon cannot be put in on cue (docs/steering.md).

Real Gateway, TurnQueue, Store and delivery; a FakeChannel and a scripted FakeHarness whose turn
takes its inbox when the test says (as the agent's middleware does before each model call). The
end-to-end versions (real SDKs, the real agent, kill -9) are in tests/test_e2e_steering.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent.events import AgentEvent, Final, TurnFailed
from agent.steering import SteerMessage
from channels.base import Inbound
from gateway.turns import stopping
from gateway.turns.busy import ADDED, INTERRUPTED, MAX_STEERS
from tests.fakes.fake_harness import Call, Script
from tests.fakes.gateway_rig import ADMIN, USER, Rig, fake_rig, make_config, settled, until

GROUP = "-500"


def config(mode: str = "steer") -> object:
    return make_config(
        access={"admins": [str(ADMIN)], "allow_users": [str(USER), "300"], "group_policy": "mention"},
        channels={"telegram": {"enabled": True, "token": "1:x", "busy_mode": mode}},
        delivery={"first_edit_delay": 0.05},
    )


def taking(steps: list[asyncio.Event], took: list[list[SteerMessage]], answer: str) -> Script:
    """A turn that makes one model call per event: it waits for the event, then takes its inbox."""

    async def script(call: Call) -> AsyncIterator[AgentEvent]:
        for step in steps:
            await step.wait()
            assert call.options.inbox is not None
            took.append(call.options.inbox.take())
        yield Final(answer)

    return script


async def task_running(rig: Rig, script: Script, **message: Any) -> Inbound:
    """Deliver ``task`` from USER (``message`` as :meth:`FakeChannel.message` takes it), answered by
    ``script``, and return it once its turn runs: the moment every busy mode is about."""
    rig.harness.on("task", script)
    task = rig.channel.message(USER, "task", **message)
    await rig.channel.deliver(task)
    await until(lambda: rig.harness.calls, what="running")
    return task


async def test_a_steer_after_the_last_model_call_is_answered_once_on_its_own(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig:  # type: ignore[arg-type]
        ch, harness = rig.channel, rig.harness
        call, end = asyncio.Event(), asyncio.Event()
        took: list[list[SteerMessage]] = []
        harness.on("task", taking([call], took, "task answer"))
        call.set()
        original = harness.scripts["task"]

        async def slow_end(c: Call) -> AsyncIterator[AgentEvent]:
            async for event in original(c):
                await end.wait()  # its last model call is done: it only ends now
                yield event

        harness.on("task", slow_end)
        task = ch.message(USER, "task")
        await ch.deliver(task)
        await until(lambda: took, what="the last model call")
        steer = ch.message(USER, "steer me")
        await ch.deliver(steer)
        end.set()
        await until(lambda: ch.replies_to(steer.message_id) == ["echo: steer me"], what="answered alone")
        assert ch.replies_to(task.message_id) == ["task answer"]
        assert took == [[]], "the turn never took it"
        assert [c.text for c in harness.calls] == ["task", "steer me"], "run once, as its own turn"
        assert await settled(rig.store) == {"done": 2}


async def test_a_steer_while_the_answer_is_being_sent_is_answered_after_it(tmp_path: Path) -> None:
    """The turn finished and is delivering (its entry not marked yet): the steer is queued."""
    async with fake_rig(tmp_path, config()) as rig:  # type: ignore[arg-type]
        ch, harness = rig.channel, rig.harness
        ch.hold("send")
        task = ch.message(USER, "task")
        await ch.deliver(task)
        await until(lambda: ch.held("send") == 1, what="the answer on its way")
        steer = ch.message(USER, "steer me")
        await ch.deliver(steer)
        ch.release("send")
        await until(lambda: ch.replies_to(steer.message_id) == ["echo: steer me"], what="answered after")
        assert ch.replies_to(task.message_id) == ["echo: task"]
        assert [c.text for c in harness.calls] == ["task", "steer me"]
        assert await settled(rig.store) == {"done": 2}


async def test_a_taken_steer_is_done_with_its_turn_and_never_runs_again(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig:  # type: ignore[arg-type]
        ch, harness = rig.channel, rig.harness
        first, second = asyncio.Event(), asyncio.Event()
        took: list[list[SteerMessage]] = []
        task = await task_running(rig, taking([first, second], took, "task answer"))
        steer = ch.message(USER, "steer me <b>now</b>")
        await ch.deliver(steer)
        first.set()
        await until(lambda: took, what="first call")
        second.set()
        await until(lambda: ch.replies_to(task.message_id) == ["task answer"], what="answer")
        assert await settled(rig.store) == {"done": 2}
        assert took[0] == [SteerMessage(steer.key, steer.user, "steer me <b>now</b>")]
        assert took[1] == [], "taken once"
        assert ch.replies_to(steer.message_id) == [ADDED]
        assert [c.text for c in harness.calls] == ["task"], "never a turn of its own"


async def test_a_steer_taken_by_a_turn_that_is_stopped_shows_the_stop(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig:  # type: ignore[arg-type]
        ch, harness = rig.channel, rig.harness
        first, never = asyncio.Event(), asyncio.Event()
        took: list[list[SteerMessage]] = []
        task = await task_running(rig, taking([first, never], took, "never"))
        steer = ch.message(USER, "steer me")
        await ch.deliver(steer)
        first.set()
        await until(lambda: ch.replies_to(steer.message_id) == [ADDED], what="taken")
        await ch.deliver(ch.message(USER, "/stop"))
        await until(lambda: ch.replies_to(task.message_id) == [stopping.STOPPED], what="stopped")
        await until(lambda: "Stopped" in "".join(ch.replies_to(steer.message_id)), what="steer's outcome")
        assert await settled(rig.store) == {"done": 3}
        assert [c.text for c in harness.calls] == ["task"]


async def test_a_steer_taken_by_a_turn_that_fails_is_not_asked_again(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig:  # type: ignore[arg-type]
        ch, harness = rig.channel, rig.harness
        go = asyncio.Event()

        async def failing(call: Call) -> AsyncIterator[AgentEvent]:
            await go.wait()
            assert call.options.inbox is not None
            call.options.inbox.take()
            yield TurnFailed("The model service failed.")

        task = await task_running(rig, failing)
        steer = ch.message(USER, "steer me")
        await ch.deliver(steer)
        go.set()
        await until(lambda: ch.replies_to(task.message_id) == ["⚠️ The model service failed."], what="failed")
        await settled(rig.store)
        assert [c.text for c in harness.calls] == ["task"]
        assert ch.replies_to(steer.message_id) == [ADDED], "its outcome is the answer it was added to"


async def test_in_a_group_another_members_message_never_steers_but_an_admins_does(tmp_path: Path) -> None:
    async with fake_rig(tmp_path, config()) as rig:  # type: ignore[arg-type]
        ch, harness = rig.channel, rig.harness
        first, second = asyncio.Event(), asyncio.Event()
        took: list[list[SteerMessage]] = []
        await task_running(rig, taking([first, second], took, "task answer"), chat=GROUP, addressed=True)
        other = ch.message(300, "mine instead", chat=GROUP, addressed=True)
        admin = ch.message(ADMIN, "admin note", chat=GROUP, addressed=True)
        stranger = ch.message(999, "stranger text", chat=GROUP, addressed=True)
        for m in (other, admin, stranger):
            await ch.deliver(m)
        first.set()
        await until(lambda: took, what="first call")
        second.set()
        await until(lambda: ch.replies_to(other.message_id) == ["echo: mine instead"], what="other queued")
        assert [m.text for m in took[0]] == ["admin note"]
        assert "stranger text" not in [c.text for c in harness.calls]
        assert [c.text for c in harness.calls][:2] == ["task", "mine instead"]


async def test_an_inbox_holds_a_bounded_number_of_steers_the_rest_queue(tmp_path: Path) -> None:
    cfg = make_config(
        access={"admins": [str(ADMIN)], "allow_users": [str(USER)]},
        channels={"telegram": {"enabled": True, "token": "1:x", "busy_mode": "steer"}},
        concurrency={"max_queue_per_conversation": 50},
    )
    async with fake_rig(tmp_path, cfg) as rig:
        ch, harness = rig.channel, rig.harness
        first = asyncio.Event()
        took: list[list[SteerMessage]] = []
        await task_running(rig, taking([first], took, "task answer"))
        for i in range(MAX_STEERS + 2):
            await ch.deliver(ch.message(USER, f"more {i}"))
        first.set()
        await until(lambda: len(harness.calls) == 3, timeout=15, what="the two over the bound, queued")
        assert len(took[0]) == MAX_STEERS
        assert await settled(rig.store, timeout=15) == {"done": MAX_STEERS + 3}


async def test_interrupt_before_the_turn_ran_a_step_shows_the_note(tmp_path: Path) -> None:
    """The interrupted turn's outcome is its note whenever the stop lands; the new message is
    answered with the old one quoted as context."""
    async with fake_rig(tmp_path, config("interrupt")) as rig:  # type: ignore[arg-type]
        ch, harness = rig.channel, rig.harness
        task = await task_running(rig, taking([asyncio.Event()], [], "never"), name="Ann")
        newer = ch.message(USER, "newer")
        await ch.deliver(newer)
        await until(lambda: ch.replies_to(newer.message_id) == ["echo: newer"], what="newer answered")
        assert ch.replies_to(task.message_id) == [INTERRUPTED]
        context = harness.calls[-1].options.context
        assert [(c.author, c.text) for c in context] == [("Ann", "task")]
        assert await settled(rig.store) == {"done": 2}


# -- /busy ------------------------------------------------------------------------------------------------
async def test_busy_is_an_admin_command_stored_per_conversation(rig: Rig) -> None:
    ch = rig.channel
    asked = ch.message(USER, "/busy steer")
    await ch.deliver(asked)
    await until(lambda: ch.replies_to(asked.message_id), what="refusal")
    assert await rig.store.busy_mode(asked.conversation) is None
    admin = ch.message(ADMIN, "/busy steer")
    await ch.deliver(admin)
    reply = await until(lambda: ch.replies_to(admin.message_id), what="set")
    assert "steer" in reply[0]
    assert await rig.store.busy_mode(admin.conversation) == "steer"
    assert await rig.gateway.busy.mode(admin) == "steer"
    bad = ch.message(ADMIN, "/busy \u202estreet\u200b [x](https://evil.example) <!everyone>")
    await ch.deliver(bad)
    text = (await until(lambda: ch.replies_to(bad.message_id), what="unknown mode"))[0]
    assert "\u202e" not in text and "\u200b" not in text and "is not a busy mode" in text
    assert "`" in text, "echoed in a code span, never as a live link or mention"
    back = ch.message(ADMIN, "/busy default")
    await ch.deliver(back)
    await until(lambda: ch.replies_to(back.message_id), what="forgotten")
    assert await rig.store.busy_mode(admin.conversation) is None
    assert await rig.gateway.busy.mode(admin) == "queue", "read again at once after /busy"


async def test_a_bare_steer_command_says_how_to_use_it(rig: Rig) -> None:
    ch = rig.channel
    bare = ch.message(USER, "/steer")
    await ch.deliver(bare)
    text = (await until(lambda: ch.replies_to(bare.message_id), what="usage"))[0]
    assert "/steer <your message>" in text
    assert rig.harness.calls == []


async def test_the_daemons_secrets_are_masked_in_steered_and_interrupted_text(tmp_path: Path) -> None:
    """A user pastes the bot's token into a steer and into a message that gets interrupted: the
    model provider gets neither."""
    token = "123456789:AAHsecretTokenValue_do_not_leak_0987"
    cfg = make_config(
        access={"admins": [str(ADMIN)], "allow_users": [str(USER)]},
        channels={"telegram": {"enabled": True, "token": token, "busy_mode": "steer"}},
    )
    async with fake_rig(tmp_path, cfg) as rig:
        ch, harness = rig.channel, rig.harness
        first = asyncio.Event()
        took: list[list[SteerMessage]] = []
        await task_running(rig, taking([first], took, "task answer"))
        await ch.deliver(ch.message(USER, f"the key is {token}"))
        first.set()
        await until(lambda: took, what="taken")
        assert token not in took[0][0].text and "the key is" in took[0][0].text
        await settled(rig.store)
        harness.gate.clear()  # every turn now waits after being recorded
        await ch.deliver(ch.message(USER, f"please use {token}"))
        await until(lambda: len(harness.calls) == 2, what="the turn with the token running")
        await ch.deliver(ch.message(USER, "/interrupt now"))
        await until(lambda: len(harness.calls) == 3, what="the interrupting turn")
        quoted = harness.calls[-1].options.context
        harness.gate.set()
        assert [c.text for c in quoted] and all(token not in c.text for c in quoted), quoted
        assert "please use" in quoted[0].text
