"""What the approval tests share: the agent side (a harness whose tools record what ran, gated by an
approval policy) and the gateway side (the config, a turn that pauses on a call, the buttons the user
sees). One home, so no test module imports another; ``clear_ran`` in conftest.py empties ``RAN``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

from langchain_core.tools import tool

from agent.approvals import with_approvals
from agent.config import AgentSettings, ModelSpec
from agent.events import AgentEvent, ApprovalRequested, ToolProgress
from agent.harness import Harness
from agent.safety import Redactor
from agent.settings import ApprovalSettings
from tests.fakes.fake_channel import FakeChannel
from tests.fakes.fake_harness import Call
from tests.fakes.gateway_rig import ADMIN, USER, make_config
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

API_KEY = "sk-test-secret-0123456789"
BUTTONS = ["✅ Approve", "💬 Allow here", "♾ Always", "❌ Deny"]
"""The buttons under a request (standing permissions offered: the default)."""
FAST = AgentSettings(retry_backoff=0.001, model_retries=0, model_timeout=5)


RAN: list[str] = []


@tool
def shell(command: str) -> str:
    """Run a shell command."""
    RAN.append(command)
    return f"output of {command}"


@tool
def wipe(path: str) -> str:
    """Delete a path."""
    RAN.append(f"wipe {path}")
    return "wiped"


def harness_for(
    fake: FakeOpenAI, path: Path, policy: ApprovalSettings, checkpoint_url: str | None = None
) -> Harness:
    spec = ModelSpec(model="fake-model", base_url=fake.base_url, api_key=API_KEY)
    middleware = with_approvals([], policy, ["shell", "wipe"])
    return Harness(
        FAST,
        spec,
        path,
        extra_tools=[shell, wipe],
        extra_middleware=middleware,
        redact=Redactor(["hunter2-secret"]),
        checkpoint_url=checkpoint_url,
    )


async def collect(events: AsyncIterator[AgentEvent]) -> list[AgentEvent]:
    async with aclosing(events) as run:  # type: ignore[type-var]
        return [event async for event in run]


OTHER = 300
CALL = ApprovalRequested(
    "intr-1", "execute", {"command": "rm -rf /tmp/cache"}, "The agent wants to run execute."
)


def config(timeout: float = 600, approvers: str = "requester") -> Any:
    return make_config(
        access={"admins": [str(ADMIN)], "allow_users": [str(USER), str(OTHER)]},
        delivery={"first_edit_delay": 0.0},
        agent={"approvals": {"tools": ["execute"], "timeout": timeout, "approvers": approvers}},
    )


async def asks(call: Call) -> AsyncIterator[AgentEvent]:
    yield ToolProgress("execute", "start")
    yield CALL


def buttoned(channel: FakeChannel) -> Any:
    return next((m for m in channel.sent if m.buttons), None)


async def tg_buttons(tg: FakeTelegram, chat: int, timeout: float = 20) -> Any:
    return await tg.wait_for(
        lambda: next((m for m in tg.bot_messages(chat) if tg.buttons(chat, m.message_id)), None),
        timeout=timeout,
        what="the approval buttons",
    )


async def tg_answer(tg: FakeTelegram, query: dict[str, Any], timeout: float = 15) -> dict[str, Any]:
    qid = query["callback_query"]["id"]
    answer: dict[str, Any] = await tg.wait_for(
        lambda: tg.answered_queries.get(qid), timeout=timeout, what="answer"
    )
    return answer
