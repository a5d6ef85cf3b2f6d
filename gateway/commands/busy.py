"""``/busy`` (an admin sets what a message sent while a turn runs does in this conversation) and
the one-message overrides ``/queue``, ``/steer`` and ``/interrupt`` (docs/steering.md).

The overrides never run as commands when they carry a message: the gateway turns ``/steer text``
into a turn on ``text`` in that mode (gateway/turns/busy.py). Their handler here answers only the
bare command, with how to use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.untrusted import code_span
from gateway.config.sections import BUSY_MODES
from gateway.turns.busy import mode_text

if TYPE_CHECKING:
    from gateway.commands.registry import Command, CommandContext
    from gateway.store.entries import JournalEntry

DEFAULT = "default"


async def busy(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """``/busy``: show the conversation's mode; ``/busy MODE`` sets it, ``/busy default`` forgets it."""
    inbound = entry.inbound
    channel_mode = getattr(ctx.config.channels, inbound.platform).busy_mode
    wanted = cmd.args.strip().lower()
    if not wanted:
        chosen = await ctx.store.busy_mode(inbound.conversation)
        mode = chosen if chosen in BUSY_MODES else channel_mode
        where = "set here with /busy" if chosen in BUSY_MODES else "the channel's default"
        return f"This conversation is in busy mode {mode_text(mode)}; {where}."
    if wanted != DEFAULT and wanted not in BUSY_MODES:
        return (
            f"⚠️ {code_span(wanted)} is not a busy mode. "
            "Use /busy interrupt, /busy queue, /busy steer or /busy default."
        )
    await ctx.store.busy_mode_set(inbound.conversation, None if wanted == DEFAULT else wanted, inbound.user)
    if ctx.busy_changed is not None:
        ctx.busy_changed(inbound.conversation)
    mode = channel_mode if wanted == DEFAULT else wanted
    return f"Busy mode for this conversation: {mode_text(mode)}."


async def one_off(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """A bare ``/steer`` (``/queue``, ``/interrupt``): how to use it."""
    return f"Write your message after it: /{cmd.name} <your message>."
