"""The "⏳ Queued behind …" sign, posted only below the answers it waits behind.

A message that cannot start within :data:`QUEUED_SIGN_AFTER` gets a sign as the first message of
its reply, later edited into its answer. The sign is a real message, so it must not be posted
before the answers ahead of it have theirs: an answer still streaming as a Telegram draft, one whose
first edit is not due yet, or one not streamed at all would otherwise become a message only at its
end, *below* the sign, and the chat would read m1, m0.

The rule, the same on every platform and in every streaming mode: before the sign goes out, the
running answer of the conversation gets its first real message if it has none (its text so far,
else :data:`WORKING`; it streams by edits from then on, drafts end), and every message waiting ahead
must show its own sign already. Signs of one conversation are posted one at a time, in queue order.
A platform that cannot edit would leave the placeholder as a stray message: no sign there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from gateway.turns import quiet

if TYPE_CHECKING:
    from gateway.store.entries import JournalEntry
    from gateway.turns.inflight import InFlight
    from gateway.turns.queue import TurnQueue

QUEUED_SIGN_AFTER = 0.4
"""A message still waiting this long gets a visible "queued" sign (a turn about to start needs none)."""
WORKING = "💭 Working on it…"
"""The running answer's first message when a sign must go out below it before it has any text."""


class SignHost(Protocol):
    """What the queued sign uses of the daemon (the Gateway is one)."""

    turns: TurnQueue
    signs: SignOrder
    inflight: InFlight

    async def holds(self, entry: JournalEntry) -> bool:
        """Only the holder of ``entry``'s lease speaks for it (always true for a lone daemon)."""
        ...


class SignOrder:
    """One lock per conversation with signs to post, dropped when its last user is done."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def turn(self, conversation: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(conversation, (asyncio.Lock(), 0))
        self._locks[conversation] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[conversation]
            if users <= 1:
                del self._locks[conversation]
            else:
                self._locks[conversation] = (lock, users - 1)


async def show(gw: SignHost, entry: JournalEntry, ahead: int) -> None:
    """Post ``entry``'s queued sign if it still waits after the grace, below what it waits for.
    A scheduled run gets none: nobody waits for it, and it may end silent (gateway/turns/quiet.py)."""
    if quiet.schedule_of(entry.inbound) is not None:
        return
    await asyncio.sleep(QUEUED_SIGN_AFTER)
    if not gw.turns.is_queued(entry.key):
        return  # it started (or finished, or was stopped) meanwhile
    if not await gw.holds(entry):
        return  # another daemon may run it: only the holder of its lease speaks for it
    async with gw.signs.turn(entry.conversation):
        if not gw.turns.is_queued(entry.key):
            return
        running, before = gw.turns.ahead_of(entry.key)
        if not await _ahead_in_chat(gw, running, before):
            return  # its sign would read above an answer it waits behind: no sign
        count = len(before) + (running is not None) or ahead
        what = "the current answer" if count == 1 else f"{count} messages"
        reply = gw.inflight.reply(entry)
        if entry.from_journal:
            await reply.load()
        with contextlib.suppress(Exception):
            await reply.sign(
                f"⏳ Queued behind {what}; I'll answer here.", lambda: gw.turns.is_queued(entry.key)
            )


async def _ahead_in_chat(gw: SignHost, running: JournalEntry | None, before: list[JournalEntry]) -> bool:
    """Every answer ahead has a message in the chat now (the running one is given one)."""
    for waiting in before:  # shown (their signs went out first, under the same lock) or not at all
        reply = gw.inflight.live(waiting.key)
        if reply is None or not reply.has_message:
            return False
    if running is None:
        return True  # waiting for a free slot, not for an answer of this conversation
    reply = gw.inflight.reply(running)
    try:
        if running.from_journal:
            await reply.load()
        return await reply.materialise(WORKING)
    except Exception:  # best effort: without it, no sign (never one out of order)
        return False
