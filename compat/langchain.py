"""Reaches into ``langchain``: the private ``langchain.agents.middleware._retry.calculate_delay``,
the private ``langchain.agents.factory._chain_model_call_handlers`` /
``_chain_async_model_call_handlers``, and the factory's module global ``traceable`` replaced.

- ``calculate_delay``: the backoff ``ModelRetryMiddleware`` itself uses, so Chital's retries
  (agent/middleware.py) wait exactly as LangChain's would. Public fallback: the same formula
  here (:func:`_backoff`).
- the chain functions: what ``create_agent`` composes ``wrap_model_call`` middleware with, so a
  merged group (agent/merge.py) has the order, retry semantics and ``ExtendedModelResponse``
  commands of the unmerged chain. Public fallback: no merging (every middleware its own layer,
  as ``create_agent`` builds it; slower).
- ``factory.traceable``: the decorator ``create_agent`` wraps each middleware hook in
  (agent/tuning.py). Public fallback: LangSmith's own wrapper stays (slower).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from compat.versions import usable

DISTRIBUTION = "langchain"


def _backoff(
    retry_number: int, *, backoff_factor: float, initial_delay: float, max_delay: float, jitter: bool
) -> float:
    """``calculate_delay`` of langchain 1.4: exponential, capped, ±25 % jitter, never negative."""
    delay = initial_delay if backoff_factor == 0.0 else initial_delay * (backoff_factor**retry_number)
    delay = min(delay, max_delay)
    if jitter and delay > 0:
        spread = delay * 0.25
        delay = max(0.0, delay + random.uniform(-spread, spread))
    return delay


def retry_delay(
    retry_number: int, *, backoff_factor: float, initial_delay: float, max_delay: float, jitter: bool
) -> float:
    """Seconds before retry ``retry_number`` (0-based), as ``ModelRetryMiddleware`` computes it."""
    if usable(DISTRIBUTION):
        from langchain.agents.middleware._retry import calculate_delay

        return calculate_delay(
            retry_number,
            backoff_factor=backoff_factor,
            initial_delay=initial_delay,
            max_delay=max_delay,
            jitter=jitter,
        )
    return _backoff(
        retry_number,
        backoff_factor=backoff_factor,
        initial_delay=initial_delay,
        max_delay=max_delay,
        jitter=jitter,
    )


def can_chain() -> bool:
    """Whether :func:`chain_model_calls` may be used (else: leave the middleware unmerged)."""
    return usable(DISTRIBUTION)


def chain_model_calls(sync: list[Any], asynchronous: list[Any]) -> tuple[Any, Any]:
    """``create_agent``'s own composition of ``wrap_model_call`` / ``awrap_model_call`` handlers,
    outermost first: (sync chain, async chain). Only when :func:`can_chain`."""
    from langchain.agents.factory import _chain_async_model_call_handlers, _chain_model_call_handlers

    return _chain_model_call_handlers(sync), _chain_async_model_call_handlers(asynchronous)


MARK = "_chital_fast"


def wrap_factory_traceable(wrap: Callable[[Any], Any]) -> bool:
    """Replace ``langchain.agents.factory.traceable`` (a module global the factory decorates each
    middleware hook with when it builds a graph) by ``wrap(original)``, once. Returns whether the
    replacement is in place."""
    if not usable(DISTRIBUTION):
        return False
    from langchain.agents import factory

    if not getattr(factory.traceable, MARK, False):
        factory.traceable = wrap(factory.traceable)
        setattr(factory.traceable, MARK, True)
    return True
