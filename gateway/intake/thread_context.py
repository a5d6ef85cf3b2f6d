"""The thread a message was written in, fetched from its channel and bounded for the agent.

The adapter (``Channel.thread_context``) knows where a platform keeps the thread: the replied-to
message inside the Telegram update or the Discord payload, Slack's ``conversations.replies``,
Discord's channel history, Lark's message get / list. This module decides how much of it the agent
gets and in what state (docs/thread-context.md):

- **Bounded.** At most ``thread_messages`` messages, each cut to ``message_chars``, all of them
  within ``thread_chars``; the oldest go first when there is too much.
- **Only what the agent has not seen.** In a thread that is its own conversation (Slack, Discord
  and Lark threads), everything up to the bot's own last message there is already in the agent's
  history: only what came after it is context. Messages the journal holds are turns of their own
  (two quick mentions), so they are left out too. A replied-to message is always kept: it says
  which earlier answer the user means.
- **Never in the way.** A platform error, a missing scope or a slow answer costs the context, not
  the answer: it is logged (no text of anyone's message) and the turn goes on without it.
- **Stable across a resume.** Fetched again when a turn resumes after a crash; adapters return
  only messages older than the current one, so the second fetch sees what the first did (edits
  and deletions aside). Once the turn's first step is checkpointed, the agent continues from the
  checkpoint, which holds the message with its context, and the new fetch is not used.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agent.turn import ContextMessage
from channels.base import ContextItem, Inbound

if TYPE_CHECKING:
    from gateway.config.sections import ContextConfig
    from gateway.intake.host import IntakeHost
    from gateway.store.entries import JournalEntry

log = logging.getLogger(__name__)

ELLIPSIS = "…"


async def thread_context(gateway: IntakeHost, entry: JournalEntry) -> tuple[ContextMessage, ...]:
    """The context messages for the turn answering ``entry``, oldest first; ``()`` when there are
    none or they could not be fetched."""
    inbound = entry.inbound
    channel = gateway.channels.get(inbound.platform)
    cfg = gateway.config.context_for(inbound.platform)
    if channel is None or cfg.thread_messages <= 0 or cfg.thread_chars <= 0:
        return ()
    try:
        async with asyncio.timeout(cfg.fetch_timeout):
            items = await channel.thread_context(inbound, cfg.thread_messages, cfg.message_chars)
            items = [i for i in unseen(items) if not await _journaled(gateway, inbound, i)]
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # any failure costs the context, never the answer
        reason = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
        log.warning("thread context for %s not fetched (%s); answering without it", entry.key, reason)
        gateway.metrics.errors.labels(inbound.platform, "thread_context").inc()
        return ()
    return bound(items, cfg)


def unseen(items: Sequence[ContextItem]) -> list[ContextItem]:
    """``items`` without the thread messages up to and including the bot's own last one there
    (the agent's history holds them); a replied-to message is always kept."""
    last_own = max((n for n, i in enumerate(items) if i.is_self and not i.replied_to), default=-1)
    return [i for n, i in enumerate(items) if n > last_own or i.replied_to]


async def _journaled(gateway: IntakeHost, inbound: Inbound, item: ContextItem) -> bool:
    if not item.message_id or item.is_self:
        return False
    return await gateway.store.journal_seen(f"{inbound.platform}:{inbound.chat_id}:{item.message_id}")


def bound(items: Sequence[ContextItem], cfg: ContextConfig) -> tuple[ContextMessage, ...]:
    """The newest ``thread_messages`` items, each within ``message_chars``, all within
    ``thread_chars`` (the oldest dropped first; the newest always kept, cut to fit)."""
    kept: list[ContextMessage] = []
    room = cfg.thread_chars
    for item in reversed(items[-cfg.thread_messages :] if cfg.thread_messages else ()):
        text = item.text.strip()
        if not text:
            continue
        if room < min(len(text), 40):  # a few characters of a message would only mislead
            break
        text = cut(text, min(cfg.message_chars, room))
        room -= len(text)
        author = item.author.strip() or "someone"
        other_bot = item.is_bot and not item.is_self  # "Name (bot)": agent/thread_context.py adds it
        kept.append(ContextMessage(author=author, text=text, is_bot=item.is_self, other_bot=other_bot))
    kept.reverse()
    return tuple(kept)


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, an ellipsis marking a cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)].rstrip() + ELLIPSIS
