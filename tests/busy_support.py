"""What the background-task and steering tests share (tests/test_e2e_background.py,
tests/test_e2e_steering.py, tests/test_e2e_background_steering_channels.py): scripted model turns
held until a test releases them, and the texts they look for."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text

TASK, TASK_ANSWER = "compare three laptops for me", "Here is the comparison, with the weather."
STEER = "and mention the weather in Lisbon"
QUEUED = "Queued behind"
E2E = 30.0
"""Seconds a daemon gets for each step (a loaded machine is slow; nothing waits on time)."""


NO_MEMORY = {"memory": {"enabled": False}}
"""No memory extraction: every model call is a turn's."""


def two_calls(model: FakeOpenAI, text: str, answer: str) -> tuple[asyncio.Event, asyncio.Event]:
    """``text``'s turn: a first call asking for a missing tool, then the answer; each held until
    its event is set. The second call is told apart by the tool result in its request."""
    first, second = asyncio.Event(), asyncio.Event()

    def reply(body: dict[str, Any]) -> Reply:
        if any(m.get("role") == "tool" for m in body.get("messages") or ()):
            return Reply(text=answer, hold=second)
        return Reply(tool_calls=[ToolCall("no_such_tool", {"q": "laptops"})], hold=first)

    model.add_rule(lambda t: t.endswith(text), reply)
    return first, second


def requests_with(model: FakeOpenAI, text: str) -> list[dict[str, Any]]:
    return [r for r in model.requests if any(text in content_of(m) for m in r.get("messages") or ())]


def content_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def asked(model: FakeOpenAI, needle: str) -> list[dict[str, Any]]:
    """The model requests whose last user message holds ``needle``."""
    return [r for r in model.requests if needle in last_user_text(r)]


def held_task(model: FakeOpenAI, needle: str, answer: str) -> asyncio.Event:
    """A model whose answer to a request carrying ``needle`` waits until the returned event is set."""
    held = asyncio.Event()
    model.add_rule(lambda t: needle in t, Reply(text=answer, hold=held))
    return held
