"""The state read a turn skips on a thread whose last turn finished on this daemon
(agent/settled.py), and the runs that must still read it, on a daemon's own SQLite file and on
shared PostgreSQL checkpoints: a steered message's own entry run again, an approval pressed after
a newer turn, images brought by a turn another daemon ran. Each was answered twice, overwritten or
sent to a text-only model while the read was skipped."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from agent.config import AgentSettings, ModelSpec, VisionSettings
from agent.events import ApprovalDecision, ApprovalRequested, Final
from agent.harness import Harness
from agent.settings import ApprovalSettings
from agent.steering import SteerMessage
from agent.turn import ImagePart, TurnOptions
from tests.approvals_support import RAN, collect, harness_for
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


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[list[Harness]]:
    made: list[Harness] = []
    yield made
    for harness in made:
        await harness.close()


async def test_a_steered_messages_own_entry_run_again_replays(
    fake: FakeOpenAI, tmp_path: Path, shared: str | None, started: list[Harness]
) -> None:
    """m2 was steered into m1's turn; its own journal entry runs again on the same daemon (its
    done mark failed, or m1's turn was fenced): the answer that took it in is replayed."""
    harness = Harness(FAST, spec(fake), tmp_path / "cp.sqlite", checkpoint_url=shared)
    await harness.start()
    started.append(harness)
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
    fake: FakeOpenAI, tmp_path: Path, shared: str | None, started: list[Harness]
) -> None:
    """m1 paused on an approval; m2 ran to its answer; then m1's approval is pressed (before m2's
    turn cancelled it). m1 is in the thread with its own words: it is replayed, not asked anew as
    an empty message."""
    harness = harness_for(fake, tmp_path / "cp.sqlite", ApprovalSettings(tools=["shell"]), shared)
    await harness.start()
    started.append(harness)
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
    fake: FakeOpenAI, tmp_path: Path, pg_url: str, started: list[Harness]
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
        started.append(harness)
    await turn(a, "what is it", "m1", options=TurnOptions(images=(image,)))
    assert _pictures(fake.requests[-1])
    await turn(b, "and now", "m2")  # the conversation moved to daemon B
    assert _pictures(fake.requests[-1])  # shown for two turns
    await turn(b, "more", "m3")
    assert not _pictures(fake.requests[-1])  # then faded
    await turn(a, "back here", "m4")
    await turn(b, "blind", "m5", options=TurnOptions(model="small"))
    assert fake.requests[-1]["model"] == "small" and not _pictures(fake.requests[-1])
