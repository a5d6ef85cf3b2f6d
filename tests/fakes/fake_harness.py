"""A small agent for in-process gateway tests, implementing :class:`gateway.agent_api.AgentHarness`.

By default every turn answers ``echo: <text>`` (plus the names of the files it received). A test
scripts other answers per message text with :meth:`FakeHarness.on`: an async generator of agent
events, so it can stream deltas, present files, or wait for an event the test sets. :attr:`gate`
holds every turn (to fill a queue) until set.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from agent.events import AgentEvent, ApprovalDecision, Final, OutputFile, PlanItem
from agent.turn import PLAIN, TurnOptions
from gateway.agent_api import AgentHarness, McpAccess, MemoryAccess


@dataclass(frozen=True, slots=True)
class Call:
    """One turn the gateway asked of the agent."""

    thread_id: str
    user_id: str
    message_id: str
    text: str
    files: tuple[str, ...]
    options: TurnOptions = PLAIN


Script = Callable[[Call], AsyncIterator[AgentEvent]]


@dataclass(frozen=True, slots=True)
class Resumed:
    """One paused turn the gateway continued with a person's decision."""

    thread_id: str
    message_id: str
    approval_id: str
    decision: ApprovalDecision


ResumeScript = Callable[[Resumed], AsyncIterator[AgentEvent]]


async def answer_decision(call: Resumed) -> AsyncIterator[AgentEvent]:
    yield Final(
        "resumed: approved" if call.decision.approved else f"resumed: denied ({call.decision.reason})"
    )


@dataclass(frozen=True, slots=True)
class _Fact:
    text: str


@dataclass
class FakeMemory:
    """Long-term memory as ``/memory`` and ``/forget`` see it: facts per user."""

    facts: dict[str, Sequence[str]] = field(default_factory=dict)

    async def list(self, user: str) -> Sequence[_Fact]:
        return [_Fact(text) for text in self.facts.get(user, ())]

    async def forget(self, user: str) -> int:
        return len(self.facts.pop(user, ()))


async def echo(call: Call) -> AsyncIterator[AgentEvent]:
    names = [f.rsplit("/", 1)[-1] for f in call.files]
    yield Final(f"echo: {call.text}" + (f" [files: {', '.join(names)}]" if names else ""))


class FakeHarness:
    """Records each turn, then runs the script registered for its text (``echo`` otherwise)."""

    model_name = "fake-model"

    def __init__(self, memory: MemoryAccess | None = None) -> None:
        self.calls: list[Call] = []
        self.gate = asyncio.Event()
        """Cleared: every turn waits here after being recorded (a busy agent)."""
        self.gate.set()
        self.scripts: dict[str, Script] = {}
        self.resumed: list[Resumed] = []
        self.resume_scripts: dict[str, ResumeScript] = {}
        """Per approval id: what a resumed turn yields (``answer_decision`` otherwise)."""
        self.outputs: dict[str, bytes] = {}
        """Files the agent can present, by the path it names them by (for :meth:`read_output`)."""
        self.uploads: dict[str, bytes] = {}
        """Users' files saved by :meth:`save_upload`, by the path returned."""
        self.titles: dict[str, str] = {}
        self.plans: dict[str, tuple[PlanItem, ...]] = {}
        """The plan ``/plan`` shows per thread (set by a test)."""
        self._memory = memory
        self.mcp_access: McpAccess | None = None
        """What ``mcp`` answers (None: the agent has no MCP servers)."""
        self.closed = False

    # -- what tests read -------------------------------------------------------------------------
    @property
    def seen(self) -> list[tuple[str, list[str]]]:
        """(text, files) of every turn that reached the agent."""
        return [(c.text, list(c.files)) for c in self.calls]

    @property
    def turns(self) -> list[tuple[str, str]]:
        """(thread id, text) of every turn that reached the agent."""
        return [(c.thread_id, c.text) for c in self.calls]

    def on(self, text: str, script: Script) -> None:
        """Answer a message whose text is ``text`` with ``script`` (every time it runs)."""
        self.scripts[text] = script

    # -- the AgentHarness protocol ---------------------------------------------------------------
    @property
    def memory(self) -> MemoryAccess | None:
        return self._memory

    @property
    def mcp(self) -> McpAccess | None:
        return self.mcp_access

    def run(
        self,
        thread_id: str,
        *,
        user_id: str,
        message_id: str,
        text: str,
        files: Sequence[str] = (),
        options: TurnOptions = PLAIN,
    ) -> AsyncIterator[AgentEvent]:
        return self._run(Call(thread_id, user_id, message_id, text, tuple(files), options))

    async def _run(self, call: Call) -> AsyncIterator[AgentEvent]:
        self.calls.append(call)
        await self.gate.wait()
        async for event in self.scripts.get(call.text, echo)(call):
            yield event

    def resume(
        self,
        thread_id: str,
        *,
        user_id: str,
        message_id: str,
        approval_id: str,
        decision: ApprovalDecision,
    ) -> AsyncIterator[AgentEvent]:
        return self._resume(Resumed(thread_id, message_id, approval_id, decision))

    async def _resume(self, call: Resumed) -> AsyncIterator[AgentEvent]:
        self.resumed.append(call)
        async for event in self.resume_scripts.get(call.approval_id, answer_decision)(call):
            yield event

    async def message_count(self, thread_id: str) -> int:
        return sum(1 for c in self.calls if c.thread_id == thread_id)

    async def title(self, thread_id: str) -> str | None:
        return self.titles.get(thread_id)

    async def plan(self, thread_id: str) -> tuple[PlanItem, ...]:
        return self.plans.get(thread_id, ())

    async def open_choices(self, thread_id: str) -> tuple[str, tuple[str, ...]] | None:
        return None  # the fake never asks with options (the real agent does: test_e2e_choices.py)

    async def save_upload(self, thread_id: str, name: str, data: bytes) -> str:
        path = f"/mnt/user-data/uploads/{name}"
        self.uploads[path] = data
        return path

    async def read_output(self, thread_id: str, path: str, max_bytes: int) -> OutputFile:
        if path not in self.outputs:
            raise FileNotFoundError(f"{path} does not exist")
        data = self.outputs[path]
        if len(data) > max_bytes:
            raise ValueError(f"{path} is {len(data)} bytes, over the {max_bytes} byte limit")
        return OutputFile(path.rsplit("/", 1)[-1], data)

    async def close(self) -> None:
        self.closed = True


def _typed(harness: FakeHarness) -> AgentHarness:
    """Fails the type check when the gateway's protocol grows and this double does not."""
    return harness
