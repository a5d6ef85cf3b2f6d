"""The harness tests/test_long_thread.py drives, in a module of its own because that test also
hands it to a fresh interpreter (a child process killed mid-turn)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.config import AgentSettings, ModelSpec
from agent.context import build_context_middleware
from agent.harness import Harness
from agent.model import build_chat_model
from agent.settings import ContextSettings

SETTINGS = AgentSettings(retry_backoff=0.001, model_retries=2, model_timeout=5)
CONTEXT = ContextSettings(summarize_after_messages=12, keep_recent_messages=4, title="off")


def build(base_url: str, db: Path, url: str | None, tools: list[Any] | None = None) -> Harness:
    """The harness with the context stack (summaries every ~12 messages) on ``db`` or ``url``."""
    spec = ModelSpec(model="fake-model", base_url=base_url, api_key="sk-test")
    middleware = build_context_middleware(CONTEXT, build_chat_model(spec, SETTINGS))
    return Harness(
        SETTINGS, spec, db, extra_middleware=middleware, extra_tools=tools or [], checkpoint_url=url
    )
