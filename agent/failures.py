"""What a failed turn tells the user, and what it tells the operator: a model or graph error turned
into a :class:`~agent.events.TurnFailed` with our own words for the chat (provider text can quote
request data) and the cause for the log. Split from agent/harness.py, which calls it."""

from __future__ import annotations

import logging

from langchain_core.exceptions import ContextOverflowError
from langgraph.errors import GraphRecursionError

from agent.events import TurnFailed
from agent.middleware import diagnose, is_retryable
from agent.usage import BudgetRefused

log = logging.getLogger("agent.harness")  # the name operators already filter on


def turn_failure(exc: Exception) -> TurnFailed:
    """A user-safe TurnFailed for an exception, plus the operator's ``detail`` (the cause and the
    model's URL, from :func:`agent.middleware.diagnose`), which is logged here. Known model errors
    are described in our own words (provider text can quote request data); anything else is our bug
    and keeps its traceback. ``retryable``: the same message may succeed later (model retries were
    already spent)."""
    if isinstance(exc, BudgetRefused):  # the user's token budget stopped a model call mid-turn
        log.info("turn stopped by the user's token budget")
        return TurnFailed(exc.message, retryable=False, detail="the user's daily token budget is used up")
    failure = diagnose(exc)
    detail = failure.detail()
    if isinstance(exc, ContextOverflowError):
        message, retryable = "This conversation is too long for the model; please start a new one.", False
        detail = "the conversation exceeds the model's context window"
    elif isinstance(exc, GraphRecursionError):
        message, retryable = "This task needed too many steps and was stopped.", False
        detail = "the turn hit the graph's recursion limit (agent.max_steps)"
    elif failure.kind == "rate_limited":
        message, retryable = "The model is rate-limited right now. Please try again in a minute.", True
    elif failure.kind == "timeout":
        message, retryable = "The model did not answer in time. Please try again.", True
    elif failure.kind in ("auth", "forbidden"):
        message, retryable = (
            "The model service refused our credentials; ask the admin to check the API key.",
            False,
        )
    elif failure.kind == "not_found":
        message = "The model service does not know the configured model; ask the admin to check it."
        retryable = False
    elif failure.unreachable:
        message, retryable = "The model service cannot be reached right now. Please try again later.", True
    elif is_retryable(exc):
        message, retryable = "The model service failed. Please try again later.", True
    else:
        log.error("turn failed with an unexpected %s", type(exc).__name__, exc_info=exc)
        return TurnFailed(
            "Something went wrong while answering; the error was logged.",
            retryable=False,
            detail=detail or f"unexpected {type(exc).__name__} (the traceback is in the log)",
        )
    log.warning("turn failed: %s (%s)", detail or "model error", type(exc).__name__)
    return TurnFailed(message, retryable=retryable, detail=detail)
