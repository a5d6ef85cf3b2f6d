"""Standing permissions under attack, in process (docs/approvals.md, "Standing permissions"): the
chaining of covered calls in one run (several gated calls in one model step, a resume that asks
again), the listing past its bound, and revocation ids that cannot be valid. Real Gateway,
Approvals and Store; a FakeChannel with buttons and a scripted FakeHarness playing LangGraph's
per-call interrupts (resuming one of two pending calls re-raises the other with the same id)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

from agent.events import AgentEvent, ApprovalRequested, Final, ToolProgress
from tests.approvals_support import CALL, buttoned, config
from tests.fakes.fake_channel import FakeChannel
from tests.fakes.fake_harness import Call, Resumed
from tests.fakes.gateway_rig import USER, Rig, fake_rig, until


def asking(*events: ApprovalRequested) -> object:
    async def script(call: Call) -> AsyncIterator[AgentEvent]:
        yield ToolProgress(events[0].tool, "start")
        for event in events:
            yield event

    return script


def then(*events: AgentEvent) -> object:
    async def script(call: Resumed) -> AsyncIterator[AgentEvent]:
        for event in events:
            yield event

    return script


async def allow_here(rig: Rig) -> str:
    """USER asks once and answers Allow here; the conversation's key."""
    ch = rig.channel
    rig.harness.on("first", asking(dataclasses.replace(CALL, id="intr-first")))  # type: ignore[arg-type]
    first = ch.message(USER, "first", name="Alice")
    await ch.deliver(first)
    request = await until(lambda: buttoned(ch), what="the buttons")
    answer = await ch.press(request.message_id, "Allow here", USER, "Alice")
    assert not answer.refused, answer.text
    await until(lambda: ch.replies_to(first.message_id)[:1] == ["resumed: approved"], what="resumed")
    return first.conversation


async def test_two_covered_calls_in_one_step_each_resume_once(tmp_path: Path) -> None:
    """Two covered calls of one model step: resuming the first re-raises the second (still
    pending); it must not be approved, logged and resumed a second time (the tool would run
    twice, the turn answered twice)."""
    async with fake_rig(tmp_path, config(), channel=FakeChannel(buttons=True)) as rig:
        ch = rig.channel
        await allow_here(rig)
        a = dataclasses.replace(CALL, id="intr-a", args={"command": "echo a"})
        b = dataclasses.replace(CALL, id="intr-b", args={"command": "echo b"})
        rig.harness.on("both", asking(a, b))  # type: ignore[arg-type]
        rig.harness.resume_scripts["intr-a"] = then(b)  # type: ignore[assignment]
        rig.harness.resume_scripts["intr-b"] = then(Final("ran a and b"))  # type: ignore[assignment]
        both = ch.message(USER, "both", name="Alice")
        await ch.deliver(both)
        await until(lambda: "ran a and b" in ch.replies_to(both.message_id), what="the answer")
        resumed = [r.approval_id for r in rig.harness.resumed if r.approval_id != "intr-first"]
        assert resumed == ["intr-a", "intr-b"], "each covered call resumed exactly once"
        assert ch.replies_to(both.message_id).count("ran a and b") == 1
        log = await rig.store.approval_log(ch.name, both.conversation, 50)
        runs = [r.code for r in log if r.action == "run under permission"]
        assert len(runs) == len(set(runs)) == 2, "a and b, each logged once"
        assert len([m for m in ch.sent if m.offered]) == 1, "no one was asked again"
