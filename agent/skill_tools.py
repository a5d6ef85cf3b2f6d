"""``draft_skill``: the agent writes down how a task was done as a new skill ("remember how we did
this as a skill"), which waits for an admin.

A draft is written under ``skills/custom/.drafts/`` (agent/skill_install.py), a folder the catalog
never reads: no user can load it, and it is not in any prompt, until an admin approves it
(``/skills approve NAME`` after reading it with ``/skills show NAME``, or ``chital skills
approve NAME``). That holds whatever the conversation read: a skill drafted after reading a web
page is the page's text in the agent's words, so it never becomes active on the model's say-so.
The conversation's provenance (agent/provenance.py: the untrusted sources it had read) is recorded
with the draft and shown to the admin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from langchain.tools import ToolRuntime
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field

from agent.events import AgentEvent, SkillDrafted
from agent.provenance import provenance_of_call
from agent.settings import SkillsSettings
from agent.skill_install import draft_skill
from agent.skills import SkillError

DRAFT_SKILL = "draft_skill"
MAX_BODY_CHARS = 20_000
DRAFT_EVENT = "chital_skill_drafted"
"""Custom stream key of a new draft (:func:`draft_events` makes it a SkillDrafted)."""


class _DraftArgs(BaseModel):
    name: str = Field(description="Lowercase letters, digits and single hyphens, e.g. 'weekly-report'.")
    description: str = Field(description="One or two sentences: what the skill does and when to use it.")
    body: str = Field(
        description="The instructions, in Markdown: the steps, as you would follow them next time."
    )


def build_skill_tools(settings: SkillsSettings, reserved: Collection[str] = ()) -> list[BaseTool]:
    """The ``draft_skill`` tool over ``settings.custom_dir``."""

    async def draft(name: str, description: str, body: str, runtime: ToolRuntime) -> str:
        if len(body) > MAX_BODY_CHARS:
            raise ToolException(
                f"the instructions are {len(body)} characters; keep them under {MAX_BODY_CHARS}"
            )
        config = runtime.config or {}
        metadata = config.get("metadata") or {}
        user = str(metadata.get("user_id") or "unknown user")
        thread = str((config.get("configurable") or {}).get("thread_id") or "")
        provenance = provenance_of_call(runtime.state, str(metadata.get("message_id") or ""))
        origin = f"drafted by the agent for {user} in thread {thread[:8]}"
        if provenance.tainted:
            origin += f"; the conversation had read {provenance.describe()}"
        try:
            await asyncio.to_thread(
                draft_skill,
                settings,
                name.strip(),
                description,
                body,
                drafted_by=f"the agent (asked by {user})",
                origin=origin,
                reserved=reserved,
            )
        except SkillError as exc:
            raise ToolException(str(exc)) from None
        if runtime.stream_writer is not None:  # the gateway tells the admins a draft waits
            runtime.stream_writer({DRAFT_EVENT: name.strip()})
        return (
            f"Drafted the skill {name.strip()!r}. It is NOT usable yet: an admin must read and approve it "
            f"(/skills show {name.strip()}, then /skills approve {name.strip()}). Tell the user so."
        )

    return [
        StructuredTool.from_function(
            coroutine=draft,
            name=DRAFT_SKILL,
            description=(
                "Save how a task was done as a new skill, when the user asks you to remember it as a "
                "skill. The skill waits for an admin's approval before anyone can use it."
            ),
            args_schema=_DraftArgs,
            handle_tool_error=True,
        )
    ]


def draft_events(part: Any) -> list[AgentEvent]:
    """A ``custom_events`` converter (agent/stream_events.py): a draft just written."""
    if isinstance(part, dict) and isinstance(part.get(DRAFT_EVENT), str):
        return [SkillDrafted(part[DRAFT_EVENT])]
    return []
