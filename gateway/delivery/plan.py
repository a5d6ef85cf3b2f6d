"""The agent's plan in the chat: one checklist message per turn, edited as items start and finish.

The agent's ``write_todos`` (agent/plan.py) yields a :class:`~agent.events.PlanUpdated` with the
whole list each time. :class:`PlanMessage` shows the latest one as its own message beside the
answer, through the reply's outbox (part :data:`PLAN_PART`): sent once, then edited, and a turn
resumed after a crash edits the same message instead of posting a second checklist. Edits are paced
like the answer's streaming (the platform's ``edit_interval``, through the same per-chat pacer),
latest wins: a model rewriting its plan ten times a second costs one edit per interval.

The items are the model's words, so each is shown as :func:`~agent.untrusted.code_span` (no link,
mention or markup comes alive; invisible characters gone; bounded), after the daemon's secrets are
masked; the whole message fits :data:`BUDGET` characters (the smallest platform limit, Discord's
2,000, with room to spare), further items summed up as "… and N more".

When the turn ends (answered, failed, stopped, timed out), :meth:`PlanMessage.close` edits the
checklist into its final state: all done, or what was done and each unfinished item marked "not
done", so a plan the model abandons halfway never looks as if it were still being worked on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from agent.events import PlanItem
from agent.untrusted import code_span

if TYPE_CHECKING:
    from gateway.delivery.reply import Reply

log = logging.getLogger(__name__)

PLAN_PART = 20_000
"""Outbox part of the checklist (the answer uses 0.., files 10,000+, the after-answer note 30,000)."""
BUDGET = 1_800
"""Characters of the whole checklist message."""
ITEM_CHARS = 100
"""Characters of one item shown (the agent keeps items within 200)."""
MARKS = {"completed": "☑", "in_progress": "◐", "pending": "☐"}


def plan_text(items: Sequence[PlanItem], redact: Callable[[str], str], *, final: bool = False) -> str:
    """The checklist as Markdown: a header with the count, one line per item, bounded."""
    done = sum(item.status == "completed" for item in items)
    total = len(items)
    if not items:
        header = "📋 **Plan**: (empty)"
    elif not final:
        header = f"📋 **Plan** ({done}/{total} done)"
    elif done == total:
        header = f"📋 **Plan**: all {total} steps done"
    else:
        header = f"📋 **Plan**: {done} of {total} steps done; the rest was not finished"
    lines = [header]
    size = len(header)
    for shown, item in enumerate(items):
        unfinished = final and item.status != "completed"
        mark = MARKS["pending"] if unfinished else MARKS.get(item.status, MARKS["pending"])
        line = f"{mark} {code_span(redact(item.text), ITEM_CHARS)}" + (" (not done)" if unfinished else "")
        if size + len(line) + 1 > BUDGET - 30:
            lines.append(f"… and {total - shown} more")
            break
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def plan_plain(items: Sequence[PlanItem], redact: Callable[[str], str], *, final: bool = False) -> str:
    """The checklist for a terminal (``chital chat``): :func:`plan_text`'s lines and bounds in plain
    text, each item one line made visible (no control, zero-width or bidi character: the model's
    words must not drive the terminal or hide what they say), secrets masked before the cut."""
    lines = plan_text(items, redact, final=final).splitlines()
    out = [lines[0].replace("**", "")] if lines else []
    for line in lines[1:]:
        mark, _, rest = line.partition(" ")
        if rest.startswith("`"):  # an item: "<mark> `text`[ (not done)]"
            text, _, tail = rest[1:].partition("`")
            line = f"{mark} {text}{tail}"
        out.append(f"  {line}")
    return "\n".join(out)


class PlanMessage:
    """One turn's checklist (see the module docstring). Costs nothing until a plan arrives."""

    def __init__(
        self,
        reply: Reply,
        redact: Callable[[str], str],
        stored: Callable[[], Awaitable[tuple[PlanItem, ...]]],
    ) -> None:
        """``stored``: the thread's plan as its checkpoint holds it, read only to close a
        checklist a run before a restart showed and this run did not update."""
        self._reply = reply
        self._redact = redact
        self._stored = stored
        self._latest: tuple[PlanItem, ...] | None = None
        self._pending: tuple[PlanItem, ...] | None = None
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False
        self._last_edit = 0.0

    @property
    def _live(self) -> bool:
        return self._reply.channel.capabilities.can_edit

    def update(self, items: tuple[PlanItem, ...]) -> None:
        """The agent's plan as it stands now; shown when pacing allows. Never blocks the turn."""
        if self._closing:
            return
        self._latest = self._pending = items
        if not self._live:  # no edits on this platform: the final state only
            return
        self._wake.set()
        if self._flusher is None:
            key = self._reply.key
            self._flusher = asyncio.create_task(self._flush_loop(), name=f"plan:{key}")

    async def _flush_loop(self) -> None:
        interval = self._reply.channel.capabilities.edit_interval
        while not self._closing:
            delay = self._last_edit + interval - time.monotonic()
            if delay > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                continue
            items, self._pending = self._pending, None
            if items is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._reply.show(PLAN_PART, plan_text(items, self._redact))
            except Exception as exc:  # the live checklist is best effort; its final state is not
                log.warning("plan edit failed for %s: %s", self._reply.key, exc)
            self._last_edit = time.monotonic()

    async def stop(self) -> None:
        """Send nothing more; a send under way completes (and is recorded), never cut in half."""
        self._closing = True
        self._wake.set()
        if self._flusher is not None:
            await asyncio.shield(self._flusher)
            self._flusher = None

    async def close(self) -> None:
        """The turn ended: the checklist in its final state (unfinished items marked). A run
        resumed after a restart that wrote no new plan closes the checklist the run before showed,
        from the checkpoint's plan; with no checklist at all, nothing is read or sent."""
        await self.stop()
        items = self._latest
        if items is None:
            if not self._reply.sent(PLAN_PART):
                return
            items = await self._stored()
            if not items:  # the thread's plan is gone (a /new since): leave the checklist as it is
                return
        await self._reply.show(PLAN_PART, plan_text(items, self._redact, final=True))

    def abandon(self) -> None:
        """Stop without waiting (shutdown, the entry lost to another daemon): a send under way
        completes on its own, nothing new starts."""
        self._closing = True
        self._wake.set()
