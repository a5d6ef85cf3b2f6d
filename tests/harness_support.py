"""What the harness tests share (tests/test_harness.py on SQLite, tests/test_harness_postgres.py on
shared checkpoints): the model's spec against the fake, fast settings, one turn's events, and the
parts of a model request they look at."""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

from agent.config import AgentSettings, ModelSpec
from agent.events import AgentEvent
from agent.harness import Harness
from tests.fakes.openai_server import FakeOpenAI

API_KEY = "sk-test-secret-0123456789"
FAST = AgentSettings(retry_backoff=0.001, model_retries=2, model_timeout=5)


def spec(fake: FakeOpenAI) -> ModelSpec:
    return ModelSpec(model="fake-model", base_url=fake.base_url, api_key=API_KEY)


async def turn(
    harness: Harness, text: str, message_id: str, thread: str = "t1", **kw: Any
) -> list[AgentEvent]:
    async with aclosing(harness.run(thread, user_id="u1", message_id=message_id, text=text, **kw)) as run:
        return [event async for event in run]


def roles(request: dict[str, Any]) -> list[str]:
    return [m["role"] for m in request["messages"]]


def user_texts(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "user"]
