"""Reaches into ``deepagents``: its summarization middleware's private state key
(``_summarization_event``) and private method ``SummarizationMiddleware._get_effective_messages``.

- The state key says whether a thread was ever summarised; agent/context.py skips deepagents'
  token count (tool schemas included, on every model call) for a thread that never was and is far
  below the trigger. Public fallback: treat every thread as summarised, so deepagents counts as it
  always does (slower, same answers).
- ``_get_effective_messages``: the history as the model would see it (the summary in place of
  what it covers), used when the summary call itself failed so the turn goes on with the history
  unsummarised. Public fallback: none for that path, so the failure fails the turn as deepagents
  would (the caller re-raises).
"""

from __future__ import annotations

from typing import Any

from compat.versions import usable

DISTRIBUTION = "deepagents"
EVENT_KEY = "_summarization_event"


def maybe_summarised(state: Any) -> bool:
    """Whether a thread's state may hold an earlier summary (True when it cannot be told)."""
    if not usable(DISTRIBUTION):
        return True
    return bool(state.get(EVENT_KEY))


def effective_messages(middleware: Any, request: Any) -> list[Any] | None:
    """The messages ``middleware`` (a deepagents ``SummarizationMiddleware``) hands the model for
    ``request``, without summarising anew; None when that cannot be asked."""
    if not usable(DISTRIBUTION):
        return None
    messages: list[Any] = middleware._get_effective_messages(request)
    return messages
