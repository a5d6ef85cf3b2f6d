"""Settings the harness needs. The gateway's config.yaml embeds these under ``agent:``; the agent
never reads files of the gateway."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent.acp.settings import AcpAgent, check_names
from agent.sandbox.config import SandboxSettings
from agent.settings import (
    ApprovalSettings,
    ContextSettings,
    McpSettings,
    MemorySettings,
    SkillsSettings,
    SubagentSettings,
    ToolSearchSettings,
    WebSettings,
)


class ModelSpec(BaseModel):
    """One chat model: ``use`` is a ``module:Class`` path; every other key goes to its constructor."""

    model_config = ConfigDict(extra="allow")

    name: str = "default"
    use: str = "langchain_openai:ChatOpenAI"
    vision: bool = False
    """The model takes images: a photo or screenshot a user sends is shown to it as part of the
    message (within ``agent.vision``'s limits). Off: the agent is only told the file is in its
    uploads (docs/media.md)."""

    def kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class VisionSettings(BaseModel):
    """Images users send, shown to a model whose ``models[].vision`` is on (docs/media.md)."""

    model_config = ConfigDict(extra="forbid")

    max_side: int = Field(1568, ge=64, le=8192)
    """Pixels of the longer side at most; a larger image is scaled down (aspect kept)."""
    max_bytes: int = Field(1_000_000, ge=10_000, le=20_000_000)
    """Bytes of one encoded image at most (before base64); a larger one is re-encoded smaller.
    Every image shown also lives in the thread's checkpoint, so this bounds its growth too."""
    max_images: int = Field(4, ge=0, le=16)
    """Images of one message shown to the model; the others are only named as files. 0: none."""
    max_pixels: int = Field(50_000_000, ge=1_000_000, le=500_000_000)
    """An image that claims more pixels than this is not decoded at all (a decompression bomb:
    a few KB that would unpack into gigabytes); it stays a plain file with a note."""
    keep_turns: int = Field(3, ge=1, le=50)
    """User messages an image stays attached for: the one it came with and the next ones up to
    this count. After that the model sees a placeholder naming the file in its uploads, so a long
    conversation does not resend (and pay for) every old picture on each model call."""


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
    tool_search: ToolSearchSettings = Field(default_factory=ToolSearchSettings)
    """Deferred tools: which tools are bound up front, the rest found with ``tool_search``."""
    vision: VisionSettings = Field(default_factory=VisionSettings)
    approvals: ApprovalSettings = Field(default_factory=ApprovalSettings)
    """Tool calls that need a person's yes in the chat, and tools never run (docs/approvals.md)."""
    acp_agents: dict[str, AcpAgent] = Field(default_factory=dict)
    """External coding agents (Claude Code, Codex, any ACP agent) the lead may hand a task to with
    ``delegate_to_coding_agent``, each run inside the conversation's sandboxed workspace
    (docs/coding-agents.md). Needs ``tools``; empty: no such tool."""

    @field_validator("acp_agents")
    @classmethod
    def _acp_names(cls, value: dict[str, AcpAgent]) -> dict[str, AcpAgent]:
        return check_names(value)
