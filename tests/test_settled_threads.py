"""The state read a turn skips on a thread whose last turn finished on this daemon
(agent/settled.py), and the runs that must still read it, on a daemon's own SQLite file and on
shared PostgreSQL checkpoints: a steered message's own entry run again, an approval pressed after
a newer turn, images brought by a turn another daemon ran. Each was answered twice, overwritten or
sent to a text-only model while the read was skipped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from agent.approvals import with_approvals
from agent.config import AgentSettings, ModelSpec, VisionSettings
from agent.events import ApprovalDecision, ApprovalRequested, Final, TurnFailed
from agent.harness import Harness
from agent.settings import ApprovalSettings
from agent.settled import SettledThreads
from agent.steering import SteerMessage
from agent.turn import ImagePart, TurnOptions
from tests.approvals_support import RAN, collect, harness_for, shell
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.harness_support import FAST, spec, turn

pytestmark = pytest.mark.usefixtures("clear_ran")


class OneSteer:
    """A gateway's inbox that hands the turn ``message`` at its first model call."""

    def __init__(self, message: SteerMessage) -> None:
        self.message: SteerMessage | None = message

    def take(self) -> list[SteerMessage]:
        out, self.message = ([self.message] if self.message else []), None
        return out


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request: pytest.FixtureRequest) -> str | None:
    """None: the daemon's own SQLite file; else a fresh PostgreSQL database's URL."""
    if request.param == "sqlite":
        return None
    request.getfixturevalue("pg_server")
    return str(request.getfixturevalue("pg_url"))


async def test_a_steered_messages_own_entry_run_again_replays(
    fake: FakeOpenAI, tmp_path: Path, shared: str | None, harnesses: list[Harness]
) -> None:
    """m2 was steered into m1's turn; its own journal entry runs again on the same daemon (its
    done mark failed, or m1's turn was fenced): the answer that took it in is replayed."""
    harness = Harness(FAST, spec(fake), tmp_path / "cp.sqlite", checkpoint_url=shared)
    await harness.start()
    harnesses.append(harness)
    fake.script(Reply(text="zero"))
    await turn(harness, "zero", "m0")
    fake.script(Reply(text="one and two"))
    steer = OneSteer(SteerMessage("m2", "u1", "two"))
    assert (await turn(harness, "one", "m1", options=TurnOptions(inbox=steer)))[-1] == Final("one and two")
    asked = len(fake.requests)
    fake.script(Reply(text="A SECOND ANSWER"))
    again = await turn(harness, "two", "m2")
    assert again == [Final("one and two")] and not again[0].fresh
    assert len(fake.requests) == asked  # the model was not asked again


async def test_an_approval_pressed_after_a_newer_turn_does_not_overwrite_its_message(
    fake: FakeOpenAI, tmp_path: Path, shared: str | None, harnesses: list[Harness]
) -> None:
    """m1 paused on an approval; m2 ran to its answer; then m1's approval is pressed (before m2's
    turn cancelled it). m1 is in the thread with its own words: it is replayed, not asked anew as
    an empty message."""
    harness = harness_for(fake, tmp_path / "cp.sqlite", ApprovalSettings(tools=["shell"]), shared)
    await harness.start()
    harnesses.append(harness)
    fake.script(Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]))
    events = await collect(harness.run("t1", user_id="u1", message_id="m1", text="list files"))
    (ask,) = [e for e in events if isinstance(e, ApprovalRequested)]
    fake.script(Reply(text="answer two"))
    assert (await turn(harness, "something else", "m2"))[-1] == Final("answer two")
    asked = len(fake.requests)
    fake.script(Reply(text="ANSWER AGAIN"))
    approved = ApprovalDecision(True)
    await collect(harness.resume("t1", user_id="u1", message_id="m1", approval_id=ask.id, decision=approved))
    snap = await harness.require_graph().aget_state({"configurable": {"thread_id": "t1"}})
    humans = [(m.id, m.content) for m in snap.values["messages"] if isinstance(m, HumanMessage)]
    assert humans == [("m1", "list files"), ("m2", "something else")]
    assert len(fake.requests) == asked and RAN == []


def _pictures(request: dict[str, Any]) -> bool:
    return any(
        isinstance(m.get("content"), list) and "image_url" in json.dumps(m["content"])
        for m in request["messages"]
        if m["role"] == "user"
    )


