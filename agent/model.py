"""Build the chat model a ``ModelSpec`` names, with Chital's streaming, timeout and retry defaults."""

from __future__ import annotations

import asyncio
import difflib
import importlib
import inspect
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar
from uuid import UUID

from langchain.agents.middleware.types import AgentMiddleware, ModelRequest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable

from agent.config import AgentSettings, ModelSpec
from compat import langchain_core as lc_compat
from compat import langchain_openai as openai_compat
from compat.openai_client import stream_plain_chunks

T = TypeVar("T")
NOSTREAM = "nostream"
"""The tag (LangGraph's ``TAG_NOSTREAM``) that keeps a model call's tokens out of the answer."""


def _field_names(cls: type) -> set[str]:
    """Constructor field names and aliases of a pydantic chat-model class."""
    names: set[str] = set()
    for name, info in getattr(cls, "model_fields", {}).items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
        choices = getattr(info.validation_alias, "choices", [info.validation_alias])
        names.update(c for c in choices if isinstance(c, str))  # AliasChoices, or one name
    return names


NO_KEY = "unused"
"""The API key passed to a keyless OpenAI-compatible server (the OpenAI client refuses none)."""
_OPENAI_HOST = "api.openai.com"


def openai_base_url(spec: ModelSpec) -> str:
    """The base URL an OpenAI-compatible model talks to: the spec's, else ``$OPENAI_BASE_URL``
    (read by the OpenAI client itself), else "" (api.openai.com)."""
    kwargs = spec.kwargs()
    url = kwargs.get("base_url") or kwargs.get("openai_api_base") or os.environ.get("OPENAI_BASE_URL")
    return url if isinstance(url, str) else ""


def has_api_key(spec: ModelSpec) -> bool:
    kwargs = spec.kwargs()
    key = kwargs.get("api_key") or kwargs.get("openai_api_key")
    getter = getattr(key, "get_secret_value", None)
    return bool((getter() if getter else key) or os.environ.get("OPENAI_API_KEY"))


def keyless_server(spec: ModelSpec) -> bool:
    """An OpenAI-compatible model at a server of the operator's own (``base_url`` or
    ``$OPENAI_BASE_URL``, not api.openai.com) with no key anywhere: a local llama.cpp, vLLM or
    Ollama asks for none, so none is demanded (``chital init`` writes ``api_key: unused``)."""
    url = openai_base_url(spec)
    return bool(url) and _OPENAI_HOST not in url and not has_api_key(spec)


