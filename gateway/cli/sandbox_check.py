"""The sandbox as ``chital check`` and ``chital init`` see it: one real command run in it.

``check`` builds the provider the daemon would build (same settings, same root) and runs a
command through it (agent/sandbox/probe.py); a failure fails the check. What the probe had to
create (a root that did not exist yet) is removed again, so a check leaves the disk as it was.

``init`` as root also picks a sandbox root the sandbox uid can reach: the README's layout puts
the config, and so the data directory, under ``/root`` (0700), which the unprivileged uid that
sandboxed code runs as cannot pass through (docs/sandbox.md, "Where the root lives").
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from pathlib import Path

from agent.sandbox.owners import traversal_problem
from agent.sandbox.probe import SandboxState, close_quietly, remove_probe_dirs, run_probe
from gateway.config.schema import Config

SHARED_ROOT = Path("/var/lib/chital")
"""Where ``init`` puts the sandbox root when the data directory is out of the sandbox uid's reach:
a system directory every user may pass through, outside any home."""


def sandbox_root(cfg: Config) -> Path:
    """``agent.sandbox.root`` as the daemon resolves it (relative: under ``storage.path``)."""
    root = cfg.agent.sandbox.root
    return root if root.is_absolute() else cfg.storage.path / root


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` that does not exist yet (None: it all exists)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            break
        missing = p
    return missing


def check_sandbox(cfg: Config) -> SandboxState:
    """Build the configured provider and run one command in it (blocking: call from the CLI)."""
    from agent.sandbox import SandboxError, create_provider

    s = cfg.agent.sandbox
    if not cfg.agent.tools:
        return SandboxState("off", "none (agent.tools: false)")
    root = sandbox_root(cfg)
    created = _first_missing(root)

    async def probe() -> SandboxState:
        try:
            provider = create_provider(s.model_copy(update={"root": root, "skills_dir": None}))
        except SandboxError as exc:
            return SandboxState("failed", f"{s.provider}: {exc}")
        except OSError as exc:
            return SandboxState("failed", f"{s.provider}: cannot prepare {root}: {exc.strerror or exc}")
        try:
            problem = await run_probe(provider)
        finally:
            await close_quietly(provider)
        if problem is not None:
            return SandboxState("failed", f"{s.provider}: {problem}")
        if s.provider == "docker":
            return SandboxState("ready", f"docker, image {s.image}: a test command ran in a container")
        if s.provider == "kubernetes":
            where = f"namespace {s.kubernetes.namespace}"
            return SandboxState("ready", f"kubernetes, {where}: a test command ran in a pod")
        bwrap = getattr(provider, "bwrap", None)
        if bwrap is None:
            return SandboxState(
                "unsandboxed",
                "local, bubblewrap is not installed and allow_unsandboxed is on: commands run"
                " UNSANDBOXED on this host. Install it: `sudo apt-get install bubblewrap`",
            )
        return SandboxState("ready", f"local, bubblewrap {bwrap}: a test command ran isolated in {root}")

    try:
        return asyncio.run(probe())
    finally:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        else:
            remove_probe_dirs(root)


def fix_for(state: SandboxState) -> str:
    """What to do about a failed sandbox, in one sentence."""
    if "bubblewrap" in state.detail and "not installed" in state.detail:
        return (
            "install bubblewrap (`sudo apt-get install bubblewrap`, or `sudo bash scripts/setup.sh`),"
            " or set agent.sandbox.provider: docker"
        )
    if "cannot reach" in state.detail:
        return f"set agent.sandbox.root to a directory outside your home, e.g. {SHARED_ROOT / 'sandboxes'}"
    if "namespace" in state.detail or "bwrap" in state.detail:
        return (
            "bubblewrap cannot create namespaces here: in Docker, start the container with the"
            " security options of compose.yaml; on Ubuntu 24.04 allow unprivileged user namespaces"
            " (docs/sandbox.md)"
        )
    return "see docs/sandbox.md"


def root_for_init(data_dir: Path) -> Path | None:
    """As root, where ``init`` should put the sandbox root: None when the default (under
    ``data_dir``) is reachable by the sandbox uid, else a directory under :data:`SHARED_ROOT`,
    one per data directory (two daemons never share a root)."""
    from agent.sandbox.config import SandboxSettings

    if os.geteuid() != 0:
        return None  # sandboxed code runs as the daemon's own uid: it reaches what the daemon does
    settings = SandboxSettings()
    existing = next(p for p in (data_dir, *data_dir.parents) if p.exists())
    if traversal_problem(existing, settings.uid, settings.gid) is None:
        return None
    plain = SHARED_ROOT / "sandboxes"
    if not plain.exists():
        return plain
    return SHARED_ROOT / f"sandboxes-{hashlib.sha256(str(data_dir).encode()).hexdigest()[:8]}"
