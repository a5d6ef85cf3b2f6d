"""Quiet scheduled runs: a firing whose answer is exactly the silent token posts nothing.

A check-in that finds nothing to say ("tell me when the build is red") should not post "nothing
new" every hour. The schedule tool tells the model to answer with exactly
:data:`agent.tools.schedule.SILENT` then (docs/schedules.md, "Quiet runs"); this module decides,
once the turn has its final answer, whether the run is silent:

- only a schedule's firing can be silent (a person who wrote to the bot always gets an answer);
- only when the model's final answer is the token and nothing else (:func:`is_silent`): an answer
  that quotes the token (a fetched page that contains it, a model that adds it to a real answer)
  is posted as written;
- never a run of a schedule made after reading untrusted content: its text was quoted to the model
  as data to relay, so a token there may be the untrusted source's wish to hide the run; such a run
  posts a one-line note instead;
- never a run that presented files: they go out, under the same one-line note.

A silent run is still journaled and marked done like any turn (a restart does not run it again:
the journal says done, and the agent's checkpoint replays the same final answer should it be asked
again), and the schedule remembers its last run as silent for ``/schedules``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.tools.schedule import is_silent
from gateway.intake.provenance import PROVENANCE_EXTRA
from gateway.store.entries import BACKGROUND_MARK
from gateway.store.schedules import SCHEDULE_MARK
from gateway.turns.outcome import TurnOutcome

if TYPE_CHECKING:
    from channels.base import Inbound
    from gateway.delivery.reply import Reply
    from gateway.store.journal import Store

log = logging.getLogger(__name__)

POSTED, SILENT = "posted", "silent"
"""A schedule's last run, as ``/schedules`` shows it."""


def schedule_of(inbound: Inbound) -> int | None:
    """The schedule a firing runs (None: not a firing)."""
    mark = inbound.extra.get(SCHEDULE_MARK)
    return mark if isinstance(mark, int) and not isinstance(mark, bool) else None


def streams(inbound: Inbound) -> bool:
    """Whether the reply may stream: not a scheduled run (it may end silent, and a draft of
    ``[sil…`` would already be out) nor a background task (its result only)."""
    return schedule_of(inbound) is None and BACKGROUND_MARK not in inbound.extra


def nothing_note(schedule_id: int) -> str:
    return f"🔕 Scheduled task #{schedule_id}: nothing to report."


async def settle(
    store: Store, key: str, inbound: Inbound, final: str, outcome: TurnOutcome
) -> tuple[str, bool]:
    """The answer to post and whether the run is silent (then nothing is posted). A firing that
    answered the token but may not be silent gets :func:`nothing_note` instead of the bare token."""
    schedule_id = schedule_of(inbound)
    if schedule_id is None or outcome is not TurnOutcome.OK or not is_silent(final):
        return final, False
    if inbound.extra.get(PROVENANCE_EXTRA):
        log.info("schedule #%d answered silent, but it was made after untrusted content: noted", schedule_id)
        return nothing_note(schedule_id), False
    if await store.files_get(key):
        return nothing_note(schedule_id), False
    return final, True


async def finish_silent(reply: Reply, inbound: Inbound) -> None:
    """A silent run posts nothing; only a message it already has in the chat (an approval it
    waited for, a resumed run's sign) is edited to say how it ended, so none is left hanging."""
    if reply.has_message:
        await reply.finish(nothing_note(schedule_of(inbound) or 0))


async def record(store: Store, inbound: Inbound, silent: bool) -> None:
    """Remember how the firing's schedule last ran (best effort: the run itself is done)."""
    schedule_id = schedule_of(inbound)
    if schedule_id is None:
        return
    try:
        await store.schedule_ran(schedule_id, SILENT if silent else POSTED)
    except Exception as exc:
        log.warning("could not record schedule #%d's last run: %s", schedule_id, exc)
    if silent:
        log.info("schedule #%d ran silent (%s): nothing posted", schedule_id, inbound.key)
