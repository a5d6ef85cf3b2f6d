"""Sub-agents: the lead delegates work to ``general-purpose`` and ``bash`` agents via a ``task`` tool.

deepagents' ``SubAgentMiddleware`` provides the ``task`` tool, the isolated context (a sub-agent
sees only the task description, never the lead's history) and the hand-back of the sub-agent's
last message as the tool result. It has no limits, so ``ChitalSubAgents`` subclasses it and adds,
as one ``awrap_tool_call`` hook around each ``task`` call (no extra graph node):

- a per-turn concurrency cap: calls beyond ``max_concurrent`` get a refusal the model can act on;
- a wall-clock timeout: the sub-agent run is cancelled and the lead gets "timed out after …";
- failures (model errors, the step cap) become a ToolMessage instead of failing the lead's turn;
- progress as LangGraph custom stream events under ``SUBAGENT_EVENT``.

Each sub-agent is our own ``create_agent`` graph (a deepagents ``CompiledSubAgent``) so that its
recursion limit can be bound to ``max_steps``; ``StepBudget`` makes its last allowed model call
answer in text.

Why progress goes through a context variable: a sub-agent graph runs inside the lead's tools node,
and LangGraph drops custom events of nested graphs unless the lead streams with
``subgraphs=True`` (which would also surface every sub-agent token and update). So the lead's
``task`` hook puts its own stream writer in ``_CURRENT``; the sub-agent's ``_ReportProgress``
middleware (running in tasks that inherit the context) writes to it.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from deepagents import DeepAgentState
from deepagents.backends import StateBackend
from deepagents.middleware.subagents import (
    DEFAULT_GENERAL_PURPOSE_DESCRIPTION,
    DEFAULT_SUBAGENT_PROMPT,
    CompiledSubAgent,
    SubAgentMiddleware,
)
from langchain.agents import create_agent
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, GraphRecursionError
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agent.events import StatusUpdate
from agent.merge import merge_model_calls
from agent.middleware import StepBudget
from agent.model import Unstreamed
from agent.settings import SubagentSettings
from agent.tool_search import FOUND_TOOLS
from agent.untrusted import one_line

log = logging.getLogger(__name__)

T = TypeVar("T")
_STOP_GRACE = 10.0
"""Seconds a cancelled sub-agent run gets to unwind before we stop waiting for it."""

SUBAGENT_EVENT = "chital.subagent"
"""Key of the custom stream event: ``{SUBAGENT_EVENT: {"id", "type", "phase", "detail", "task"}}``.

