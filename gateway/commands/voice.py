"""``/voice on|all|off``: whether this conversation's answers also come back spoken
(docs/speech.md). ``on``: answers to voice notes and audio recordings; ``all``: every answer;
``off``: none. Stored per conversation (gateway/store/voice.py), so it outlives restarts.

In a group only an admin of the bot may change it: it changes what every member receives, and
``/voice all`` there has every answer to anyone synthesised at the operator's cost. Anyone may see
it. In a direct chat the user decides for themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.untrusted import code_span
from gateway.intake.access import is_admin

if TYPE_CHECKING:
    from gateway.commands.registry import Command, CommandContext
    from gateway.store.entries import JournalEntry

MODES = {"on": "answers to your voice notes are spoken too", "all": "every answer is spoken too"}
NOT_CONFIGURED = (
    "🔇 Spoken replies are not set up on this bot: there is no speech service in its config "
    "(the admin can add a `speech:` section, see docs/speech.md)."
)


async def voice(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    """``/voice``: show the mode; ``/voice on|all|off`` sets it."""
    inbound = entry.inbound
    wanted = cmd.args.strip().lower()
    if not ctx.config.speech.configured:
        return NOT_CONFIGURED
    if not wanted:
        mode = await ctx.store.voice_mode(inbound.conversation)
        if mode in MODES:
            return f"🔊 Voice is {mode} here: {MODES[mode]}. /voice off stops it."
        return "🔇 Voice is off here. /voice on speaks answers to voice notes; /voice all, every answer."
    if wanted not in (*MODES, "off"):
        return f"⚠️ {code_span(wanted, 40)} is not a voice mode. Use /voice on, /voice all or /voice off."
    if not inbound.is_direct and not is_admin(ctx.config.access_for(inbound.platform), inbound):
        return (
            "🔒 Only an admin of this bot can switch spoken replies in a group chat "
            "(they reach everyone here). /voice alone shows the setting."
        )
    await ctx.store.voice_mode_set(inbound.conversation, None if wanted == "off" else wanted, inbound.user)
    if wanted == "off":
        return "🔇 Voice off: answers here are text only."
    return f"🔊 Voice {wanted}: {MODES[wanted]} (the text still comes as well)."
