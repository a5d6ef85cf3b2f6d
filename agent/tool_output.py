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
"""Base64 characters of one image or file block a tool result keeps (about 6 MB of data)."""


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
    budget, changed, blocks = MAX_TEXT_CHARS, False, []
    for block in content:
        if isinstance(block, str) or (isinstance(block, dict) and isinstance(block.get("text"), str)):
            text = block if isinstance(block, str) else str(block["text"])
            if len(text) > budget:
                text, changed = text[:budget] + _note(name, len(text) - budget), True
            budget = max(0, budget - len(text))
            blocks.append(text if isinstance(block, str) else {**block, "text": text})
            continue
        blob = next((v for k, v in block.items() if k in ("base64", "data") and isinstance(v, str)), None)
        if blob is not None and len(blob) > MAX_BLOB_CHARS:
            changed = True
            size = len(blob) * 3 // 4
            note = f"[{name} returned a file of {size:,} bytes, too large to show; use execute on it instead]"
            blocks.append({"type": "text", "text": note})
            continue
        blocks.append(block)
    return message.model_copy(update={"content": blocks}) if changed else message


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
