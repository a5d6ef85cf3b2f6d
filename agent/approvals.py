"""Approval before risky actions: the agent side of ``agent.approvals`` (docs/approvals.md).

One policy, two effects:

- ``tools``: LangChain's ``HumanInTheLoopMiddleware`` in ``per_call`` mode pauses the turn at each
  gated call with a LangGraph interrupt (the graph is checkpointed, so the pause survives a
  restart). The harness turns the interrupt into an :class:`~agent.events.ApprovalRequested` and
  ends the turn; ``Harness.resume`` continues it with ``Command(resume={id: decision})``. A denial
  becomes the tool's result ("the user rejected ..., not executed"), so the model answers
  accordingly instead of failing.
- ``deny``: the existing fail-closed guardrail hook (agent/safety.py ``GuardrailMiddleware``) with a
  policy guardrail that refuses those tools outright.

Sub-agents cannot pause the lead's turn (their graph has no checkpointer of its own, and a resumed
``task`` would run the whole sub-agent again), so inside them a gated tool is refused with a note
that only the lead may ask for it.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from langchain.agents.middleware import HumanInTheLoopMiddleware, InterruptOnConfig
from langchain.agents.middleware.types import AgentMiddleware
from langchain_core.messages import ToolCall

from agent.events import ApprovalDecision, ApprovalRequested
from agent.safety import Allow, Deny, Guardrail, GuardrailContext, GuardrailMiddleware, ToolErrors
from agent.settings import ApprovalSettings

log = logging.getLogger(__name__)

DESCRIPTION_CHARS = 200


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether tool ``name`` is named by one of ``patterns`` (exact names or fnmatch patterns)."""
    return any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns)


def policy_guardrail(settings: ApprovalSettings) -> Guardrail:
    """The guardrail of ``deny``: those tools never run."""

    async def blocked(name: str, args: dict[str, Any], ctx: GuardrailContext) -> Allow | Deny:
        if matches(name, settings.deny):
            return Deny(f"the operator's policy does not allow {name}")
        return Allow()

    return blocked


def subagent_guardrail(settings: ApprovalSettings) -> Guardrail:
    """Inside a sub-agent: ``deny`` as for the lead, and gated tools refused (no pause possible)."""
    blocked = policy_guardrail(settings)

    async def check(name: str, args: dict[str, Any], ctx: GuardrailContext) -> Allow | Deny:
        verdict = await blocked(name, args, ctx)
        if isinstance(verdict, Deny):
            return verdict
        if matches(name, settings.tools):
            return Deny(f"{name} needs a person's approval, which only the lead agent can ask for")
        return Allow()

    return check


def _description(tool_call: ToolCall, state: Any, runtime: Any) -> str:
    return f"The agent wants to run {tool_call['name']}."


