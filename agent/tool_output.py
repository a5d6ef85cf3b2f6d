"""One cap on every tool result before it becomes part of the model's history.

Tools bound their own output where they can (``execute`` keeps 64 KB, the file tools stream and
cut, docs/sandbox.md "Bounded reads"), but an MCP server, a skill's tool or a future tool may
hand back 50 MB. Whatever it returns is stored in the thread's checkpoint and resent on every
later model call, so one oversized result would cost memory, disk and tokens for the rest of the
conversation. This middleware cuts text beyond :data:`MAX_TEXT_CHARS` and drops binary blocks
(images, files) beyond :data:`MAX_BLOB_CHARS` of base64, each with a note the model can act on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ToolCallRequest
from langchain_core.messages import ToolMessage
from langgraph.types import Command

MAX_TEXT_CHARS = 100_000
"""Characters of text one tool result keeps (deepagents cuts a read_file page at about 80 K)."""
MAX_BLOB_CHARS = 8 * 1024 * 1024
"""Base64 characters of the image or file blocks one tool result keeps, all together (about 6 MB
of data)."""


def _note(name: str, dropped: int) -> str:
    return (
        f"\n[… {name} output cut: {dropped:,} more characters not shown. Ask for less (a narrower "
        "query, an offset and limit, head/tail in execute) to see the rest.]"
    )


def capped(message: ToolMessage) -> ToolMessage:
    """``message`` with its content within the caps (the same message when it already was)."""
    name = message.name or "tool"
    content = message.content
    if isinstance(content, str):
        if len(content) <= MAX_TEXT_CHARS:
            return message
        cut = content[:MAX_TEXT_CHARS] + _note(name, len(content) - MAX_TEXT_CHARS)
        return message.model_copy(update={"content": cut})
    budget, blobs, changed, blocks = MAX_TEXT_CHARS, MAX_BLOB_CHARS, False, []
    for block in content:
        if isinstance(block, str) or (isinstance(block, dict) and isinstance(block.get("text"), str)):
            text = block if isinstance(block, str) else str(block["text"])
            if len(text) > budget:
                text, changed = text[:budget] + _note(name, len(text) - budget), True
            budget = max(0, budget - len(text))
            blocks.append(text if isinstance(block, str) else {**block, "text": text})
            continue
        # Any other block (an image as ``base64`` or as an ``image_url`` data URL, a JSON block,
        # whatever a tool invents) is measured by all the text it holds, however nested, and
        # the blocks of one result share one budget: ten 7 MB images are not "each small".
        size = _chars(block)
        if size > blobs:
            changed = True
            note = f"[{name} returned a block of {size * 3 // 4:,} bytes, too large to show; use execute]"
            blocks.append({"type": "text", "text": note})
            continue
        blobs -= size
        blocks.append(block)
    return message.model_copy(update={"content": blocks}) if changed else message


def _chars(value: Any, depth: int = 0) -> int:
    """Characters of text in ``value`` (strings, bytes, nested lists and dicts, their keys); a
    structure nested deeper than any real block counts as too large."""
    if isinstance(value, str | bytes):
        return len(value)
    if depth > 20:
        return MAX_BLOB_CHARS + 1
    if isinstance(value, dict):
        return sum(len(str(k)) + _chars(v, depth + 1) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_chars(v, depth + 1) for v in value)
    return len(str(value)) if isinstance(value, int | float | bool) or value is None else MAX_BLOB_CHARS + 1


def _apply(result: ToolMessage | Command[Any]) -> ToolMessage | Command[Any]:
    return capped(result) if isinstance(result, ToolMessage) else result


class ToolOutputCap(AgentMiddleware[Any, Any]):
    """Applies :func:`capped` to every tool result."""

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        return _apply(handler(request))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        return _apply(await handler(request))
