"""Reaches into ``langchain-core``: the private ``_StreamingCallbackHandler`` base class, and the
private ``langchain_core.messages.content._get_data_content_block_types`` replaced by a memoised
copy.

Public fallback (outside :data:`compat.versions.VERIFIED`'s ``langchain-core`` set):
:class:`StreamingCallbackHandler` is a plain class (the real one is a ``runtime_checkable``
protocol, so a handler with ``tap_output_aiter``/``tap_output_iter`` still matches it), and the
content block types are derived on every call again (slower).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from compat.versions import usable

DISTRIBUTION = "langchain-core"

if TYPE_CHECKING:
    from langchain_core.tracers._streaming import _StreamingCallbackHandler as StreamingCallbackHandler
elif usable(DISTRIBUTION):
    # LangGraph and LangChain treat a callback handler of this type as one that reads the tokens:
    # a model without an explicit ``streaming`` setting streams when one is attached.
    from langchain_core.tracers._streaming import _StreamingCallbackHandler as StreamingCallbackHandler
else:

    class StreamingCallbackHandler:
        """Stand-in: the protocol matches the tap's methods without this base."""


def memoise_content_block_types() -> bool:
    """Memoise ``content._get_data_content_block_types``: it re-derives a constant tuple with
    ``typing.get_type_hints`` for every content block of every message of every model call, and
    is a pure function of static types. Returns whether it was done."""
    if not usable(DISTRIBUTION):
        return False
    from langchain_core.messages import content

    original = content._get_data_content_block_types
    if not hasattr(original, "cache_info"):
        content._get_data_content_block_types = functools.cache(original)
    return True


__all__ = ["StreamingCallbackHandler", "memoise_content_block_types"]