class _GatedByPattern(dict[str, InterruptOnConfig]):
    """The gated names known at start, plus any tool whose name the policy's patterns match when
    it is called: a tool that appears later (an MCP server reloaded, a deferred tool found with
    ``tool_search``, agent/tool_search.py) asks like the others. ``HumanInTheLoopMiddleware``
    looks each call up here by name."""

    def __init__(
        self, known: Iterable[str], config: InterruptOnConfig, patterns: Sequence[str], deny: Sequence[str]
    ) -> None:
        super().__init__({name: config for name in known})
        self._config = config
        self._patterns = list(patterns)
        self._deny = list(deny)

    def get(self, key: str, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        if matches(key, self._patterns) and not matches(key, self._deny):
            return self._config
        return default

    def __getitem__(self, key: str) -> InterruptOnConfig:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return cast(InterruptOnConfig, value)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None


class ChitalApprovals(HumanInTheLoopMiddleware[Any, Any, Any]):
    """``HumanInTheLoopMiddleware`` in ``per_call`` mode for the gated tools: approve or reject only
    (no edit: a chat button cannot carry edited arguments). ``patterns`` (``approvals.tools``)
    also gate tools that appear after start."""

    def __init__(
        self, tool_names: Iterable[str], patterns: Sequence[str] = (), deny: Sequence[str] = ()
    ) -> None:
        config = InterruptOnConfig(allowed_decisions=["approve", "reject"], description=_description)
        names = list(tool_names)
        super().__init__({name: config for name in names}, interrupt_mode="per_call")
        self.interrupt_on = _GatedByPattern(names, config, patterns, deny)


def tool_name(tool: Any) -> str:
    """The name a tool is called by (a BaseTool's ``name``, a plain function's ``__name__``)."""
    return str(getattr(tool, "name", None) or getattr(tool, "__name__", ""))


def gated_tools(settings: ApprovalSettings, tool_names: Iterable[str]) -> list[str]:
    """The names among ``tool_names`` that need approval (and are not denied outright)."""
    return sorted({n for n in tool_names if matches(n, settings.tools) and not matches(n, settings.deny)})


def with_approvals(
    stack: Sequence[AgentMiddleware[Any, Any, Any]],
    settings: ApprovalSettings,
    tool_names: Iterable[str],
    *,
    guardrail_timeout: float = 10.0,
) -> list[AgentMiddleware[Any, Any, Any]]:
    """``stack`` (agent/context.py's) with the policy's guardrail and approval middleware placed
    just outside ``ToolErrors``: a call the policy refuses never asks anyone, and the interrupt is
    not caught as a tool error. The middleware before it is re-entered on resume up to the pause,
    which is harmless for the context stack (no side effects before its handler)."""
    names = list(tool_names)
    added: list[AgentMiddleware[Any, Any, Any]] = []
    if settings.deny:
        added.append(GuardrailMiddleware([policy_guardrail(settings)], timeout=guardrail_timeout))
    gated = gated_tools(settings, names)
    if gated or settings.tools:  # patterns may name tools that appear later (MCP reload, tool_search)
        added.append(ChitalApprovals(gated, settings.tools, settings.deny))
        log.info("tool calls needing approval: %s", ", ".join(gated) or "none yet")
    unknown = [p for p in settings.tools if not any(matches(n, [p]) for n in names)]
    if unknown:
        log.warning("agent.approvals.tools names no tool the agent has: %s", ", ".join(unknown))
    out = list(stack)
    at = next((i for i, m in enumerate(out) if isinstance(m, ToolErrors)), len(out))
    out[at:at] = added
    return out


def approval_event(interrupt_id: str, value: Any, redact: Callable[[str], str]) -> ApprovalRequested | None:
    """The event of one LangGraph interrupt raised by :class:`ChitalApprovals` (None for others)."""
    if not isinstance(value, dict) or value.get("type") != "tool_approval":
        return None
    safe = _redacted(value.get("args") or {}, redact)
    if not isinstance(safe, dict):
        safe = {"args": safe}
    description = str(value.get("description") or "")[:DESCRIPTION_CHARS]
    return ApprovalRequested(interrupt_id, str(value.get("name", "")), safe, description)


_SECRET_KEY = re.compile(r"(?i)(?:.*[_-])?(?:api[_-]?key|access[_-]?token|token|secret|password|passwd)")


def _redacted(value: Any, redact: Callable[[str], str]) -> Any:
    """``value`` with every string redacted and the values of credential-named keys masked. Value
    by value, not over its JSON text: a secret with a quote or backslash in it is escaped there (so
    it went unmatched), and a redaction that ate an escape or a closing brace broke the JSON (the
    turn then failed instead of asking; ``echo "password=x"`` did that)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            redact(str(k)): "***"
            if _SECRET_KEY.fullmatch(str(k)) and v not in (None, "")
            else _redacted(v, redact)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redacted(v, redact) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(str(value))


def resume_value(decision: ApprovalDecision) -> dict[str, Any]:
    """The HITL decision for a person's answer. A denial keeps the tool unrun and tells the model
    why, so its answer can say so."""
    if decision.approved:
        return {"type": "approve"}
    return {"type": "reject", "message": decision.reason or "denied by the user"}
