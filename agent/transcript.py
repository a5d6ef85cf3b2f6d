"""A thread's history as lines a person reads (the operator console's transcript, docs/console.md):
who spoke, what they said, which tools were called with which arguments and what they returned.
Every text is cut (a 50 MB tool result must not become a 50 MB page), after ``mask`` (the reader's
secret redactor): cut first, a secret across the cut showed its head, which no mask after the cut
can find; the reader escapes it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

TEXT_CHARS = 4000
ARGS = 600
"""Characters of a tool call's JSON arguments shown."""
ROLES = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}


@dataclass(frozen=True, slots=True)
class TranscriptLine:
    role: str
    """``user``, ``assistant``, ``tool`` or ``system``."""
    text: str
    tool_calls: tuple[str, ...] = ()
    """``name {json arguments}`` of each call an assistant message made, cut."""
    name: str = ""
    """A tool message's tool."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                parts.append(str(part.get("text", "")) if kind == "text" else f"[{kind}]")
        return "".join(parts)
    return str(content)


def _args(call: dict[str, Any]) -> str:
    return json.dumps(call.get("args", {}), ensure_ascii=False)


def _same(text: str) -> str:
    return text


def transcript_of(
    messages: Iterable[Any], last: int = 200, mask: Callable[[str], str] | None = None
) -> tuple[TranscriptLine, ...]:
    """The last ``last`` messages of a thread (LangChain message objects) as lines, each text
    ``mask``-ed before it is cut."""
    mask = mask or _same
    lines = []
    for message in list(messages)[-last:]:
        role = ROLES.get(str(getattr(message, "type", "")), str(getattr(message, "type", "?")))
        calls = tuple(
            f"{call.get('name', '?')} {_cut(mask(_args(call)), ARGS)}"
            for call in (getattr(message, "tool_calls", None) or ())
            if isinstance(call, dict)
        )
        name = str(getattr(message, "name", "") or "") if role == "tool" else ""
        text = _cut(mask(_text(getattr(message, "content", ""))), TEXT_CHARS)
        lines.append(TranscriptLine(role, text, calls, name))
    return tuple(lines)
