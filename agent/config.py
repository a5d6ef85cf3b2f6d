"""Settings the harness needs. The gateway's config.yaml embeds these under ``agent:``; the agent
never reads files of the gateway."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.sandbox.config import SandboxSettings
from agent.settings import (
    ContextSettings,
    McpSettings,
    MemorySettings,
    SkillsSettings,
    SubagentSettings,
    WebSettings,
)


class ModelSpec(BaseModel):
    """One chat model: ``use`` is a ``module:Class`` path; every other key goes to its constructor."""

    model_config = ConfigDict(extra="allow")

    name: str = "default"
    use: str = "langchain_openai:ChatOpenAI"

    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class AgentSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = "default"
    """Name of the entry in ``models`` the lead agent uses."""
    system_prompt: str = (
        "You are Chital, a helpful assistant that lives in the user's team chat. "
        "Answer concisely in Markdown."
    )
    model_timeout: float = Field(60.0, gt=0)
    """Seconds the model may stay silent (before the first byte, or between streamed chunks)
    before the call counts as failed."""
    model_retries: int = Field(3, ge=0, le=10)
    """Retries of a failed model call (timeout, 429, 5xx) with exponential backoff."""
    retry_backoff: float = Field(1.0, ge=0)
    """First backoff delay in seconds; doubles each retry (jittered)."""
    max_steps: int = Field(25, ge=1)
    """Model calls one turn may make before it must answer."""

    tools: bool = True
    """Off: a plain chat model with no sandbox, sub-agents, skills or web tools (the lightest
    set-up; also what the latency benchmark's "bare" mode measures)."""
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    """Its ``root`` (default ``sandboxes``, one default in ``SandboxSettings``) is taken relative to
    the storage path, whether or not any other sandbox key is set."""
    subagents: SubagentSettings = Field(default_factory=SubagentSettings)
    skills: SkillsSettings = Field(default_factory=SkillsSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    context: ContextSettings = Field(default_factory=ContextSettings)
    web: WebSettings = Field(default_factory=WebSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