``phase`` is one of ``PHASES``; ``id`` is the lead's tool call id (tells parallel runs apart);
``task`` is the start of the task description; ``detail`` depends on the phase."""

PHASES = ("started", "running", "done", "failed", "timed_out", "refused")

TASK_TOOL = "task"
GENERAL_PURPOSE = "general-purpose"
BASH = "bash"

BASH_TOOL_NAMES = frozenset({"execute", "ls", "read_file", "write_file", "edit_file", "glob", "grep"})
"""Tools the ``bash`` sub-agent gets (the sandbox's shell and file tools); it exists only when an
``execute`` tool is among the tools given to ``build_subagents``."""

BASH_DESCRIPTION = (
    "Command-line specialist: runs shell commands (builds, tests, git, data wrangling) in this "
    "thread's sandbox in its own context and reports a short summary. Use it for long or noisy "
    "command sequences so that their output does not fill your context."
)
BASH_PROMPT = (
    "You are a command-line specialist working in the user's sandbox (a Linux shell; the "
    "workspace is /mnt/user-data/workspace). Run the commands the task needs with the execute "
    "tool, check their output, fix and retry what fails when the fix is obvious.\n\n"
    "The calling agent only sees your final message: end with a concise report of what you ran, "
    "whether it worked, and the relevant output (trimmed), plus any files you created."
)


def refusal_text(limit: int) -> str:
    return (
        f"Refused: {limit} sub-agents are already running in this turn; "
        "wait for one to finish or do it yourself."
    )


def timeout_text(kind: str, seconds: float) -> str:
    return (
        f"Sub-agent '{kind}' timed out after {_duration(seconds)} and was stopped; it returned no "
        "result. Do the task yourself, or delegate a smaller part of it."
    )


def failure_text(kind: str, exc: BaseException, max_steps: int) -> str:
    if isinstance(exc, GraphRecursionError):
        reason = f"it used all of its {max_steps} steps without finishing"
    else:
        # Type and status only: provider error text may quote request details.
        reason = f"error: {_error_name(exc)}"
    return (
        f"Sub-agent '{kind}' failed ({reason}); it returned no result. "
        "Do the task yourself, or delegate it again with clearer or smaller instructions."
    )


# ---- progress events ---------------------------------------------------------------------------
Writer = Callable[[Any], None]


@dataclass(frozen=True, slots=True)
class _Run:
    """One running sub-agent, as its own middleware sees it through ``_CURRENT``."""

    id: str
    kind: str
    task: str
    write: Writer

    def emit(self, phase: str, detail: str = "") -> None:
        event = {"id": self.id, "type": self.kind, "phase": phase, "detail": detail, "task": self.task}
        try:
            self.write({SUBAGENT_EVENT: event})
        except Exception:  # a closed stream (the turn is over) must not fail the sub-agent
            log.debug("sub-agent event dropped", exc_info=True)


_CURRENT: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("chital_subagent", default=None)


def subagent_event_to_status(part: Any) -> StatusUpdate | None:
    """The chat status line for a custom stream part, or None when it is not a sub-agent event.

    The harness calls this for every ``custom`` part it does not handle itself."""
    if not isinstance(part, dict):
        return None
    info = part.get(SUBAGENT_EVENT)
    if not isinstance(info, dict):
        return None
    kind = str(info.get("type") or "sub-agent")
    task = str(info.get("task") or "")
    detail = str(info.get("detail") or "")
    who = f"Sub-agent {kind}" + (f" ({task})" if task else "")
    phase = info.get("phase")
    if phase == "started":
        text = f"{who} started"
    elif phase == "running":
        text = f"{who}: {detail}" if detail else f"{who} is working"
    elif phase == "done":
        text = f"{who} finished" + (f" in {detail}" if detail else "")
    elif phase == "failed":
        text = f"{who} failed" + (f": {detail}" if detail else "")
    elif phase == "timed_out":
        text = f"{who} timed out" + (f" after {detail}" if detail else "")
    elif phase == "refused":
        text = f"{who} not started: {detail}" if detail else f"{who} not started"
    else:
        return None
    return StatusUpdate(text)


class _ReportProgress(AgentMiddleware[Any, Any, Any]):
    """Inside a sub-agent: report each tool it uses as a ``running`` event to the lead's stream."""

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        run = _CURRENT.get()
        if run is not None:
            call = request.tool_call
            run.emit("running", f"{call['name']} {_brief(call.get('args'), 80)}".rstrip())
        return await handler(request)


# ---- the task tool's limits --------------------------------------------------------------------
class ChitalSubAgents(SubAgentMiddleware[Any, Any]):
    """deepagents' ``SubAgentMiddleware`` plus concurrency cap, timeout, failure containment and
    progress events (see the module docstring). One instance serves every thread of the daemon."""

    def __init__(self, subagents: Sequence[CompiledSubAgent], settings: SubagentSettings) -> None:
        super().__init__(
            # Stored by deepagents, never used by the task tool: our sub-agents get the sandbox
            # through their tools.
            backend=StateBackend(),
            subagents=subagents,
            system_prompt=_lead_prompt(settings),
            # Each agent finds its own deferred tools: the lead's found ones are not handed to a
            # sub-agent, nor a sub-agent's back (agent/tool_search.py).
            private_state_keys=frozenset({FOUND_TOOLS}),
        )
        self.settings = settings
        # Running sub-agents per thread id. Turns of one thread are serialised by the harness,
        # so this is "per turn"; every turn's tool calls finish before its next model call.
        self._running: dict[str, int] = {}

    def running(self, thread_id: str) -> int:
        """Sub-agents running now in ``thread_id`` (for tests and /status)."""
        return self._running.get(thread_id, 0)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        call = request.tool_call
        args = call.get("args") or {}
        kind = args.get("subagent_type") if isinstance(args, dict) else None
        if call["name"] != TASK_TOOL or kind not in self.subagent_names:
            return await handler(request)  # other tools; unknown types get deepagents' own answer
        call_id = call.get("id") or ""
        key = _thread_of(request)
        run = _Run(
            id=call_id,
            kind=str(kind),
            task=_brief_text(str(args.get("description", "")), 60),
            write=request.runtime.stream_writer if request.runtime is not None else _drop,
        )
        limit = self.settings.max_concurrent
        if self._running.get(key, 0) >= limit:
            run.emit("refused", f"{limit} already running")
            return _tool_message(refusal_text(limit), call_id)
        self._running[key] = self._running.get(key, 0) + 1
        token = _CURRENT.set(run)
        started = time.monotonic()
        run.emit("started")
        seconds = self.settings.timeout_seconds
        try:
            async with asyncio.timeout(seconds) as deadline:
                result = await _stoppable(handler(request))
        except TimeoutError as exc:
            if not deadline.expired():  # a timeout inside the sub-agent, not ours
                return self._failed(run, exc)
            log.warning("sub-agent %s (%s) timed out after %.0fs", kind, call_id, seconds)
            run.emit("timed_out", _duration(seconds))
            return _tool_message(timeout_text(run.kind, seconds), call_id)
        except GraphBubbleUp:
            raise  # interrupts and parent commands belong to LangGraph
        except Exception as exc:
            return self._failed(run, exc)
        finally:
            _CURRENT.reset(token)
            left = self._running.get(key, 1) - 1
            if left > 0:
                self._running[key] = left
            else:
                self._running.pop(key, None)
        run.emit("done", _duration(time.monotonic() - started))
        return result

    def _failed(self, run: _Run, exc: Exception) -> ToolMessage:
        log.warning("sub-agent %s (%s) failed: %s", run.kind, run.id, _error_name(exc))
        detail = "out of steps" if isinstance(exc, GraphRecursionError) else _error_name(exc)
        run.emit("failed", detail)
        return _tool_message(failure_text(run.kind, exc, self.settings.max_steps), run.id)


def build_subagents(
    model: BaseChatModel,
    tools: Sequence[BaseTool | Callable[..., Any]],
    settings: SubagentSettings,
    extra_middleware_for_subagents: Sequence[AgentMiddleware[Any, Any, Any]] = (),
    per_subagent: Callable[[], Sequence[AgentMiddleware[Any, Any, Any]]] = tuple,
) -> list[AgentMiddleware[Any, Any, Any]]:
    """The middleware to add to the lead (``Harness(extra_middleware=...)``); empty when disabled.

    ``tools`` are the thread's sandbox tools the sub-agents share (a ``task`` tool among them is
    dropped: sub-agents do not delegate further); ``general-purpose`` gets all of them, ``bash``
    those named in ``BASH_TOOL_NAMES``, and exists only when an ``execute`` tool is given.
    ``extra_middleware_for_subagents`` goes into every sub-agent after our own (e.g.
    ``RetryModelCalls``: its retry events stay inside the sub-agent's stream and never reach the
    chat or the lead's replay guard; or the sandbox's ``FilesystemMiddleware``, whose tools then
    count as given). The instances are shared by all sub-agents: pass stateless middleware.
    ``per_subagent()`` is called once per sub-agent for middleware that must not be shared and
    goes innermost (the deferred tools' ``tool_search``, which remembers the tools its agent binds).
    """
    if not settings.enabled:
        return []
    extra = extra_middleware_for_subagents
    own = [t for t in tools if _tool_name(t) != TASK_TOOL]
    gp_about = DEFAULT_GENERAL_PURPOSE_DESCRIPTION
    gp_extra = [*extra, *per_subagent()]
    specs = [_compile(GENERAL_PURPOSE, gp_about, DEFAULT_SUBAGENT_PROMPT, model, own, settings, gp_extra)]
    shell = [t for t in own if _tool_name(t) in BASH_TOOL_NAMES]
    # The sandbox's tools may come as a list or from a middleware (deepagents' FilesystemMiddleware).
    given = [*shell, *(t for m in extra for t in getattr(m, "tools", ()))]
    if any(_tool_name(t) == "execute" for t in given):
        bash_extra = [*extra, *per_subagent()]
        specs.append(_compile(BASH, BASH_DESCRIPTION, BASH_PROMPT, model, shell, settings, bash_extra))
    return [ChitalSubAgents(specs, settings)]


def _compile(
    name: str,
    description: str,
    prompt: str,
    model: BaseChatModel,
    tools: Sequence[BaseTool | Callable[..., Any]],
    settings: SubagentSettings,
    extra: Sequence[AgentMiddleware[Any, Any, Any]],
) -> CompiledSubAgent:
    graph = create_agent(
        model,
        list(tools),
        system_prompt=prompt,
        # Unstreamed: no one reads a sub-agent's tokens as they come (agent/model.py).
        # Adjacent wrap_model_call-only middleware as one layer, as in the lead (agent/merge.py).
        middleware=merge_model_calls(
            [_ReportProgress(), Unstreamed(), StepBudget(settings.max_steps), *extra]
        ),
        state_schema=DeepAgentState,
        name=name,
    )
    # A bound recursion limit wins over the lead's (LangGraph merges configs per key): the hard
    # stop behind StepBudget, for a model that ignores tool_choice="none".
    runnable = graph.with_config(recursion_limit=2 * settings.max_steps + 5)
    return CompiledSubAgent(name=name, description=description, runnable=runnable)


def _lead_prompt(settings: SubagentSettings) -> str:
    return (
        "## Sub-agents (the `task` tool)\n"
        "You can delegate independent pieces of work to sub-agents with the `task` tool; issue "
        "several `task` calls in one message to run them in parallel. A sub-agent does not see "
        "this conversation: put everything it needs in the description. At most "
        f"{settings.max_concurrent} run at once per turn, each for at most "
        f"{_duration(settings.timeout_seconds)}. Their reports are not shown to the user: "
        "summarise what matters in your answer. Do small tasks yourself."
    )


async def _stoppable(work: Awaitable[T]) -> T:
    """Await ``work`` in its own task; when cancelled (/stop, timeout), make sure it really stops.

    Why: Python 3.11's ``asyncio.wait_for`` returns the result instead of raising when a
    cancellation races a completed await (CPython gh-86296, fixed in 3.12), and langchain-openai
    wraps every streamed chunk in it (``stream_chunk_timeout``). One cancel can thus be lost and a
    sub-agent would stream on until its answer is complete; cancelling again until the task is
    done stops it within a chunk or two.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await _cancel_until_done(task)
        raise


async def _cancel_until_done(task: asyncio.Future[Any], grace: float = _STOP_GRACE) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + grace
    while not task.done() and loop.time() < end:
        task.cancel()
        # A second cancel of our own task must not leave the sub-agent running: finish, then
        # re-raise the first one (the caller does).
        with suppress(asyncio.CancelledError):
            await asyncio.wait({task}, timeout=0.05)
    if not task.done():
        log.warning("a sub-agent run did not stop within %.0fs of being cancelled", grace)
    elif not task.cancelled():
        task.exception()  # retrieved: a late failure of a stopped run is not an error to report


def _thread_of(request: ToolCallRequest) -> str:
    config = request.runtime.config if request.runtime is not None else {}
    return str((config.get("configurable") or {}).get("thread_id", ""))


def _error_name(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__}, HTTP {status}" if isinstance(status, int) else type(exc).__name__


def _tool_message(text: str, call_id: str) -> ToolMessage:
    return ToolMessage(content=text, name=TASK_TOOL, tool_call_id=call_id, status="error")


def _tool_name(tool: BaseTool | Callable[..., Any]) -> str:
    return tool.name if isinstance(tool, BaseTool) else getattr(tool, "__name__", "")


def _drop(_: Any) -> None:
    return None


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min" + (f" {rest} s" if rest else "")


def _brief_text(text: str, limit: int) -> str:
    """A task or a tool call for a chat status line: written by the model (possibly steered by
    what it read), so visible (no bidi override or zero-width character), one line, bounded."""
    return one_line(text, limit)


def _brief(args: Any, limit: int) -> str:
    if not args:
        return ""
    try:
        text = json.dumps(args, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = str(args)
    return _brief_text(text, limit)