@pytest.mark.usefixtures("pg_server")
async def test_images_another_daemon_brought_fade_and_skip_a_text_only_model(
    fake: FakeOpenAI, tmp_path: Path, pg_url: str, harnesses: list[Harness]
) -> None:
    """Daemon A ran the turn with a picture; B runs the next ones. B's reads find the picture, so
    it fades after ``keep_turns`` and a switch to a text-only model sends it none."""
    seeing = ModelSpec(name="default", model="big", base_url=fake.base_url, api_key="k", vision=True)
    blind = ModelSpec(name="small", model="small", base_url=fake.base_url, api_key="k")
    settings = AgentSettings(tools=False, vision=VisionSettings(keep_turns=2))
    image = ImagePart("image/png", b"\x89PNG-bytes", name="p.png", path="/mnt/user-data/uploads/p.png")
    a, b = (
        Harness(settings, seeing, tmp_path / f"{n}.sqlite", models=[seeing, blind], checkpoint_url=pg_url)
        for n in "ab"
    )
    for harness in (a, b):
        await harness.start()
        harnesses.append(harness)
    await turn(a, "what is it", "m1", options=TurnOptions(images=(image,)))
    assert _pictures(fake.requests[-1])
    await turn(b, "and now", "m2")  # the conversation moved to daemon B
    assert _pictures(fake.requests[-1])  # shown for two turns
    await turn(b, "more", "m3")
    assert not _pictures(fake.requests[-1])  # then faded
    await turn(a, "back here", "m4")
    await turn(b, "blind", "m5", options=TurnOptions(model="small"))
    assert fake.requests[-1]["model"] == "small" and not _pictures(fake.requests[-1])


async def test_a_message_steered_into_a_turn_that_paused_replays_after_the_resume(
    fake: FakeOpenAI, tmp_path: Path, shared: str | None, harnesses: list[Harness]
) -> None:
    """m2 was steered into m1's turn, which paused on an approval and was resumed: m2's own entry
    run again replays the answer it was taken into (the ids the paused run took are kept)."""
    harness = harness_for(fake, tmp_path / "cp.sqlite", ApprovalSettings(tools=["shell"]), shared)
    await harness.start()
    harnesses.append(harness)
    fake.script(Reply(text="zero"))
    await turn(harness, "zero", "m0")
    fake.script(Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]))
    steer = OneSteer(SteerMessage("m2", "u1", "two"))
    events = await collect(
        harness.run("t1", user_id="u1", message_id="m1", text="one", options=TurnOptions(inbox=steer))
    )
    (ask,) = [e for e in events if isinstance(e, ApprovalRequested)]
    fake.script(Reply(text="one and two"))
    approved = ApprovalDecision(True)
    await collect(harness.resume("t1", user_id="u1", message_id="m1", approval_id=ask.id, decision=approved))
    asked = len(fake.requests)
    fake.script(Reply(text="A SECOND ANSWER"))
    assert await turn(harness, "two", "m2") == [Final("one and two")]
    assert len(fake.requests) == asked


async def test_a_message_steered_into_a_failed_turn_is_not_answered_again_after_a_newer_turn(
    fake: FakeOpenAI, tmp_path: Path, harnesses: list[Harness]
) -> None:
    """m2 was steered into m1's turn, which failed after storing it; m3 ran; then m2's own entry runs
    again. m2 is in the thread: it is not asked of the model anew."""
    harness = harness_for(fake, tmp_path / "cp.sqlite", ApprovalSettings(tools=[]))
    await harness.start()
    harnesses.append(harness)
    fake.script(Reply(text="zero"))
    await turn(harness, "zero", "m0")
    fake.script(Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]), Reply(status=400))
    steer = OneSteer(SteerMessage("m2", "u1", "two"))
    assert isinstance((await turn(harness, "one", "m1", options=TurnOptions(inbox=steer)))[-1], TurnFailed)
    fake.script(Reply(text="three"))
    await turn(harness, "three", "m3")
    asked = len(fake.requests)
    fake.script(Reply(text="A SECOND ANSWER"))
    await turn(harness, "two", "m2")
    assert len(fake.requests) == asked


