"""Everything the gateway asks of the agent, in one typed seam.

``agent.runtime.AgentRuntime`` implements it, and so does
``gateway.daemon.agent_setup.UnconfiguredHarness`` (the stand-in when the model cannot be set up). A
rename on either side fails the type check (``open_harness`` returns the runtime *as* an
:class:`AgentHarness`), not a user's ``/memory`` at run time; no ``getattr`` probing anywhere in the
gateway. At the root of ``gateway`` rather than in one of its layers: intake, turns, commands and the
daemon all hold the agent through it, and it imports nothing of the gateway (a contract in
pyproject.toml).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from agent.events import AgentEvent, ApprovalDecision, OutputFile, PlanItem
from agent.mcp_view import McpServerView
from agent.settings import McpSettings
from agent.transcript import TranscriptLine
from agent.turn import PLAIN, TurnOptions


class Remembered(Protocol):
    """One thing the agent remembers about a user."""

    @property
    def text(self) -> str: ...


class MemoryAccess(Protocol):
    """What ``/memory`` and ``/forget`` need of the agent's long-term memory."""

    async def list(self, user: str) -> Sequence[Remembered]: ...

    async def forget(self, user: str) -> int: ...


class McpAccess(Protocol):
    """What ``/mcp`` (and SIGHUP) need of the agent's MCP servers (agent/tools/mcp.py)."""

    def servers(self) -> Sequence[McpServerView]:
        """Every configured server: its state and the tools it offers now."""
        ...

    async def reload(self, settings: McpSettings) -> Sequence[McpServerView]:
        """Apply a new ``agent.mcp`` section without a restart; the servers as they are after."""
        ...


class AgentHarness(Protocol):
    """The agent as the gateway uses it."""

    @property
    def model_name(self) -> str: ...

    @property
    def memory(self) -> MemoryAccess | None:
        """Long-term memory, or None when it is off."""
        ...

    @property
    def mcp(self) -> McpAccess | None:
        """The MCP servers, or None when the agent has no tools (or is not set up)."""
        ...

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
        """One turn; safe to call again with the same ``message_id`` (replay / continue). A turn
        that ends with ``ApprovalRequested`` events (and no Final) waits for :meth:`resume`."""
        ...

    def resume(
        self,
        thread_id: str,
        *,
        user_id: str,
        message_id: str,
        approval_id: str,
        decision: ApprovalDecision,
    ) -> AsyncIterator[AgentEvent]:
        """Continue the turn of ``message_id`` paused on ``approval_id`` (safe to call again)."""
        ...

    async def message_count(self, thread_id: str) -> int: ...

    async def title(self, thread_id: str) -> str | None:
        """The conversation's short title, when it has one."""
        ...

    async def transcript(
        self, thread_id: str, last: int = 200, mask: Callable[[str], str] | None = None
    ) -> tuple[TranscriptLine, ...]:
        """The thread's last ``last`` messages, with their tool calls, as readable lines, each
        ``mask``-ed (the daemon's secrets) before it is cut."""
        ...

    async def open_choices(self, thread_id: str) -> tuple[str, tuple[str, ...]] | None:
        """(question, options) when the thread ends on a question with options (docs/choices.md)."""
        ...

    async def plan(self, thread_id: str) -> tuple[PlanItem, ...]:
        """The conversation's current plan (the agent's ``write_todos`` list, agent/plan.py), as
        its checkpoint holds it; empty when the agent wrote none."""
        ...

    async def save_upload(self, thread_id: str, name: str, data: bytes) -> str:
        """Store a user's file where the thread's agent sees it; returns the path it sees."""
        ...

    async def read_output(self, thread_id: str, path: str, max_bytes: int) -> OutputFile:
        """Read a file the agent presented, safely (no links followed, regular, within size)."""
        ...

    async def close(self) -> None: ...


def sandbox_report(harness: object) -> dict[str, str]:
    """``Daemon.sandbox_report`` for any harness (the terminal chat's and ``/status``'s too): the
    sandbox as the agent's start-up probe found it, or why there is no probe (no agent yet)."""
    if harness is None:
        return {"state": "starting", "detail": "the agent is being set up"}
    state = getattr(harness, "sandbox_state", None)
    if state is None:
        return {"state": "not started", "detail": "the agent is not set up (see agent)"}
    return dict(state().as_dict())
