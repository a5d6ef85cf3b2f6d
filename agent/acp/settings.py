"""Settings of the coding agents the lead may delegate to over ACP (docs/coding-agents.md).

Each entry names the command that starts an agent's ACP adapter (``npx
@zed-industries/claude-code-acp``, ``codex-acp``, any ACP agent speaking JSON-RPC on stdio). The
gateway's config.yaml embeds them under ``agent.acp_agents``; nothing here reads files or the
environment (``$VAR`` in a value is expanded by the config loader).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_RESERVED_ENV = frozenset({"PATH", "HOME", "LANG"})


class AcpAgent(BaseModel):
    """One external coding agent, started inside the conversation's sandbox for each delegation."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1)
    """The adapter's executable as the sandbox sees it (e.g. ``/usr/bin/npx``, or a path under
    ``/mnt/user-data/workspace``): it runs inside the sandbox, so a host-only path is not found."""
    args: list[str] = Field(default_factory=list)
    env: dict[str, SecretStr] = Field(default_factory=dict)
    """The agent's whole environment besides PATH, HOME and LANG (e.g. its own
    ``ANTHROPIC_API_KEY: $ANTHROPIC_API_KEY``). Given to this agent's process only: never to the
    sandbox's other commands, never logged (the values are masked wherever the daemon's secrets are)."""
    description: str = Field("", max_length=300)
    """What the agent is good at, shown to the lead model in the tool's description."""
    network: bool = False
    """Let the agent's sandbox reach the network (its model API needs it). Off by default: with
    it on, the agent (and whatever a prompt talks it into) can send the workspace anywhere;
    the host's files and the daemon's secrets stay out of reach either way."""
    timeout: float = Field(900.0, gt=0, le=86_400)
    """Wall-clock seconds of one delegation, start-up included; then the session is cancelled
    and its processes killed, and the model gets a tool error saying so."""
    init_timeout: float = Field(60.0, gt=0)
    """Seconds the adapter may take to answer ``initialize`` and ``session/new``."""
    memory_mb: int | None = Field(None, ge=256)
    """Address-space limit of the agent's processes (local provider); default the sandbox's
    ``limits.memory_mb``. Node-based adapters reserve much virtual memory: 4096 is a safe start."""
    max_updates: int = Field(2000, ge=10)
    """Streamed updates one delegation may send; more ends it as flooding."""
    max_permission_requests: int = Field(20, ge=1)
    """Permission requests one delegation may make. They are asked one at a time (one set of
    approval buttons in the chat at once, however many the agent sends together); one more than
    this ends the session as flooding."""
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024)
    """Largest single protocol message read from the agent (a line of JSON)."""
    max_file_bytes: int = Field(2 * 1024 * 1024, ge=1024)
    """Largest file the agent may read or write through the client's ``fs`` methods."""
    max_result_chars: int = Field(20_000, ge=500)
    """Characters of the agent's final answer handed to the model (the rest is cut, marked)."""
    progress_interval: float = Field(2.0, ge=0.2)
    """Seconds between two progress lines in the chat (updates in between are folded)."""

    @field_validator("env")
    @classmethod
    def _names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name in value:
            if not _ENV_NAME.match(name) or name in _RESERVED_ENV:
                raise ValueError(f"environment name {name!r} is not allowed (PATH, HOME and LANG are set)")
        return value

    def secrets(self) -> list[str]:
        return [v.get_secret_value() for v in self.env.values() if len(v.get_secret_value()) >= 6]


def check_names(agents: dict[str, AcpAgent]) -> dict[str, AcpAgent]:
    """Agent names are what the model passes to the tool: short, plain identifiers."""
    for name in agents:
        if not AGENT_NAME.match(name):
            raise ValueError(f"acp_agents: name {name!r} must be letters, digits, '-' or '_' (max 32)")
    return agents
