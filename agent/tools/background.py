"""``start_background_task``: the lead agent hands work it judges long to a background task.

The agent knows no chat platform and no database: it asks a :class:`BackgroundStarter`, which the
gateway implements over its journal (gateway/turns/background.py) and hands to the runtime, as it
does the :class:`~agent.tools.schedule.Scheduler`; without one (the terminal chat, or
``background.enabled: false``) the runtime adds no such tool. Only the lead agent gets it: a
sub-agent's task text is the lead's, and a task started from a task would fan out unseen.

Who asks comes from the run's config (thread, user, the message being answered, the tool call id),
never from the model's arguments (:func:`agent.tools.schedule.caller_of`), so a prompt cannot start
work in another conversation or another user's name; the tool call id makes a call run again after
a crash find the task it started instead of starting a second one. The untrusted sources the model
had read go along: the task then gets its text as quoted data (docs/background-tasks.md).
"""

from __future__ import annotations

from typing import Protocol

from langchain.tools import ToolRuntime
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field

from agent.tools.schedule import Caller, caller_of

TOOL = "start_background_task"


class BackgroundError(Exception):
    """A request the gateway refuses (the per-user cap, the budget, a task asking for a task); the
    message is written for the model, which tells the user."""


class BackgroundStarter(Protocol):
    """What the tool needs; the gateway implements it (gateway/turns/background.py)."""

    async def start_for_agent(self, caller: Caller, task: str) -> int:
        """Start ``task`` as a background task of the caller's conversation; its number."""
        ...


class _Args(BaseModel):
    task: str = Field(
        description=(
            "The whole task, written as an instruction to a colleague who has not seen this "
            "conversation: what to do, with every detail, name, file and constraint it needs."
        ),
        min_length=1,
    )


def build_background_tools(starter: BackgroundStarter) -> list[BaseTool]:
    """``start_background_task`` over ``starter``."""

    async def start_background_task(task: str, runtime: ToolRuntime) -> str:
        try:
            caller = caller_of(runtime)
        except ToolException:
            raise ToolException("background tasks work only in a chat conversation") from None
        try:
            number = await starter.start_for_agent(caller, task)
        except BackgroundError as exc:
            raise ToolException(str(exc)) from None
        return (
            f"Started background task #{number}. It runs on its own, in a separate thread, and its "
            "result is posted to this chat as a reply to the user's message when it is done. Do not "
            f"do the task yourself now: tell the user its number, that /tasks shows its progress and "
            f"that /tasks stop {number} cancels it, then answer anything else they asked."
        )

    return [
        StructuredTool.from_function(
            coroutine=start_background_task,
            name=TOOL,
            description=(
                "Start a task that will take long (many steps, minutes or more: research, a long "
                "analysis, building something) in the background, so the conversation stays free. "
                "Use it only for long work the user asked for; answer quick questions directly."
            ),
            args_schema=_Args,
            handle_tool_error=True,
        )
    ]
