"""The per-turn extras the gateway hands the agent (:class:`agent.turn.TurnOptions`).

One function gathers them, so the turn code stays one call: images the user sent (vision), the
thread the message was written in (context), the conversation's model and persona, a skill asked
for by name. Each part is computed from what the journal holds, so a resumed turn after a crash
gets the same options as the first attempt.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from agent.turn import PLAIN, TurnOptions
from gateway.intake.media import shown_images
from gateway.intake.profiles import conversation_options
from gateway.intake.provenance import forwarded_sources, inbound_sources
from gateway.intake.thread_context import thread_context

if TYPE_CHECKING:
    from gateway.intake.attachments import Uploads
    from gateway.intake.host import IntakeHost
    from gateway.store.entries import AtClaim, JournalEntry


async def turn_options(
    gateway: IntakeHost,
    entry: JournalEntry,
    thread_id: str,
    uploads: Uploads,
    at_claim: AtClaim | None = None,
) -> TurnOptions:
    """The extras for the turn answering ``entry``; ``uploads`` are its files, already saved where
    the agent sees them (gateway/intake/attachments.py); ``at_claim``: what its claim saw."""
    context = await thread_context(gateway, entry)  # the thread it was written in (bounded)
    options = TurnOptions(context=context) if context else PLAIN
    # A firing of a schedule made after reading untrusted content carries those sources on
    # (gateway/schedules/confirm.py), and a forwarded message someone else's words, so what the
    # turn does that lasts is marked (agent/provenance.py).
    sources = inbound_sources(entry.inbound) + forwarded_sources(entry.inbound)
    options = replace(options, provenance=sources) if sources else options
    # Model, persona, /<skill> (profiles.py); no /model choice to read when the claim just saw none.
    options = await conversation_options(
        gateway, entry, options, not (at_claim and at_claim.no_model_choice())
    )
    # Images the user sent, when the turn's model takes them (models[].vision; gateway/intake/media.py).
    images = await shown_images(gateway, uploads, options.model)
    return replace(options, images=images) if images else options
