"""Opening the agent for the daemon (and ``chital chat``): the real runtime, or a stand-in that
says why not.

Split from gateway/daemon/app.py, which orders start-up and shutdown; what is here is the one step
of that order that decides between a working agent and a clear refusal: a model with no API key,
or a runtime that fails to start, must not stop the daemon (its channels, /healthz and `chital
status` still work), so every message gets :class:`UnconfiguredHarness`'s answer instead.
The agent's stack is imported inside :func:`open_harness`, as the agent is opened, not with this
module (docs/performance.md, import cost).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from agent.events import AgentEvent, ApprovalDecision, OutputFile, PlanItem, TurnFailed
from agent.transcript import TranscriptLine
from agent.turn import PLAIN, TurnOptions
from gateway.agent_api import AgentHarness, McpAccess, MemoryAccess
from gateway.config.schema import Config
from gateway.config.secrets import daemon_secrets

if TYPE_CHECKING:
    from agent.acp.tool import PermissionRelay
    from agent.tools.background import BackgroundStarter
    from agent.tools.schedule import Scheduler
    from agent.usage import UsageSink

log = logging.getLogger("gateway.daemon.app")  # the name operators already filter on


class UnconfiguredHarness:
    """Stands in when the model cannot be set up (no API key...), so the daemon still starts and every
    message gets a clear answer instead of silence."""

    memory: MemoryAccess | None = None
    mcp: McpAccess | None = None

    def __init__(self, reason: str, model_name: str = "(not configured)") -> None:
        self.reason = reason
        self.model_name = model_name

    async def run(
        self,
        thread_id: str,
        *,
        user_id: str,
        message_id: str,
        text: str,
        files: Sequence[str] = (),
        options: TurnOptions = PLAIN,
    ) -> AsyncIterator[AgentEvent]:
        yield TurnFailed(f"The model is not configured: {self.reason}")

    async def resume(
        self,
        thread_id: str,
        *,
        user_id: str,
        message_id: str,
        approval_id: str,
        decision: ApprovalDecision,
    ) -> AsyncIterator[AgentEvent]:
        yield TurnFailed(f"The model is not configured: {self.reason}")

    async def message_count(self, thread_id: str) -> int:
        return 0

    async def title(self, thread_id: str) -> str | None:
        return None

    async def transcript(
        self, thread_id: str, last: int = 200, mask: Callable[[str], str] | None = None
    ) -> tuple[TranscriptLine, ...]:
        return ()

    async def open_choices(self, thread_id: str) -> tuple[str, tuple[str, ...]] | None:
        return None

    async def plan(self, thread_id: str) -> tuple[PlanItem, ...]:
        return ()

    async def save_upload(self, thread_id: str, name: str, data: bytes) -> str:
        raise RuntimeError(f"the agent is not configured ({self.reason})")

    async def read_output(self, thread_id: str, path: str, max_bytes: int) -> OutputFile:
        raise RuntimeError(f"the agent is not configured ({self.reason})")

    async def close(self) -> None:
        return None


async def open_harness(
    config: Config,
    scheduler: Scheduler | None = None,
    usage: UsageSink | None = None,
    acp_relay: PermissionRelay | None = None,
    background: BackgroundStarter | None = None,
) -> AgentHarness:
    """The agent runtime, or an :class:`UnconfiguredHarness` explaining why not. ``scheduler``
    gives the agent its schedule tools (gateway/schedules/runner.py); ``usage`` records the tokens of
    every model call (gateway/turns/usage.py); ``acp_relay`` carries coding agents' permission
    requests to the approval buttons once the gateway exists (gateway/turns/live_approvals.py);
    ``background`` the lead agent's ``start_background_task`` (gateway/turns/background.py)."""
    from agent.model import has_api_key, keyless_server
    from agent.runtime import AgentRuntime

    spec = config.model_spec()
    if spec.use.startswith("langchain_openai:") and not has_api_key(spec) and not keyless_server(spec):
        index = config.models.index(spec)
        reason = f"no API key: set OPENAI_API_KEY (or models[{index}].api_key in config.yaml)"
        # Expected before `chital init`: the summary says it once, as a warning with the fix.
        log.debug("the agent's model %r is not configured: %s", spec.name, reason)
        return UnconfiguredHarness(reason)
    runtime = AgentRuntime(
        config.agent,
        spec,
        config.storage.path,
        models=config.models,
        usage=usage,
        database_url=config.storage.database_url,
        secrets=daemon_secrets(config),
    )
    runtime.scheduler = scheduler
    if acp_relay is not None:
        runtime.acp_relay = acp_relay
    runtime.background = background
    try:
        await runtime.start()
        return runtime
    except BaseException as exc:  # the message of a config error, never the key itself
        with contextlib.suppress(Exception):
            await runtime.close()  # also when start-up is cancelled: nothing half-open stays behind
        if not isinstance(exc, Exception):
            raise
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        log.error("the agent could not be set up: %s", reason, exc_info=True)
        return UnconfiguredHarness(reason)
