"""Chital's long-term memory: small facts per user, learned from finished turns in the background
and shown to the model in later turns of the same user. See docs/memory.md."""

from agent.memory.extraction import MARKER as EXTRACTION_MARKER
from agent.memory.facts import Fact, MemorySettings
from agent.memory.inject import MemoryMiddleware, estimate_tokens, render_section
from agent.memory.service import MemoryNotStarted, MemoryService

__all__ = [
    "EXTRACTION_MARKER",
    "Fact",
    "MemoryMiddleware",
    "MemoryNotStarted",
    "MemoryService",
    "MemorySettings",
    "estimate_tokens",
    "render_section",
]