async def test_a_thread_is_forgotten_whole_its_images_mark_with_its_last_turn(
    fake: FakeOpenAI, tmp_path: Path, harnesses: list[Harness]
) -> None:
    """Image turns on other threads push the thread out of a small memory: it is forgotten whole,
    so its next turn reads it and a text-only model gets no picture."""
    seeing = ModelSpec(name="default", model="big", base_url=fake.base_url, api_key="k", vision=True)
    blind = ModelSpec(name="small", model="small", base_url=fake.base_url, api_key="k")
    settings = AgentSettings(tools=False, vision=VisionSettings(keep_turns=2), model_retries=0)
    image = ImagePart("image/png", b"\x89PNG-bytes", name="p.png", path="/mnt/user-data/uploads/p.png")
    harness = Harness(settings, seeing, tmp_path / "cp.sqlite", models=[seeing, blind])
    harness._known = SettledThreads(capacity=2)
    await harness.start()
    harnesses.append(harness)
    await turn(harness, "what is it", "m1", options=TurnOptions(images=(image,)))
    for other in ("tx", "ty"):  # image turns of other threads that fail
        fake.script(Reply(status=400))
        failed = await turn(harness, "pic", f"m-{other}", thread=other, options=TurnOptions(images=(image,)))
        assert isinstance(failed[-1], TurnFailed)
    await turn(harness, "blind", "m2", options=TurnOptions(model="small"))
    assert fake.requests[-1]["model"] == "small" and not _pictures(fake.requests[-1])


async def test_a_thread_is_forgotten_whole_its_answered_ids_with_its_last_turn(
    fake: FakeOpenAI, tmp_path: Path, harnesses: list[Harness]
) -> None:
    """Other threads' answers push a thread's answered ids out of a small memory: its last turn goes
    with them, so an old message of it run again reads the thread and replays its answer."""
    harness = Harness(FAST, spec(fake), tmp_path / "cp.sqlite")
    harness._known = SettledThreads(capacity=8, ids=4)
    await harness.start()
    harnesses.append(harness)
    for n in range(3):
        fake.script(Reply(text=f"answer {n}"))
        await turn(harness, f"q{n}", f"m{n}")
    for other in ("tx", "ty", "tz"):
        await turn(harness, "hi", f"m-{other}", thread=other)
    asked = len(fake.requests)
    assert await turn(harness, "q0", "m0") == [Final("answer 0")]  # m0's entry run again
    assert len(fake.requests) == asked


def test_the_memory_keeps_a_threads_newest_answered_ids_within_its_bounds() -> None:
    known = SettledThreads(capacity=2, ids=100, per_thread=3)

    def ran(thread: str, message: str) -> None:
        known.finished(thread, message, (), known.begin(thread))

    for n in range(5):
        ran("t1", f"m{n}")
    assert known.is_new("t1", "m9") and not known.is_new("t1", "m4") and not known.is_new("t1", "m2")
    assert known.is_new("t1", "m1")  # past the per-thread bound (see agent/settled.py)
    ran("t2", "a")
    ran("t3", "b")  # the thread used longest ago goes, whole
    assert not known.is_new("t1", "m9") and known.is_new("t3", "z")
    known.pictured("t3", True)
    assert not known.is_new("t3", "z")
    known.forget("t3", ["s1"])
    known.pictured("t3", False)
    assert not known.is_new("t3", "z")  # forgotten: its next turn reads
    ran("t3", "c")
    assert not known.is_new("t3", "s1") and known.is_new("t3", "z")


async def test_a_failed_turns_own_message_run_again_after_a_newer_turn_is_not_asked_anew(
    fake: FakeOpenAI, tmp_path: Path, harnesses: list[Harness]
) -> None:
    """m1's turn failed after m1 was stored in the thread; m3 ran; m1's entry runs again: m1 is in
    the thread, so the read decides (it says the answer was lost), not the model."""
    harness = harness_for(fake, tmp_path / "cp.sqlite", ApprovalSettings(tools=[]))
    await harness.start()
    harnesses.append(harness)
    await turn(harness, "zero", "m0")
    fake.script(Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]), Reply(status=400))
    assert isinstance((await turn(harness, "one", "m1"))[-1], TurnFailed)
    await turn(harness, "three", "m3")
    asked = len(fake.requests)
    again = await turn(harness, "one", "m1")
    assert len(fake.requests) == asked and isinstance(again[-1], Final) and not again[-1].fresh


