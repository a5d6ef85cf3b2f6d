"""Reading and mending a thread's messages: the answer a retried message already got, the tool
calls a stopped turn left unanswered, the messages of one graph update, and the short forms of a
turn's text and a tool's arguments. Pure functions over LangChain messages, split from
agent/harness.py so the harness reads as the run loop it is."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage

from agent.events import Final
from agent.steering import steered, turn_start


def earlier_answer(messages: Sequence[AnyMessage], message_id: str) -> Final | None:
    """The answer to ``message_id`` when later messages followed it in the thread (its reply was
    retried after the conversation moved on): the last model text before the next user message.
    None when the message is the thread's latest or not in it.

    A steered message belongs to the turn it was added to: it ends no segment, and its own answer
    is that turn's (a restart that finds it in the history replays that answer, never asks again)."""
    start = next(
        (i for i, m in enumerate(messages) if isinstance(m, HumanMessage) and m.id == message_id), None
    )
    if start is None:
        return None
    segment: list[AnyMessage] = []
    for m in messages[start + 1 :]:
        if turn_start(m):
            break
        segment.append(m)
    else:
        if not steered(messages[start]):
            return None  # the latest message: the usual replay / continue logic applies
        if not segment or not isinstance(segment[-1], AIMessage) or segment[-1].tool_calls:
            return None  # its turn is unfinished: the turn that took it continues
    answer = next((m for m in reversed(segment) if isinstance(m, AIMessage) and not m.tool_calls), None)
    if answer is None:
        return Final("⚠️ I lost the answer to this message while the conversation went on; please ask again.")
    return Final(answer.text)


def with_files(text: str, files: Sequence[str]) -> str:
    if not files:
        return text
    listing = "\n".join(f"- {path}" for path in files)
    return f"{text}\n\nAttached files:\n{listing}"


def messages_of(update: Any) -> list[Any]:
    """Messages in one node's update (a dict, a list of them, or None for hooks that wrote nothing)."""
    if isinstance(update, dict):
        messages = update.get("messages")
        if isinstance(messages, list):
            return messages
        return [messages] if messages is not None else []
    if isinstance(update, list | tuple):
        return [m for item in update for m in messages_of(item)]
    return []


def tool_patches(messages: Sequence[AnyMessage]) -> list[ToolMessage]:
    """ToolMessages answering the tool calls of the last AIMessage that got no result.

    Only the tail can dangle: every turn closes the previous one's calls before it starts.
    deepagents' PatchToolCallsMiddleware does this for the whole history on every turn (one more
    graph node and a full rewrite of the messages); here it costs nothing when nothing dangles.
    """
    answered: set[str] = set()
    for message in reversed(messages):
        if isinstance(message, ToolMessage):
            answered.add(message.tool_call_id)
        elif isinstance(message, AIMessage):
            return [
                ToolMessage(
                    content=f"Tool call {call['name']} was stopped before it finished; no result.",
                    name=call["name"],
                    tool_call_id=call["id"],
                    status="error",
                )
                for call in message.tool_calls
                if call.get("id") and call["id"] not in answered
            ]
        else:
            return []
    return []


def brief(args: Any, limit: int = 200) -> str:
    if not args:
        return ""
    try:
        text = json.dumps(args, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = str(args)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def starts_turn(inp: object, message_id: str) -> bool:
    """Whether a run's input ``inp`` starts the turn of ``message_id``: it holds the message, which
    the harness puts there only when the thread does not have it yet (``Final.fresh``)."""
    return isinstance(inp, dict) and any(getattr(m, "id", None) == message_id for m in inp["messages"])
