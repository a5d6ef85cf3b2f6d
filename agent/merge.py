"""Fewer model-call layers: adjacent ``wrap_model_call``-only middleware run as one layer.

``create_agent`` wraps each middleware's ``awrap_model_call`` in LangSmith's ``traceable`` and
nests one composition closure per middleware, so every model call walks a dozen layers of
bookkeeping (LangSmith's run-tree and context-variable setup) whether tracing is on or not.
Most of Chital's own middleware only rewrites the request or looks at the response. A run of such
middleware, adjacent in model-call order, is handed to the factory as one :class:`ModelCallGroup`
that chains them with LangChain's own composition (``_chain_async_model_call_handlers``, the
function ``create_agent`` uses, reached through compat/langchain.py), so the order, the retry
semantics of nested handlers and the ``ExtendedModelResponse`` commands (a thread's title) are
exactly as before; only the per-layer ``traceable`` goes (with LangSmith tracing on, the group
shows as one span).

A member's tools, state schema and stream transformers stay registered through a hook-less
:class:`_Carrier` of the same name. Middleware with any other hook (before/after nodes, tool-call
wrappers: deepagents' filesystem and sub-agents) is left alone and ends a run, so nothing moves
across it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain.agents.middleware import ModelRequest, ModelResponse
from langchain.agents.middleware.types import AgentMiddleware

from compat import langchain as lc_compat

_MODEL_HOOKS = ("wrap_model_call", "awrap_model_call")
_OTHER_HOOKS = (
    "before_agent",
    "abefore_agent",
    "before_model",
    "abefore_model",
    "after_model",
    "aafter_model",
    "after_agent",
    "aafter_agent",
    "wrap_tool_call",
    "awrap_tool_call",
)
_DEFAULT_STATE: Any = vars(AgentMiddleware)["state_schema"]


def _overrides(m: AgentMiddleware[Any, Any, Any], hooks: Sequence[str]) -> bool:
    return any(getattr(type(m), h) is not getattr(AgentMiddleware, h) for h in hooks)


def _mergeable(m: AgentMiddleware[Any, Any, Any]) -> bool:
    return _overrides(m, _MODEL_HOOKS) and not _overrides(m, _OTHER_HOOKS)


class _Carrier(AgentMiddleware[Any, Any, Any]):
    """Registers a grouped member's tools, state schema and transformers; no hooks of its own."""

    def __init__(self, member: AgentMiddleware[Any, Any, Any]) -> None:
        super().__init__()
        self._name = member.name
        self.tools = list(getattr(member, "tools", ()) or ())
        self.state_schema = member.state_schema
        self.transformers = member.transformers

    @property
    def name(self) -> str:
        return self._name


class ModelCallGroup(AgentMiddleware[Any, Any, Any]):
    """Several ``wrap_model_call`` middleware as one layer, outermost first (see the module)."""

    def __init__(self, members: Sequence[AgentMiddleware[Any, Any, Any]], *, name: str) -> None:
        super().__init__()
        self.members = list(members)
        self._name = name
        # The sync chain calls each member's wrap_model_call, which raises NotImplementedError for
        # an async-only member, as create_agent's own chain would.
        self._chain, self._achain = lc_compat.chain_model_calls(
            [m.wrap_model_call for m in self.members], [m.awrap_model_call for m in self.members]
        )

    @property
    def name(self) -> str:
        return self._name

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> Any:
        assert self._chain is not None
        return self._chain(request, handler)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> Any:
        # A composed result (model response plus the members' commands): create_agent's own
        # composition and model node unpack it like the result of a nested chain.
        assert self._achain is not None
        return await self._achain(request, handler)


def merge_model_calls(
    middleware: Sequence[AgentMiddleware[Any, Any, Any]], *, name: str = "ChitalModelCalls"
) -> list[AgentMiddleware[Any, Any, Any]]:
    """``middleware`` with each run of two or more adjacent mergeable members (middleware without
    model-call hooks do not interrupt a run) replaced by one :class:`ModelCallGroup`, placed where
    the run's first member was, plus a carrier for each member that has tools or state. Unchanged
    when LangChain's composition cannot be used (compat/langchain.py)."""
    if not lc_compat.can_chain():
        return list(middleware)
    out: list[AgentMiddleware[Any, Any, Any]] = []
    run: list[AgentMiddleware[Any, Any, Any]] = []
    groups = 0

    def flush(slot: int) -> None:
        nonlocal groups
        if len(run) >= 2:
            groups += 1
            group = ModelCallGroup(run, name=name if groups == 1 else f"{name}{groups}")
            carriers = [_Carrier(m) for m in run if _carries(m)]
            out[slot:slot] = [group, *carriers]
        elif run:
            out.insert(slot, run[0])
        run.clear()

    slot = 0
    for m in middleware:
        if _mergeable(m):
            if not run:
                slot = len(out)
            run.append(m)
        elif _overrides(m, _MODEL_HOOKS):
            flush(slot)
            out.append(m)
        else:
            out.append(m)
    flush(slot)
    return out


def _carries(m: AgentMiddleware[Any, Any, Any]) -> bool:
    return bool(getattr(m, "tools", None)) or m.state_schema is not _DEFAULT_STATE or bool(m.transformers)
