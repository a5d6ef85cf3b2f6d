"""Does the sandbox isolate? Answered by running one real command in it, never by looking for files.

Why: finding ``bwrap`` on the PATH said "fine" while every command then failed: in a container
started without the ``unconfined`` options bubblewrap cannot create its namespaces, and as root
with the data under ``/root`` (0700) the sandbox uid cannot reach its own directories. Both show
only when a command runs, so ``chital check`` and the daemon's start-up run one (the same
provider, settings and thread directories as a conversation's) and report what came back.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from pathlib import Path

from .base import SandboxProvider
from .paths import SandboxError, ThreadDirs

PROBE_THREAD = "chital-sandbox-check"
"""The thread id the probe runs under: its own directory under the root, never a conversation's."""
PROBE_TEXT = "chital-sandbox-ok"
PROBE_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class SandboxState:
    """The sandbox as the agent will find it: ``state`` is ``ready``, ``unsandboxed`` (commands
    run on the host: ``allow_unsandboxed``), ``failed`` or ``off`` (``agent.tools: false``)."""

    state: str
    detail: str

    @property
    def ok(self) -> bool:
        return self.state in ("ready", "off")

    def as_dict(self) -> dict[str, str]:
        return {"state": self.state, "detail": self.detail}


def _first_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else "(no output)"
    return line if len(line) <= limit else line[: limit - 1] + "…"


async def run_probe(provider: SandboxProvider, timeout: float = PROBE_TIMEOUT) -> str | None:  # noqa: ASYNC109
    """None when a command ran in ``provider``'s sandbox and printed what it was told to; else
    one line saying what went wrong (bubblewrap's own complaint, a directory the sandbox uid
    cannot reach...)."""
    try:
        sandbox = await provider.acquire(PROBE_THREAD)
        try:
            res = await sandbox.exec(f"echo {PROBE_TEXT}", timeout=timeout)
        finally:
            await provider.release(PROBE_THREAD)
            # Nothing of the probe stays: no container, no thread directory beside users' own.
            await provider.discard(PROBE_THREAD)
            await asyncio.to_thread(shutil.rmtree, sandbox.dirs.base, True)
    except SandboxError as exc:
        return str(exc)
    except OSError as exc:
        return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
    if res.exit_code == 0 and res.output.strip() == PROBE_TEXT:
        return None
    if res.timed_out:
        return f"a test command did not finish within {timeout:g}s"
    return f"a test command failed (exit code {res.exit_code}): {_first_line(res.output)}"


def remove_probe_dirs(root: Path) -> None:
    """Delete the probe thread's directories under ``root`` (``chital check`` leaves nothing)."""
    shutil.rmtree(ThreadDirs.for_thread(root, PROBE_THREAD, None).base, ignore_errors=True)


async def close_quietly(provider: SandboxProvider) -> None:
    try:
        async with asyncio.timeout(30):
            await provider.close()
    except Exception:  # the probe's answer is what matters; a close failure changes nothing
        return
