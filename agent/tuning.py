"""Process-wide speed fixes for the LangChain stack, applied once when the harness starts.

Each one removes per-call work that an instant model makes visible (a turn's own CPU cost is the
daemon's throughput ceiling); none changes behaviour:

- LangChain's agent factory wraps every middleware hook in LangSmith's ``traceable``, which hands
  two small bookkeeping functions to a thread pool on *every* call, tracing on or off (dozens of
  thread hops per turn). LangSmith offers ``set_runtime_overrides(aio_to_thread=...)`` for exactly
  this; with tracing off we run those functions inline, in the context LangSmith gives us. With
  tracing on, its default thread hop is kept.
- ``create_agent`` binds the tools to the model on every model call, and langchain-openai converts
  each tool to its JSON schema each time. A tool object's schema does not change, so the
  conversion is memoised per tool object (held weakly, checked by identity).
- The same ``traceable`` wrapper, tracing off, still builds a run container for every call of every
  middleware's ``wrap_model_call``/``wrap_tool_call`` (the parent run looked up from the config,
  the tracing context entered and left, the end recorded): 7.8 % of a turn's instructions with the
  default tools (``bench/turn_instructions.py``). The factory's ``traceable`` is replaced by one
  that decides at each call: LangSmith's wrapper when tracing is on (``tracing_is_enabled()``: a
  context override, a current run tree, which LangChain also sets for a tracer passed as a
  callback, then the environment), when there is a current run at all (a branch switched off
  inside a trace still gets its unposted child run), or when the hook or the call asks for the
  wrapper's own arguments (``run_tree``, ``config``, ``langsmith_extra``, a forced ``enabled``);
  otherwise the hook itself, as the wrapper would run it (a sync hook in a copy of the context,
  errors without our frame). tests/test_tuning.py and tests/test_tuning_attack.py compare both.
- ``langchain_core.messages.content._get_data_content_block_types`` (compat/langchain_core.py)
  re-derives a constant tuple with ``typing.get_type_hints`` for every content block of every
  message of every model call; it is a pure function of static types, so it is memoised.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import weakref
from typing import Any

from compat import langchain as lc_compat
from compat import langchain_core as core_compat
from compat import langchain_openai as openai_compat

log = logging.getLogger(__name__)
_applied = False


async def _inline_when_not_tracing(
    default: Any, ctx: contextvars.Context, func: Any, /, *args: Any, **kwargs: Any
) -> Any:
    from langsmith.utils import tracing_is_enabled

    if tracing_is_enabled():
        return await default(ctx, func, *args, **kwargs)
    return ctx.run(func, *args, **kwargs)


def _memoised_tool_schema(convert: Any) -> Any:
    from langchain_core.tools import BaseTool

    cache: dict[tuple[int, Any], tuple[weakref.ref[Any], dict[str, Any]]] = {}

    @functools.wraps(convert)
    def cached(tool: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(tool, BaseTool) or args or set(kwargs) - {"strict"}:
            return convert(tool, *args, **kwargs)
        key = (id(tool), kwargs.get("strict"))
        hit = cache.get(key)
        if hit is None or hit[0]() is not tool:
            schema = convert(tool, *args, **kwargs)
            hit = (weakref.ref(tool, functools.partial(_forget, cache, key)), schema)
            cache[key] = hit
        # langchain-openai annotates the top level of the dict it gets (e.g. defer_loading):
        # hand out fresh top-level dicts over the shared, never-mutated parameter schema.
        schema = hit[1]
        fresh = dict(schema)
        if isinstance(schema.get("function"), dict):
            fresh["function"] = dict(schema["function"])
        return fresh

    return cached


def _traced_only_when_tracing(traceable: Any) -> Any:
    """``traceable`` for ``langchain.agents.factory``: the decorated hook skips LangSmith's
    wrapper while tracing is off (see the module docstring). Off means what the wrapper itself
    checks: not enabled and no current run (a run under ``tracing_context(enabled=False)`` still
    gets the wrapper's unposted child run). Like the wrapper, a sync hook runs in a copy of the
    context, and an error's traceback starts at the hook, not at us."""
    from langsmith.run_helpers import get_current_run_tree
    from langsmith.utils import tracing_is_enabled

    def traced_now(kw: dict[str, Any]) -> bool:
        return bool(kw) or bool(tracing_is_enabled()) or get_current_run_tree() is not None

    def drop_own_frame(exc: BaseException) -> None:
        """LangSmith trims its wrapper's frame from a hook's error (``_cleanup_traceback``)."""
        tb = exc.__traceback__
        if tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            exc.__traceback__ = tb.tb_next

    @functools.wraps(traceable)
    def decorator_factory(*args: Any, **kwargs: Any) -> Any:
        decorate = traceable(*args, **kwargs)
        if args and callable(args[0]) and not kwargs:  # @traceable used bare: already a wrapper
            return decorate
        if kwargs.get("enabled") is not None:  # forced on or off: not the context's to decide
            return decorate

        def decorator(func: Any) -> Any:
            traced = decorate(func)
            if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
                return traced  # not a hook's shape: as LangSmith wraps it
            try:
                takes_run = "run_tree" in inspect.signature(func).parameters
            except (TypeError, ValueError):  # no signature to read: as LangSmith wraps it
                return traced
            if takes_run:
                return traced  # LangSmith hands it its run (None when off)
            if inspect.iscoroutinefunction(func):

                @functools.wraps(func)
                async def hook(*a: Any, **kw: Any) -> Any:
                    try:
                        if traced_now(kw):  # config=, langsmith_extra=: the wrapper's
                            return await traced(*a, **kw)
                        return await func(*a)
                    except BaseException as exc:
                        drop_own_frame(exc)
                        raise

                return hook

            @functools.wraps(func)
            def sync_hook(*a: Any, **kw: Any) -> Any:
                try:
                    if traced_now(kw):
                        return traced(*a, **kw)
                    return contextvars.copy_context().run(func, *a)
                except BaseException as exc:
                    drop_own_frame(exc)
                    raise

            return sync_hook

        return decorator

    return decorator_factory


def apply() -> None:
    global _applied
    if _applied:
        return
    _applied = True
    try:
        import langsmith

        langsmith.set_runtime_overrides(aio_to_thread=_inline_when_not_tracing)
    except (ImportError, AttributeError) as exc:  # an older langsmith: keep its default
        log.debug("langsmith runtime override unavailable: %s", exc)
    # The module globals replaced live in compat/ (each skipped outside its verified releases).
    if not lc_compat.wrap_factory_traceable(_traced_only_when_tracing):
        log.debug("middleware hooks keep LangSmith's wrapper (langchain outside its verified releases)")
    if not openai_compat.wrap_tool_schema(_memoised_tool_schema):
        log.debug("tool schemas not memoised (langchain-openai outside its verified releases)")
    if not core_compat.memoise_content_block_types():
        log.debug("content block types not memoised (langchain-core outside its verified releases)")


def _forget(cache: dict[Any, Any], key: Any, _ref: object) -> None:
    """weakref callback: the tool is gone, so is its cached schema."""
    cache.pop(key, None)
