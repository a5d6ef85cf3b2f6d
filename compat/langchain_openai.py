"""Reaches into ``langchain-openai``: its private ``BaseChatOpenAI._get_request_payload``
overridden, and its module global ``convert_to_openai_tool`` replaced by a memoising wrapper.

Public fallback (outside :data:`compat.versions.VERIFIED`'s ``langchain-openai`` set): the model
class is used as it is and tool schemas are converted on every call (slower, same requests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from compat.versions import usable

DISTRIBUTION = "langchain-openai"


class UntransformedBulk:
    """Mixin for langchain-openai chat models: send ``messages`` and ``tools`` via ``extra_body``.

    Why: ``openai``'s ``chat.completions.create`` walks the whole request against its TypedDict
    unions before sending (``_transform_recursive``), measured at ~0.35 ms CPU per message here:
    ~140 ms per model call for a 400-message thread, for a body that comes out byte-identical,
    since langchain-openai already builds plain JSON dicts. ``extra_body`` is merged into the JSON
    as is, overriding the placeholder ``messages=[]``. Structured-output calls (``response_format``)
    keep the SDK path: its parse helpers read ``tools``.
    """

    def _get_request_payload(
        self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        payload: dict[str, Any] = super()._get_request_payload(input_, stop=stop, **kwargs)  # type: ignore[misc]
        if "messages" not in payload or "response_format" in payload:
            return payload
        bulk = {"messages": payload["messages"]}
        if "tools" in payload:
            bulk["tools"] = payload.pop("tools")
        payload["messages"] = []
        payload["extra_body"] = {**(payload.get("extra_body") or {}), **bulk}
        return payload


def is_openai_class(cls: type) -> bool:
    """Whether ``cls`` is a langchain-openai chat model class (public: ``BaseChatOpenAI``)."""
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, BaseChatOpenAI)


@functools.cache
def fast_class(cls: type) -> type:
    """``cls`` with the :class:`UntransformedBulk` mixin when it is a langchain-openai chat model
    and the installed release is a verified one; else ``cls`` itself."""
    if not is_openai_class(cls) or issubclass(cls, UntransformedBulk) or not usable(DISTRIBUTION):
        return cls
    return type(cls.__name__, (UntransformedBulk, cls), {"__module__": __name__, "__doc__": cls.__doc__})


def is_fast(model: object) -> bool:
    """Whether ``model`` was built from a :func:`fast_class` (its client may stream plain chunks)."""
    return isinstance(model, UntransformedBulk)


def wrap_tool_schema(wrap: Callable[[Any], Any]) -> bool:
    """Replace ``langchain_openai.chat_models.base.convert_to_openai_tool`` (the name its
    ``bind_tools`` calls, a module global) by ``wrap(original)``. Returns whether it was done."""
    if not usable(DISTRIBUTION):
        return False
    from langchain_openai.chat_models import base

    base.convert_to_openai_tool = wrap(base.convert_to_openai_tool)
    return True
