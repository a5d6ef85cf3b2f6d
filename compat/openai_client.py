"""Reaches into the ``openai`` SDK: a live ``AsyncOpenAI`` client's class swapped for a subclass
that overrides the private ``_process_response_data``.

Why: the SDK builds each streamed chunk with ``construct_type`` (walking the type's fields and
unions: ~35-45 % of a streamed answer's CPU in the daemon, measured with py-spy), and
langchain-openai turns every one straight back into a dict (``chunk.model_dump()``); it reads
dicts as they are. The SDK's own switch for "no model" is ``cast_to=object``
(``_process_response_data``); the subclass takes that path for the chunk type only. A request with
``response_format`` (structured output, streamed through the SDK's typed ``beta`` helper) keeps
typed chunks: that is checked once per response, from the request body.

Public fallback (outside :data:`compat.versions.VERIFIED`'s ``openai`` set): the client is left
as the SDK made it, so chunks are typed objects again (slower, same answers).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from compat.versions import usable

DISTRIBUTION = "openai"


def _plain_chunks(data: Any) -> Any:
    """A streamed chat-completion chunk as the JSON the server sent, in the shape langchain-openai
    reads (it indexes ``choice["delta"]``)."""
    for choice in data.get("choices") or ():
        if isinstance(choice, dict):
            choice.setdefault("delta", {})
    return data


@functools.cache
def _plain_chunk_client(cls: Any) -> type:
    """``cls`` (an ``openai.AsyncOpenAI`` class) handing out streamed chat-completion chunks as the
    JSON dicts they arrive as, instead of ``ChatCompletionChunk`` objects (see the module
    docstring)."""
    from openai.types.chat import ChatCompletionChunk

    typed: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()

    def wants_typed(response: Any) -> bool:
        hit = typed.get(response)
        if hit is None:
            try:
                hit = b'"response_format"' in (response.request.content or b"")
            except Exception:  # no readable request body: keep the SDK's way
                hit = True
            typed[response] = hit
        return hit

    def _process_response_data(self: Any, *, data: object, cast_to: Any, response: Any) -> Any:
        if cast_to is ChatCompletionChunk and isinstance(data, dict) and not wants_typed(response):
            return _plain_chunks(data)
        return cls._process_response_data(self, data=data, cast_to=cast_to, response=response)

    return type(
        cls.__name__, (cls,), {"_process_response_data": _process_response_data, "__module__": __name__}
    )


def stream_plain_chunks(client: Any) -> None:
    """Make an ``AsyncOpenAI`` client (a langchain-openai model's ``root_async_client``) hand over
    plain chunks (see the module docstring); nothing outside the verified releases."""
    cls: Any = type(client)
    if client is None or not usable(DISTRIBUTION) or not hasattr(cls, "_process_response_data"):
        return
    client.__class__ = _plain_chunk_client(cls)
