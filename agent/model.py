"""Build the chat model a ``ModelSpec`` names, with Chital's streaming, timeout and retry defaults."""

from __future__ import annotations

import functools
import importlib
from typing import Any

from langchain_core.language_models import BaseChatModel

from agent.config import AgentSettings, ModelSpec


def _field_names(cls: type) -> set[str]:
    """Constructor field names and aliases of a pydantic chat-model class."""
    names: set[str] = set()
    for name, info in getattr(cls, "model_fields", {}).items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
    return names


class _UntransformedBulk:
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


@functools.cache
def _fast_class(cls: type) -> type:
    """``cls`` with the ``_UntransformedBulk`` mixin when it is a langchain-openai chat model."""
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
    except ImportError:
        return cls
    if not issubclass(cls, BaseChatOpenAI) or issubclass(cls, _UntransformedBulk):
        return cls
    return type(cls.__name__, (_UntransformedBulk, cls), {"__module__": __name__, "__doc__": cls.__doc__})


def build_chat_model(spec: ModelSpec, settings: AgentSettings) -> BaseChatModel:
    """Instantiate ``spec.use`` (``module:Class``) with ``spec.kwargs()``.

    Defaults we add unless the spec sets them (so one spec format fits ChatOpenAI, ChatAnthropic...):
    - ``streaming=True``: the chat shows tokens as they come.
    - ``timeout=settings.model_timeout``: httpx's read timeout, which bounds the wait for the first
      byte and every silent gap in the stream, not the whole answer, so a long answer that keeps
      streaming is never cut off. (langchain-openai's ``stream_chunk_timeout`` is off by default,
      see below.)
    - ``max_retries=0``: retries belong to ``agent.middleware.RetryModelCalls``, which honours
      ``model_retries``/``retry_backoff`` and Retry-After; the SDK's own retries (openai: 2, with a
      fixed 0.5-8 s schedule) would multiply with ours and ignore the settings.
    The spec's kwargs may hold an ``api_key``: it goes to the constructor only (ChatOpenAI keeps it
    as a SecretStr) and is never logged here.
    """
    module_name, _, class_name = spec.use.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"model {spec.name!r}: 'use' must look like 'module:Class', got {spec.use!r}")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"model {spec.name!r}: cannot import {spec.use!r}") from exc
    cls = _fast_class(cls)
    kwargs: dict[str, Any] = spec.kwargs()
    fields = _field_names(cls)
    if "streaming" in fields:
        kwargs.setdefault("streaming", True)
    if "stream_usage" in fields:
        kwargs.setdefault("stream_usage", True)
    if "max_retries" in fields:
        kwargs.setdefault("max_retries", 0)
    if "timeout" in fields and "timeout" not in kwargs and "request_timeout" not in kwargs:
        kwargs["timeout"] = settings.model_timeout
    if "stream_chunk_timeout" in fields:
        # Off unless the spec sets it: langchain-openai implements it with one ``asyncio.wait_for``
        # (a task) per streamed chunk, measured at ~2.7 ms CPU per turn, a quarter of a bare turn.
        # httpx's read timeout (``timeout`` above) already fires when the server goes silent; only
        # a provider that sends SSE keep-alive comments forever without tokens slips past it, and
        # the gateway's ``concurrency.turn_timeout`` bounds that case.
        kwargs.setdefault("stream_chunk_timeout", None)
    try:
        model = cls(**kwargs)
    except Exception as exc:
        # Validation errors may echo constructor values (an api_key): keep only the class name.
        raise ValueError(
            f"model {spec.name!r}: invalid settings for {spec.use} ({type(exc).__name__})"
        ) from None
    if not isinstance(model, BaseChatModel):
        raise ValueError(f"model {spec.name!r}: {spec.use} is not a LangChain chat model")
    return model


def model_display_name(spec: ModelSpec, model: BaseChatModel) -> str:
    """What /status shows: the provider's model id when known, else the spec's name."""
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return spec.name
