"""Sandbox settings. The gateway's config embeds them; nothing here reads files or the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_ROOT = Path("sandboxes")
"""The one default sandbox root. Relative: the daemon resolves it against the storage path
(``storage.path``, default ``data``, so ``data/sandboxes``); a provider used on its own resolves it
against the working directory."""


class SandboxLimits(BaseModel):
    """Resource limits of one sandbox. The local provider applies them with rlimits (per process;
    the process count per sandbox, inside its own user namespace); Docker applies them per
    container. The disk quota is measured on the host for both (quota.py)."""

    model_config = ConfigDict(extra="forbid")

    memory_mb: int = Field(1024, ge=64)
    """Docker: container memory (and swap) limit. Local: address-space limit per process."""
    cpus: float = Field(1.0, gt=0)
    """Docker only: CPU share of the container."""
    pids: int = Field(256, ge=8)
    """Maximum processes/threads of one sandbox (Docker: the container's pids cgroup; local:
    RLIMIT_NPROC set inside the sandbox's own user namespace, so sandboxes never share it)."""
    file_size_mb: int = Field(1024, ge=1)
    """Largest file a sandboxed process may write (RLIMIT_FSIZE; never above ``disk_mb``)."""
    cpu_seconds: int = Field(600, ge=1)
    """Local only: CPU time per process (RLIMIT_CPU); the wall-clock timeout still applies."""
    open_files: int = Field(1024, ge=64)
    tmp_size_mb: int = Field(256, ge=1)
    """Size of the tmpfs mounted at /tmp."""
    disk_mb: int = Field(1024, ge=1)
    """Disk quota of one thread: workspace + uploads + outputs (allocated blocks). Commands and
    writes are refused at the quota, and a running command is killed when it crosses it."""
    disk_files: int = Field(100_000, ge=100)
    """Files and directories one thread may hold; also bounds the cost of measuring its usage."""


class DockerSettings(BaseModel):
    """Settings of the ``docker`` provider only."""

    model_config = ConfigDict(extra="forbid")

    shared: bool = False
    """Several daemons, one engine: each thread's files live in a named volume on the engine
    (``DOCKER_HOST``) and its container is found by name, so whichever daemon runs a turn sees
    the files of the last one; file tools go through the engine. See docs/scale-out.md."""


class KubernetesSettings(BaseModel):
    """Settings of the ``kubernetes`` provider only (docs/scale-out.md, "Kubernetes")."""

    model_config = ConfigDict(extra="forbid")

    kubeconfig: Path | None = None
    """Kubeconfig file; unset: the ``KUBECONFIG`` environment variable, else the pod's own
    service account (in-cluster)."""
    context: str | None = None
    """Context of the kubeconfig; unset: its current context."""
    namespace: str = Field("chital-sandboxes", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    """The one namespace of every sandbox pod, claim and NetworkPolicy (the daemons' Role is
    scoped to it)."""
    image: str | None = None
    """The sandbox image as the cluster's nodes pull it; unset: ``agent.sandbox.image``."""
    runtime_class: str | None = None
    """RuntimeClass of the pods (e.g. ``gvisor``): a second kernel boundary where the cluster
    offers one."""
    storage_class: str | None = None
    """StorageClass of the per-thread claims; unset: the cluster's default."""
    volume_size: str = Field("1Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)?$")
    """Size requested for each thread's claim; the disk quota (``limits.disk_mb``) is what
    Chital enforces inside it."""
    start_timeout: float = Field(120.0, gt=0)
    """Seconds to wait for a pod to be Running and ready (an image pull counts)."""


class SandboxSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    provider: Literal["local", "docker", "kubernetes"] = "local"
    root: Path = DEFAULT_ROOT
    """Host dir holding ``threads/<safe thread id>/{workspace,uploads,outputs}``; relative paths are
    taken from the storage path (see ``DEFAULT_ROOT``)."""
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
    uid_range: tuple[int, int] | None = None
    """``[first, count]``: as root, give every thread its own host uid (and gid) from this range
    instead of ``uid``/``gid``, kept as the owner of the thread's dir. Off by default; see
    docs/sandbox.md ("Process limits and host uids")."""
    min_free_mb: int = Field(512, ge=0)
    """Free space kept on the filesystem of ``root`` (by default also the databases' disk): a
    command is refused, or killed, and a write refused, when it would leave less."""
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    allow_unsandboxed: bool = False
    """Local provider without bubblewrap: run commands directly on the host. Never in production."""
    image: str = "chital-sandbox:latest"
    network: bool = False
    """Docker: give containers a network (bridge) instead of none. Kubernetes: a NetworkPolicy
    allowing egress instead of one denying it (ingress is denied either way)."""
    docker: DockerSettings = Field(default_factory=DockerSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)

    @field_validator("uid_range")
    @classmethod
    def _range_is_sane(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None:
            first, count = value
            if first < 1000 or count < 1 or first + count > 2**31 - 1:
                raise ValueError("uid_range is [first uid >= 1000, count >= 1], below 2^31")
        return value

    @model_validator(mode="after")
    def _shared_needs_docker(self) -> SandboxSettings:
        if self.docker.shared and self.uid_range is not None:
            raise ValueError("agent.sandbox.docker.shared does not support uid_range (one uid per volume)")
        if self.provider == "kubernetes" and self.uid_range is not None:
            raise ValueError("the kubernetes sandbox provider does not support uid_range (one uid per claim)")
        return self
