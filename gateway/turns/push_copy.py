"""A scheduled run's answer, copied to the push targets that asked for that conversation's runs.

The run stays a conversation turn (its chat gets the answer, approvals and files, the ``[silent]``
rule and the late note work as before); a push target whose ``schedules_from`` lists the
conversation gets the same answer as a notification (docs/push.md, "Schedules"). Which
conversations push where is the operator's config only: the agent cannot route a run's output to
a phone, so a prompt injected into a run cannot either.

The copy is journaled before the turn is marked done, keyed by the firing's key: a run resumed
after a crash journals it once (the second insert is a no-op), and the daemon's push loop sends
it through gateway/delivery/push.py with its retries.
"""

from __future__ import annotations

import logging

from channels.base import Inbound
from gateway.config.push import PUSH_PLATFORM, PUSH_TITLE
from gateway.config.schema import Config
from gateway.intake.access import STARTED_BY_BOT
from gateway.store.entries import JournalKind
from gateway.store.journal import Store
from gateway.store.schedules import PUSH_MARK
from gateway.turns.quiet import schedule_of

log = logging.getLogger(__name__)


def targets_for(config: Config, inbound: Inbound) -> list[str]:
    """The push targets that take ``inbound``'s conversation's scheduled runs."""
    conversation = f"{inbound.platform}:{inbound.chat_id}"
    return [name for name, target in config.push.items() if conversation in target.schedules_from]


async def journal_copies(store: Store, config: Config, key: str, inbound: Inbound, answer: str) -> int:
    """Journal one push per target for a firing's posted ``answer``; returns how many were new."""
    schedule_id = schedule_of(inbound)
    if schedule_id is None or not answer.strip():
        return 0
    new = 0
    for name in targets_for(config, inbound):
        extra = {STARTED_BY_BOT: True, PUSH_MARK: True, PUSH_TITLE: f"Scheduled task #{schedule_id}"}
        copy = Inbound(PUSH_PLATFORM, name, f"copy-{key}", "", "", True, True, None, extra=extra)
        try:
            fresh = await store.journal_add(copy, JournalKind.NOTICE, answer)
        except Exception as exc:  # the answer is in the chat already: the copy must not undo that
            log.error("schedule #%d: could not queue its push to %r: %s", schedule_id, name, exc)
            continue
        if fresh:
            new += 1
            log.info("schedule #%d: its answer goes to push target %r too (%s)", schedule_id, name, copy.key)
    return new