def unknown_settings(spec: ModelSpec, cls: type) -> list[tuple[str, str]]:
    """``(key, why)`` for each key under ``models[]`` that ``cls``'s constructor does not take,
    naming the closest one it does. Why: langchain-openai moves unknown keys into ``model_kwargs`` with a
    mere warning, so ``modle:`` passed every check, then each request failed with a TypeError,
    and ``base_ulr:`` silently sent the conversation to api.openai.com."""
    fields = _field_names(cls)
    if not fields:
        try:
            params = inspect.signature(cls).parameters.values()
        except (TypeError, ValueError):
            return []
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return []  # takes anything: nothing to check against
        fields = {p.name for p in params}
    out = []
    for key in spec.kwargs():
        if key in fields:
            continue
        close = difflib.get_close_matches(key, sorted(fields), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else " (see the class's documentation)"
        out.append((key, f"not a setting of {spec.use}{hint}"))
    return out


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
    unknown = unknown_settings(spec, cls)
    if unknown:
        raise ValueError(f"model {spec.name!r}: " + "; ".join(f"{k!r} is {why}" for k, why in unknown))
    cls = openai_compat.fast_class(cls)
    kwargs: dict[str, Any] = spec.kwargs()
    fields = _field_names(cls)
    if openai_compat.is_openai_class(cls) and keyless_server(spec):
        kwargs["api_key"] = NO_KEY
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
    if openai_compat.is_fast(model):
        # The SDK's chunks as plain dicts (compat/openai_client.py).
        stream_plain_chunks(getattr(model, "root_async_client", None))
    return model


def model_display_name(spec: ModelSpec, model: BaseChatModel) -> str:
    """What /status shows: the provider's model id when known, else the spec's name."""
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return spec.name


class TokenTap(BaseCallbackHandler, lc_compat.StreamingCallbackHandler):
    """One turn's streamed answer text, handed straight to the turn's event loop.

    Why not LangGraph's ``stream_mode="messages"``: for every token it copies the chunk, then
    crosses to the loop with ``call_soon_threadsafe`` (a self-pipe write per token, ~9 % of a
    streamed turn's samples), wakes the stream's waiter task (a new task per token) and the
    runner's ``asyncio.wait``. This handler is called inline on the loop (``run_inline``), keeps
    only the calls ``wanted`` accepts (by their run metadata; never those tagged ``nostream``) and
    passes each new piece of text to ``put``.

    A model call that follows a failed one in the same graph task (same ``langgraph_checkpoint_ns``:
    a retry) first repeats what the failed attempt already said; those characters are not passed
    on again, only what is new. After a call that ended well, the next one starts afresh.
    Being a streaming handler (compat/langchain_core.py), it makes models without an explicit ``streaming``
    setting stream, as LangGraph's handler did; models whose tokens nobody reads (sub-agents,
    titles, summaries, memory extraction) are called with ``stream=False``.
    """

    run_inline = True

    def __init__(self, put: Callable[[str], None], wanted: Callable[[dict[str, Any]], bool]) -> None:
        self._put = put
        self._wanted = wanted
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._runs: dict[UUID, list[Any]] = {}
        """run id -> [task key, characters this call produced]"""
        self._shown: dict[str, int] = {}
        """task key -> characters of that task's answer already passed on"""

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if metadata and not (tags and NOSTREAM in tags) and self._wanted(metadata):
            self._runs[run_id] = [str(metadata.get("langgraph_checkpoint_ns", "")), 0]

    def on_llm_new_token(self, token: Any, *, chunk: Any = None, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.get(run_id)
        if run is None:
            return
        text = getattr(chunk, "text", token) if chunk is not None else token
        if not text or not isinstance(text, str):
            return
        start = run[1]
        run[1] = end = start + len(text)
        shown = self._shown.get(run[0], 0)
        if end <= shown:
            return  # a retry repeating what its failed attempt already said
        self._shown[run[0]] = end
        piece = text[shown - start :] if shown > start else text
        if threading.get_ident() == self._thread:
            self._put(piece)
        else:  # a model called from a worker thread
            self._loop.call_soon_threadsafe(self._put, piece)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._runs.pop(run_id, None)
        if run is not None:
            self._shown.pop(run[0], None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    def tap_output_aiter(self, run_id: UUID, output: AsyncIterator[T]) -> AsyncIterator[T]:
        return output

    def tap_output_iter(self, run_id: UUID, output: Iterator[T]) -> Iterator[T]:
        return output


def unstreamed(model: BaseChatModel) -> Runnable[Any, Any]:
    """``model`` called with ``stream=False``: for calls whose tokens no one watches (titles,
    summaries). One response to parse instead of an SDK object and a callback round per token;
    LangChain honours ``stream=False`` over the model's ``streaming=True``."""
    return model.bind(stream=False)


class Unstreamed(AgentMiddleware[Any, Any, Any]):
    """An agent whose model calls no one watches live (a sub-agent): ``stream=False`` on each call,
    for the reason given in :func:`unstreamed`. The answer is the same message either way."""

    def wrap_model_call(self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Any]) -> Any:
        return handler(request.override(model_settings={**request.model_settings, "stream": False}))

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Awaitable[Any]]
    ) -> Any:
        return await handler(request.override(model_settings={**request.model_settings, "stream": False}))
