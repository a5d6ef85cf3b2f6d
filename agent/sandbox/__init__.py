"""Per-thread sandboxes: the agent's virtual filesystem and command execution.

Knows nothing of chat platforms or the gateway. Entry point: ``create_provider(settings)``.
"""

from __future__ import annotations

from .base import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxProvider,
    SandboxUnavailable,
)
from .config import SandboxLimits, SandboxSettings
from .files import Entry, GrepMatch, TextWindow
from .paths import (
    OUTPUTS,
    SKILLS,
    UPLOADS,
    USER_DATA,
    WORKSPACE,
    PathMapper,
    PathRefused,
    SandboxError,
    ThreadDirs,
)
from .quota import QuotaExceeded, check_room

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_TIMEOUT",
    "OUTPUTS",
    "SKILLS",
    "UPLOADS",
    "USER_DATA",
    "WORKSPACE",
    "Entry",
    "ExecResult",
    "GrepMatch",
    "OutputCap",
    "PathMapper",
    "PathRefused",
    "QuotaExceeded",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxProvider",
    "SandboxSettings",
    "SandboxUnavailable",
    "TextWindow",
    "ThreadDirs",
    "check_room",
    "create_provider",
]


def create_provider(settings: SandboxSettings) -> SandboxProvider:
    """The provider ``settings.provider`` names. Docker and Kubernetes are imported lazily (their
    clients cost memory a daemon that does not use them should not pay)."""
    if settings.provider == "kubernetes":
        from .kubernetes_provider import KubernetesProvider

        return KubernetesProvider(
            settings.root,
            settings.kubernetes,
            image=settings.image,
            limits=settings.limits,
            uid=settings.uid,
            gid=settings.gid,
            idle_timeout=settings.idle_timeout,
            network=settings.network,
            skills_dir=settings.skills_dir,
        )
    if settings.provider == "docker" and settings.docker.shared:
        from .docker_shared import SharedDockerProvider

        return SharedDockerProvider(
            settings.root,
            settings.skills_dir,
            image=settings.image,
            limits=settings.limits,
            uid=settings.uid,
            gid=settings.gid,
            idle_timeout=settings.idle_timeout,
            network=settings.network,
        )
    if settings.provider == "docker":
        from .docker_provider import DockerProvider

        return DockerProvider(
            settings.root,
            settings.skills_dir,
            image=settings.image,
            limits=settings.limits,
            uid=settings.uid,
            gid=settings.gid,
            idle_timeout=settings.idle_timeout,
            network=settings.network,
            min_free_mb=settings.min_free_mb,
            uid_range=settings.uid_range,
        )
    from .local import LocalProvider

    return LocalProvider(
        settings.root,
        settings.skills_dir,
        limits=settings.limits,
        uid=settings.uid,
        gid=settings.gid,
        idle_timeout=settings.idle_timeout,
        allow_unsandboxed=settings.allow_unsandboxed,
        min_free_mb=settings.min_free_mb,
        uid_range=settings.uid_range,
    )
