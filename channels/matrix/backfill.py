"""Filling a sync's gap: the events a room got while the daemon was away, beyond one sync's
timeline limit.

A sync returns at most the filter's ``timeline.limit`` newest events per room; when more came
since the last batch it marks the timeline ``limited`` and gives a ``prev_batch`` token. The
missing events are then read back with ``/rooms/{room}/messages`` (``dir=b``) from that token
*to* the previous sync's ``next_batch`` (the spec's ``to``: stop where the last batch ended), so
nothing a user sent during a long outage is lost. The journal drops anything seen twice (the event
id is the message key), so an overlap at either edge is harmless.

Bounded: at most :data:`MAX_PAGES` pages of :data:`PAGE` events per room and sync (a room that got
more than that while the daemon was down keeps the newest, and the gap's age is logged), and a
page that makes no progress (an ``end`` equal to its ``from``) stops the walk, so a hostile or
buggy homeserver cannot hold the sync loop.
"""

from __future__ import annotations

import logging
from typing import Any

from nio import Api, AsyncClient

from .api import Rejected, get_json
from .inbound import listed, obj

log = logging.getLogger(__name__)

PAGE = 100
"""Events asked for per ``/messages`` page (Synapse serves at most 1,000)."""
MAX_PAGES = 10
"""Pages read back per room per sync: up to 1,000 missed events."""


async def fill_gaps(client: AsyncClient, token: str, body: dict[str, Any], since: str | None) -> None:
    """Put each ``limited`` room's missed events in front of its timeline in ``body`` (a sync
    answer), before anything of it is delivered. Not on the first sync (no ``since``: a room's
    history is not answered anyway). A homeserver's refusal for one room (its history hidden from
    the bot, say) is logged and that room's gap given up; a network failure or a refused token
    propagates, so the sync is made again from the same token (nothing is skipped)."""
    if since is None:
        return
    for room_id, room in obj(obj(body.get("rooms")).get("join")).items():
        timeline = obj(obj(room).get("timeline"))
        prev_batch = timeline.get("prev_batch")
        if timeline.get("limited") is not True or not isinstance(prev_batch, str) or not prev_batch:
            continue
        try:
            missed, _ = await gap_events(client, token, room_id, prev_batch, since)
        except Rejected as exc:
            if exc.token:
                raise
            log.warning("matrix: the events room %s got while the daemon was away could not be read: %s",
                        room_id, exc)  # fmt: skip
            continue
        timeline["events"] = missed + listed(timeline.get("events"))


async def gap_events(
    client: AsyncClient, token: str, room_id: str, prev_batch: str, since: str, *, wait: float = 30.0
) -> tuple[list[Any], bool]:
    """The room's events between the last sync (``since``) and this sync's timeline
    (``prev_batch``), oldest first, and whether the whole gap was read (False: the cap was hit,
    the oldest are missing). Errors propagate: the caller does not move its sync token past a
    gap it could not read, so the next attempt tries again."""
    newest_first: list[Any] = []
    start = prev_batch
    for _ in range(MAX_PAGES):
        path = Api.room_messages(token, room_id, start=start, end=since, limit=PAGE)[1]
        body = await get_json(client, path, token, wait=wait)
        chunk = listed(body.get("chunk"))[:PAGE]
        newest_first.extend(chunk)
        end = body.get("end")
        if not chunk or not isinstance(end, str) or not end or end == start:
            return newest_first[::-1], True
        start = end
    log.warning(
        "matrix: room %s had more than %d events while the daemon was away; the oldest were not read",
        room_id,
        MAX_PAGES * PAGE,
    )
    return newest_first[::-1], False
