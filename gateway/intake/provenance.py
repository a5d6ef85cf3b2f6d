"""The provenance an inbound message carries to its turn: the sources of a scheduled firing (set by
gateway/schedules/confirm.py when the schedule was made after reading untrusted content) and the
someone-else's-words mark of a forwarded message. Here, below both schedules and turns, because the
turn reads what the scheduler writes (agent/provenance.py has the model of sources)."""

from __future__ import annotations

from agent.provenance import FORWARDED_MESSAGE, Provenance, Source, clean_label
from channels.base import FORWARDED, Inbound

PROVENANCE_EXTRA = "chital_provenance"
"""In a firing's ``Inbound.extra``: the sources its turn carries (gateway/turns/options.py)."""


def inbound_sources(inbound: Inbound) -> tuple[Source, ...]:
    """The sources a journaled firing carries (``()`` for anything else)."""
    raw = inbound.extra.get(PROVENANCE_EXTRA)
    return Provenance.from_json(raw).sources if raw else ()


def forwarded_sources(inbound: Inbound) -> tuple[Source, ...]:
    """A forwarded or shared message carries someone else's words (channels.base.FORWARDED)."""
    if FORWARDED not in inbound.extra:
        return ()
    who = clean_label(str(inbound.extra.get(FORWARDED) or ""), 64)
    return (Source(FORWARDED_MESSAGE, who),)
