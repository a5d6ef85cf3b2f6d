"""One run of the compiled agent graph, translated into Chital's ``AgentEvent`` stream.

Split from agent/harness.py, which decides *what* a turn runs (replay, continue, new input) and
holds the thread's lock; this module only runs the graph and says what happened in it: the lead's
text (from a ``TokenTap``, agent/model.py), tool progress, approval requests with the thread's
untrusted sources, model retries, the tools' own events, and the final answer when the stream shows
it. It keeps no state between turns, so the harness hands it what it needs per call.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Any, Literal

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, StreamMode

from agent import tracing
from agent.approvals import approval_event
from agent.events import AgentEvent, Final, StatusUpdate, TextDelta, ToolProgress
from agent.history import brief, messages_of
from agent.middleware import RETRY_EVENT
from agent.model import TokenTap
from agent.provenance import MESSAGE, Provenance, Source, of_messages

CustomEventConverter = Callable[[Any], Sequence[AgentEvent]]
"""Maps one ``custom`` stream part (tools' and middleware's own events) to agent events."""

DURABILITY: Literal["sync"] = "sync"
"""Checkpoint durability of every run; agent/harness.py's module docstring says why."""

_LEAD_NODE = "model"
_STREAM_MODES: list[StreamMode] = ["updates", "custom"]
"""No "messages": the lead's tokens come from a TokenTap (agent/model.py), at a fraction of the cost."""


async def untrusted_sources(
    graph: CompiledStateGraph[Any, Any, Any, Any], config: RunnableConfig
) -> tuple[Source, ...] | None:
    """The untrusted sources in the thread now, for an approval request: the person deciding
    should know the call may come from what a page or a stranger said. None: unreadable."""
    try:
        snap = await graph.aget_state(config)
    except Exception:  # the request still goes out; it says nothing of provenance then
        return None
    messages = snap.values.get("messages", ())
    return of_messages(messages).merged(others_words(messages, config)).sources


def others_words(messages: Sequence[Any], config: RunnableConfig) -> list[Source]:
    """The thread's messages its requester did not write: in a group one agent thread holds every
    member's turns, so another member's earlier message can steer this requester's call (and a
    standing permission must not answer it). A message naming no author (a summary of earlier
    history, which may hold a page long since read) counts as someone else's: deny by default."""
    user = str((config.get("metadata") or {}).get("user_id") or "")
    found: list[Source] = []
    for message in messages:
        if isinstance(message, HumanMessage):
            author = str(message.additional_kwargs.get("user_id") or "")
            if not user or author != user:
                found.append(Source(MESSAGE, author or "someone (earlier history)"))
    return found


async def stream_events(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    inp: dict[str, Any] | Command[Any] | None,
    config: RunnableConfig,
    *,
    redact: Callable[[str], str],
    custom_events: Sequence[CustomEventConverter],
    model_retries: int,
) -> AsyncGenerator[AgentEvent, None]:
    """Map LangGraph stream parts to events; yields a Final (no tool calls) when the lead's
    last model step is known from the stream. ``redact`` masks secrets in an approval request's
    arguments; ``model_retries`` is the "of N" of a retry notice that does not say it."""
    final: AIMessage | None = None
    # The lead's text comes from a TokenTap (agent/model.py) on this loop, the graph's updates
    # and custom events from a task that runs the graph; both land in one queue, in order.
    queue: asyncio.Queue[Any] = asyncio.Queue()
    tap = TokenTap(queue.put_nowait, _is_lead)
    traced = tracing.callbacks()  # none while tracing is off (agent/tracing.py)
    config = {**config, "callbacks": [*(config.get("callbacks") or ()), tap, *traced]}  # type: ignore[misc]
    runner = asyncio.create_task(_run_graph(graph, inp, config, queue))
    runner.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, str):
                yield TextDelta(item)
                continue
            mode, part = item
            if mode == "updates":
                pauses = part.get("__interrupt__", ())
                sources = await untrusted_sources(graph, config) if pauses else ()
                # Unreadable: no words to show, and no standing permission may answer it.
                untrusted = redact(Provenance(sources).describe()) if sources is not None else ""
                for pause in pauses:
                    request = approval_event(pause.id, pause.value, redact)
                    if request is not None:
                        yield dataclasses.replace(
                            request,
                            untrusted=untrusted,
                            sources=sources or (),
                            standing_ok=sources is not None,
                        )
                for node, update in part.items():
                    for message in messages_of(update):
                        if node == _LEAD_NODE and isinstance(message, AIMessage):
                            final = message
                            for call in message.tool_calls:
                                yield ToolProgress(call["name"], "start", brief(call.get("args")))
                        elif isinstance(message, ToolMessage):
                            phase = "error" if message.status == "error" else "end"
                            yield ToolProgress(message.name or "tool", phase)
            elif mode == "custom" and isinstance(part, dict) and RETRY_EVENT in part:
                info = part[RETRY_EVENT]
                attempt = f"{info['attempt']}/{info.get('of', model_retries)}"
                cause = info.get("cause", "failed")
                yield StatusUpdate(f"The model service {cause}; retrying ({attempt})…")
            elif mode == "custom":
                for convert in custom_events:
                    for event in convert(part):
                        yield event
        runner.result()  # the graph's error, if any
    finally:
        if not runner.done():  # cancelled (/stop) or closed early: stop the graph, let it settle
            runner.cancel()
            await asyncio.wait({runner}, timeout=10)  # not a suppress: a second cancel of ours goes on
            if runner.done() and not runner.cancelled():
                runner.exception()  # retrieved: the turn is over, its late failure is not news
    if final is not None and not final.tool_calls:
        yield Final(final.text)


async def _run_graph(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    inp: dict[str, Any] | Command[Any] | None,
    config: RunnableConfig,
    queue: asyncio.Queue[Any],
) -> None:
    """Run the graph, putting its (mode, part) pairs on ``queue``."""
    try:
        # (mode, part) pairs: LangGraph's overloads type this call's items too loosely to help.
        stream: Any = graph.astream(inp, config, stream_mode=_STREAM_MODES, durability=DURABILITY)
        async with aclosing(stream):
            async for item in stream:
                queue.put_nowait(item)
    except asyncio.CancelledError as exc:
        # LangGraph hands over the task that finishes writing the checkpoint; wait for it so
        # the next turn reads a settled history.
        for arg in exc.args:
            if isinstance(arg, asyncio.Future):
                await asyncio.wait({arg}, timeout=5)  # not a suppress: a second cancel goes on
        raise


def _is_lead(meta: dict[str, Any]) -> bool:
    """Tokens of the lead agent's model node; not a model called inside a tool or a sub-agent."""
    return meta.get("langgraph_node") == _LEAD_NODE and "|" not in meta.get("langgraph_checkpoint_ns", "")
