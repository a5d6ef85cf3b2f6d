"""/stop: the stopped message's outcome is journaled as its answer, shown once, never undone.

What /stop stops is "the current answer" of its conversation: the running turn, or, when none
runs yet, the first one waiting (a message and its /stop fetched in one batch, or a turn waiting
for a free slot). Turns behind it still run. The order of steps is what makes a stop final:

1. The stopped key is recorded under the /stop's own key (``<stop key>#stopped`` in
   ``command_results``) before anything else: a /stop re-run after a crash stops that same message,
   never the next one in the queue.
2. The turn is cut in memory (cancelled, or taken off the queue). A turn's cancellation lands at its
   next ``await``, so it cannot slip into delivering its answer after this (gateway/turns/queue.py
   refuses to stop a turn that started delivering: the answer goes out whole).
3. The journal entry becomes a pending notice reading "⏹ Stopped." (:meth:`Store.journal_stop`):
   whatever the process does next, a restart delivers that notice, through the outbox (the same
   message, edited; never a second one), and never runs the turn again.
   Approval buttons the turn posted before it paused are withdrawn here too (their requests
   cancelled, the buttons replaced by "Cancelled: stopped by ..."), and once more by the turn when
   its cancellation lands (gateway/turns/approvals.py ``withdraw``).
4. The outcome is shown: by the turn's own handler when it saw the cancellation, else here as the
   notice (a turn cancelled before it ran a step, or one taken off the queue).

docs/durability.md describes the windows a kill -9 can hit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from agent.untrusted import code_span
from gateway.store.entries import JournalEntry, JournalKind
from gateway.turns.outcome import TurnOutcome
from gateway.turns.queue import Stop

if TYPE_CHECKING:
    from gateway.ops.metrics import Metrics
    from gateway.ops.tasks import TaskTracker
    from gateway.store.journal import Store
    from gateway.turns.approvals import Approvals
    from gateway.turns.inflight import InFlight
    from gateway.turns.queue import TurnQueue


class StopHost(Protocol):
    """What /stop uses of the daemon (the Gateway is one): the journal, the turn queue, the
    in-flight registry, the task tracker, and how a notice entry is delivered and let go of."""

    store: Store
    turns: TurnQueue
    metrics: Metrics
    inflight: InFlight
    tasks: TaskTracker
    approvals: Approvals

    async def send_notice(self, entry: JournalEntry) -> None: ...

    async def release_after(
        self, entry: JournalEntry, work: Callable[[JournalEntry], Awaitable[None]]
    ) -> None: ...


STOPPED = "⏹ Stopped."
"""The stopped message's reply."""
STOPPING = "⏹ Stopping the current answer."
"""The /stop's own reply when it stopped something."""
TOO_LATE = "The current answer was already being sent, so there was nothing left to stop."
VOICE_STOPPED = "⏹ Stopped the spoken version; the answer's text stands."
"""The /stop's reply when the answer was out and its spoken version still being made."""


def stopped_notice(entry: JournalEntry, note: str = STOPPED) -> JournalEntry:
    """``entry`` as what the journal holds once it was stopped: a notice reading :data:`STOPPED`
    (or the note of what stopped it: a message interrupting it, gateway/turns/busy.py)."""
    return dataclasses.replace(entry, kind=JournalKind.NOTICE, note=note)


async def stop(gw: StopHost, entry: JournalEntry) -> str | None:
    """Stop the current answer of ``entry``'s conversation for the /stop ``entry``; returns the
    /stop's reply, or None when there was no turn to stop (approvals are asked next)."""
    marker = f"{entry.key}#stopped"
    key = await gw.store.command_result(marker)
    if key is None:
        target = gw.turns.current(entry.conversation)
        if target is None:
            return None
        key, _ = await gw.store.command_result_put(marker, target.key)
    target = gw.turns.find(key)
    if target is None:
        # A re-run after a restart: the stopped entry is a notice now, delivered by the resume.
        return STOPPING
    done = gw.turns.stop(key, cut_part=True)
    if done in (Stop.LATE, Stop.ABSENT):
        return TOO_LATE
    if done is Stop.PART:
        return VOICE_STOPPED
    if done is Stop.CANCELLED:
        # The turn may have posted approval buttons and not paused yet: withdrawn at once, before
        # anything else awaits, so no press in between can approve a call of a stopped turn (the
        # turn withdraws again when its cancellation lands, for a post that was under way).
        inbound = entry.inbound
        await gw.approvals.withdraw(key, f"stopped by {code_span(inbound.sender_name or inbound.sender_id)}")
    journaled = await gw.store.journal_stop(target, STOPPED)
    if done is Stop.REMOVED:
        if not journaled:  # no longer an open turn (another daemon answered it): nothing to show
            gw.inflight.release(key)
            return TOO_LATE
        show_stopped(gw, target)
    # CANCELLED: the turn's handler shows "Stopped" (gateway/turns/queue.py calls show_stopped if the
    # turn never ran a step); the journal may already say done, when the handler was quicker.
    return STOPPING


def show_stopped(gw: StopHost, entry: JournalEntry) -> None:
    """Deliver the stopped turn ``entry``'s outcome as its notice (its queued sign, if shown,
    is edited into it). ``entry`` is still among the keys this process handles."""
    notice = stopped_notice(entry, gw.turns.stop_note(entry.key) or STOPPED)
    gw.metrics.turns.labels(TurnOutcome.STOPPED).inc()
    gw.tasks.spawn(gw.release_after(notice, gw.send_notice), f"stopped:{entry.key}")
