"""Sandbox settings. The gateway's config embeds them; nothing here reads files or the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SandboxLimits(BaseModel):
    """Resource limits of one sandbox. The local provider applies them with rlimits (per
    process, and the process count per host uid); Docker applies them per container."""

    model_config = ConfigDict(extra="forbid")

    memory_mb: int = Field(1024, ge=64)
    """Docker: container memory (and swap) limit. Local: address-space limit per process."""
    cpus: float = Field(1.0, gt=0)
    """Docker only: CPU share of the container."""
    pids: int = Field(256, ge=8)
    """Maximum processes/threads (Docker: per container; local: RLIMIT_NPROC)."""
    file_size_mb: int = Field(1024, ge=1)
    """Largest file a sandboxed process may write."""
    cpu_seconds: int = Field(600, ge=1)
    """Local only: CPU time per process (RLIMIT_CPU); the wall-clock timeout still applies."""
    open_files: int = Field(1024, ge=64)
    tmp_size_mb: int = Field(256, ge=1)
    """Size of the tmpfs mounted at /tmp."""


class SandboxSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    provider: Literal["local", "docker"] = "local"
    root: Path = Path("data/sandboxes")
    """Host dir holding ``threads/<safe thread id>/{workspace,uploads,outputs}``."""
    skills_dir: Path | None = None
    """Host dir mounted read-only at /mnt/skills."""
    exec_timeout: float = Field(120.0, gt=0)
    """Default wall-clock seconds of one command."""
    max_output: int = Field(64 * 1024, ge=1024)
    """Bytes of command output kept (head and tail); the rest is replaced by a marker."""
    idle_timeout: float = Field(1800.0, gt=0)
    """Seconds a sandbox may sit unused before the reaper stops it."""
    uid: int = Field(1000, ge=1)
    gid: int = Field(1000, ge=1)
    """Unprivileged ids sandboxed code runs as (Docker; local when the daemon runs as root)."""
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    allow_unsandboxed: bool = False
    """Local provider without bubblewrap: run commands directly on the host. Never in production."""
    image: str = "chital-sandbox:latest"
    network: bool = False
    """Docker: give containers a network (bridge) instead of none."""
