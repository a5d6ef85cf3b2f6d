"""Traces of every message's life, the gateway's side (docs/tracing.md): the calls intake, the
turn runner and delivery make, each one branch when tracing is off.

Off (the default) is decided once, at start-up: ``_live`` stays None, each call below returns one
shared null context manager, and nothing of OpenTelemetry is imported. On, the work is done by
:class:`gateway.ops.trace_live.Live` (spans) and gateway/ops/trace_export.py (the exporters), which
:func:`start` installs. A process-wide switch, as OpenTelemetry's own tracer provider is: one daemon
per process.

The tree of one message: ``chital.message`` (intake: the adapter's hand-over, the access decision)
→ ``chital.journal.write``, ``chital.queue.wait``, ``chital.turn`` → the agent's ``chat {model}``,
``execute_tool {name}``, ``invoke_agent {name}`` (agent/trace_spans.py) and the delivery's
``chital.delivery.send`` / ``chital.delivery.edit`` with their retries as events.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from channels.base import Inbound
    from gateway.config.schema import Config
    from gateway.ops.trace_live import Live
    from gateway.store.entries import JournalEntry

_live: Live | None = None
_NULL: AbstractContextManager[Any] = contextlib.nullcontext()


def active() -> bool:
    """Tracing is on in this process."""
    return _live is not None


def install(live: Live | None) -> None:
    global _live
    _live = live


def message(inbound: Inbound) -> AbstractContextManager[Any]:
    """The root span of one inbound message: from the adapter's hand-over to its dispatch."""
    live = _live
    return _NULL if live is None else live.message(inbound)


def journal_write(inbound: Inbound) -> AbstractContextManager[Any]:
    """The journal write; stamps the message's trace context into what is journaled, so a turn
    resumed after a restart or an approval joins the same trace."""
    live = _live
    return _NULL if live is None else live.journal_write(inbound)


def detached() -> AbstractContextManager[Any]:
    """No trace current in the block: for a task made there that outlives the message (a
    conversation's queue worker), whose later work belongs to other traces."""
    live = _live
    return _NULL if live is None else live.detached()


def turn(entry: JournalEntry) -> AbstractContextManager[Any]:
    """The turn's span (after its queue wait's), current while the turn runs."""
    live = _live
    return _NULL if live is None else live.turn(entry)


def outcome(value: str) -> None:
    """How the current turn ended, on its span."""
    live = _live
    if live is not None:
        live.outcome(value)


def current_id() -> str | None:
    """The trace id (32 hex) of the message being handled where this is called; None outside one
    or when tracing is off. ``chital status`` puts it beside the error a turn logged."""
    live = _live
    return None if live is None else live.current_id()


def platform_call(is_send: bool) -> AbstractContextManager[Any]:
    """One send or edit through a chat's pacer (inside a traced message only)."""
    live = _live
    return _NULL if live is None else live.platform_call(is_send)


def retry(reason: str, delay: float) -> None:
    """A retried platform call: an event on its span."""
    live = _live
    if live is not None:
        live.retry(reason, delay)


def status_lines(conversation: str) -> list[str]:
    """``Trace: <id>`` of the conversation's last turn, for ``/status``; nothing when off."""
    live = _live
    if live is None:
        return []
    found = live.last_trace(conversation)
    return [f"Trace: {found}"] if found else []


async def _nothing() -> None:
    return None


async def start(cfg: Config) -> Callable[[], Awaitable[None]]:
    """Set tracing up as ``cfg.tracing`` says; returns what closes it (flushes the exporters;
    nothing to do when tracing is off)."""
    if not cfg.tracing.enabled:
        return _nothing
    from gateway.ops.trace_export import start_exporters

    return await start_exporters(cfg)
