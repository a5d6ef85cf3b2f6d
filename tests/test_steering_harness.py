"""The agent side of steering (agent/steering.py): a message taken from the turn's inbox before a
model call reaches the model as the user's own message, is kept in the thread's history in the
order the model read it, and a restart neither loses it nor asks the model about it twice.

The real Harness against the fake OpenAI server; the inbox is a plain object, as the gateway's is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

from langchain_core.tools import tool

from agent.config import AgentSettings, ModelSpec
from agent.events import AgentEvent, Final
from agent.harness import Harness
from agent.steering import SteerMessage
from agent.turn import TurnOptions
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

FAST = AgentSettings(retry_backoff=0.001, model_retries=0, model_timeout=5)


class Inbox:
    """Hands ``messages`` to the model call numbered ``at`` (1 = the turn's first)."""

    def __init__(self, at: int, *messages: SteerMessage) -> None:
        self.at, self.messages, self.calls = at, list(messages), 0

    def take(self) -> list[SteerMessage]:
        self.calls += 1
        return self.messages if self.calls == self.at else []


@tool
async def look(query: str) -> str:
    """Look something up."""
    return f"found {query}"


async def harness(fake: FakeOpenAI, path: Path) -> Harness:
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key="sk-test")
    made = Harness(FAST, spec, path, extra_tools=[look])
    await made.start()
    return made


async def events(run: AsyncIterator[AgentEvent]) -> list[AgentEvent]:
    async with aclosing(run) as stream:
        return [e async for e in stream]


def users(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]


STEER = SteerMessage("m2", "u1", "also check the price")


async def test_a_taken_message_is_a_user_message_after_the_tool_result(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    fake.script(Reply(tool_calls=[ToolCall("look", {"query": "laptops"})]), Reply(text="done, with prices"))
    h = await harness(fake, tmp_path / "cp.sqlite")
    try:
        inbox = Inbox(2, STEER)
        got = await events(h.run("t", user_id="u1", message_id="m1", text="compare laptops",
                                 options=TurnOptions(inbox=inbox)))  # fmt: skip
        assert got[-1] == Final("done, with prices")
        second = fake.requests[1]["messages"]
        assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "user"]
        assert second[-1]["content"] == "also check the price"
        assert all("also check the price" not in (m.get("content") or "") for m in second[:-1])
        assert inbox.calls == 2
        # The next turn's request still holds it, once, in the order the model first read it.
        fake.script(Reply(text="ok"))
        await events(h.run("t", user_id="u1", message_id="m3", text="thanks"))
        assert users(fake.requests[-1]) == ["compare laptops", "also check the price", "thanks"]
    finally:
        await h.close()


async def test_a_restart_after_the_steered_step_continues_the_turn_and_replays_for_the_steer(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    """The step that took the steer was checkpointed, then the process died mid-turn: the turn
    continues (the steer does not count as a new turn), and the steer's own run replays that
    turn's answer without asking the model again."""
    never = asyncio.Event()
    fake.script(
        Reply(tool_calls=[ToolCall("look", {"query": "laptops"})]),
        Reply(tool_calls=[ToolCall("look", {"query": "prices"})]),
        Reply(text="lost", hold=never),
    )
    path = tmp_path / "cp.sqlite"
    h = await harness(fake, path)
    run = h.run(
        "t", user_id="u1", message_id="m1", text="compare laptops", options=TurnOptions(inbox=Inbox(2, STEER))
    )
    task = asyncio.create_task(events(run))
    for _ in range(1000):
        if len(fake.requests) == 3:
            break
        await asyncio.sleep(0.01)
    assert len(fake.requests) == 3, "the third call, after the steered step, is under way"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await h.close()

    fake.script(Reply(text="laptops with prices"))
    h = await harness(fake, path)  # a new process: nothing cached
    try:
        resumed = await events(h.run("t", user_id="u1", message_id="m1", text="compare laptops"))
        assert resumed[-1] == Final("laptops with prices")
        assert users(fake.requests[-1]) == ["compare laptops", "also check the price"]
        asked = len(fake.requests)
        replay = await events(h.run("t", user_id="u1", message_id="m2", text="also check the price"))
        assert replay == [Final("laptops with prices")], "answered by the turn that took it"
        assert len(fake.requests) == asked, "the model is not asked again"
    finally:
        await h.close()