async def test_images_a_resumed_turn_read_are_kept_from_a_text_only_model(
    fake: FakeOpenAI, tmp_path: Path, harnesses: list[Harness]
) -> None:
    """m1 with a picture paused on an approval; a restarted daemon resumes it (its read sees the
    picture); m2 on a text-only model must be read and faded, not sent the picture."""
    seeing = ModelSpec(name="default", model="big", base_url=fake.base_url, api_key="k", vision=True)
    blind = ModelSpec(name="small", model="small", base_url=fake.base_url, api_key="k")
    settings = AgentSettings(vision=VisionSettings(keep_turns=2), model_retries=0)
    image = ImagePart("image/png", b"\x89PNG-bytes", name="p.png", path="/mnt/user-data/uploads/p.png")

    def build() -> Harness:
        return Harness(
            settings, seeing, tmp_path / "cp.sqlite", models=[seeing, blind], extra_tools=[shell],
            extra_middleware=with_approvals([], ApprovalSettings(tools=["shell"]), ["shell"]),
        )  # fmt: skip

    first = build()
    await first.start()
    fake.script(Reply(tool_calls=[ToolCall("shell", {"command": "ls"})]))
    events = await collect(
        first.run("t1", user_id="u1", message_id="m1", text="look", options=TurnOptions(images=(image,)))
    )
    (ask,) = [e for e in events if isinstance(e, ApprovalRequested)]
    await first.close()
    second = build()  # the restarted daemon
    await second.start()
    harnesses.append(second)
    fake.script(Reply(text="seen"))
    approved = ApprovalDecision(True)
    await collect(second.resume("t1", user_id="u1", message_id="m1", approval_id=ask.id, decision=approved))
    await turn(second, "blind", "m2", options=TurnOptions(model="small"))
    assert fake.requests[-1]["model"] == "small" and not _pictures(fake.requests[-1])


def test_a_read_full_of_old_steered_ids_does_not_push_out_a_newer_answer() -> None:
    known = SettledThreads()
    steered = [f"s{n}" for n in range(200)]  # a long thread that took many steered messages
    known.seen("t", steered, images=False)
    known.finished("t", "mA", (), known.begin("t"))
    for _ in range(3):  # later reads see the same steered messages
        known.seen("t", steered, images=False)
    known.finished("t", "mB", (), known.begin("t"))
    assert not known.is_new("t", "mA") and not known.is_new("t", "s199")


def test_a_thread_forgotten_while_its_turn_ran_is_not_brought_back_half() -> None:
    known = SettledThreads(capacity=2)
    known.finished("t", "mA", (), known.begin("t"))
    known.pictured("t", True)
    begun = known.begin("t")  # mB's turn begins...
    known.finished("u", "x", (), known.begin("u"))
    known.finished("v", "y", (), known.begin("v"))  # ...and t is forgotten meanwhile
    known.finished("t", "mB", (), begun)
    assert not known.is_new("t", "mC") and not known.is_new("t", "mA")


async def test_a_message_only_replayed_here_is_replayed_again_after_a_newer_turn(
    fake: FakeOpenAI, tmp_path: Path, shared: str | None, harnesses: list[Harness]
) -> None:
    """m1 was answered before a restart (or by another daemon); its delivery was parked, so here it
    is replayed, parked again, and runs once more after m2's turn: replayed again, never asked of
    the model a second time."""
    before = Harness(FAST, spec(fake), tmp_path / "cp.sqlite", checkpoint_url=shared)
    await before.start()
    fake.script(Reply(text="answer one"))
    await turn(before, "one", "m1")
    await before.close()
    harness = Harness(FAST, spec(fake), tmp_path / "cp.sqlite", checkpoint_url=shared)
    await harness.start()
    harnesses.append(harness)
    assert await turn(harness, "one", "m1") == [Final("answer one")]
    await turn(harness, "two", "m2")
    asked = len(fake.requests)
    fake.script(Reply(text="A SECOND ANSWER"))
    assert await turn(harness, "one", "m1") == [Final("answer one")]
    assert len(fake.requests) == asked
