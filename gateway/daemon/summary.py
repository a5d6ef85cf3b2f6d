"""The start-up summary: one short block in the log saying what this daemon actually runs.

Read from the live objects, not from the configuration's spelling: the channels' supervised states,
the harness the daemon opened (an :class:`~gateway.daemon.agent_setup.UnconfiguredHarness` when the
model could not be set up), the sandbox provider the agent runtime created (and, for bubblewrap, a real
sandboxed ``true`` run the way the sandbox runs it), the root logger's handlers, the HTTP socket bound.

A sandbox that does not isolate is said loudly, at WARNING (so it also shows in ``chital status``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from channels.base import ChannelState
from gateway.agent_api import AgentHarness
from gateway.store.connection import SQLITE

if TYPE_CHECKING:
    from agent.runtime import AgentRuntime
    from gateway.daemon.app import Daemon

log = logging.getLogger("gateway.daemon.summary")

Line = tuple[int, str]
"""(logging level, text) of one line of the summary."""

SETTLE_SECONDS = 10.0
PROBE_TIMEOUT = 10.0


async def settle(daemon: Daemon, wait: float = SETTLE_SECONDS) -> None:
    """Wait until no channel is still STARTING (at most ``wait`` seconds): the summary then says
    which channels are up, not that they are all starting."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if all(s.channel.state is not ChannelState.STARTING for s in daemon.supervisors):
            return
        await asyncio.sleep(0.1)


def channel_lines(report: dict[str, dict[str, object]]) -> list[Line]:
    lines: list[Line] = []
    for name, info in sorted(report.items()):
        state, reason = str(info.get("state")), info.get("reason")
        if state == ChannelState.DISABLED.value:
            lines.append((logging.INFO, f"  channel {name:<9} off: {reason}"))
        elif state == ChannelState.CONNECTED.value:
            lines.append((logging.INFO, f"  channel {name:<9} connected"))
        else:
            trouble = (ChannelState.RECONNECTING.value, ChannelState.FAILED.value, ChannelState.STOPPED.value)
            level = logging.WARNING if state in trouble else logging.INFO  # starting, a cluster's standby
            lines.append((level, f"  channel {name:<9} {state}" + (f": {reason}" if reason else "")))
    if all(info.get("state") == ChannelState.DISABLED.value for info in report.values()):
        lines.append((logging.WARNING, "  channels: none is on (only `chital chat` talks to the agent)"))
    return lines


def endpoint(base_url: object) -> str:
    """``host[:port]`` of a model's base URL: never its path, query or user:password part."""
    if not isinstance(base_url, str) or not base_url:
        return "the provider's default endpoint"
    parts = urlsplit(base_url)
    host = parts.hostname or "?"
    return f"{host}:{parts.port}" if parts.port else host


def model_line(daemon: Daemon) -> Line:
    from gateway.daemon.agent_setup import UnconfiguredHarness

    spec = daemon.config.model_spec()
    harness = daemon.harness
    if harness is None or isinstance(harness, UnconfiguredHarness):
        reason = harness.reason if harness is not None else "not started"
        return logging.WARNING, f"  model     NOT CONFIGURED ({spec.name}): {reason}"
    kwargs = spec.kwargs()
    model_id = kwargs.get("model") or kwargs.get("model_name") or harness.model_name
    where = endpoint(kwargs.get("base_url") or kwargs.get("openai_api_base"))
    return logging.INFO, f"  model     {spec.name}: {model_id} at {where} ({spec.use})"


async def bwrap_problem(bwrap: str, run_as: tuple[int, int] | None) -> str | None:
    """Run ``true`` under bubblewrap with the namespaces the sandbox unshares, as the user sandboxed
    commands run as; None when it works, else why not (bwrap's own first line)."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
            "true"]  # fmt: skip
    extra: dict[str, object] = {}
    if run_as is not None:
        extra = {"user": run_as[0], "group": run_as[1], "extra_groups": []}
    try:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            **extra,  # type: ignore[arg-type]
        )
    except OSError as exc:
        return f"cannot run {bwrap}: {exc.strerror or exc}"
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            _, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"a test run did not finish in {PROBE_TIMEOUT:.0f}s"
    if proc.returncode == 0:
        return None
    first = (err.decode(errors="replace").strip().splitlines() or [f"exit status {proc.returncode}"])[0]
    return first[:200]


def runtime_of(harness: AgentHarness | None) -> AgentRuntime | None:
    """The agent runtime behind ``harness``; None for the stand-in of an unconfigured model (then
    the agent stack, never imported, stays so)."""
    from gateway.daemon.agent_setup import UnconfiguredHarness

    if harness is None or isinstance(harness, UnconfiguredHarness):
        return None
    from agent.runtime import AgentRuntime

    return harness if isinstance(harness, AgentRuntime) else None


async def sandbox_line(runtime: AgentRuntime | None, configured: str) -> Line:
    """Which provider the runtime created, and whether it really isolates the agent's commands."""
    if runtime is None:
        # Not a sandbox fault: the agent (which creates the sandbox) waits for its model, and the
        # model line above says why at WARNING. A second warning here misled operators.
        return (
            logging.INFO,
            "  sandbox   not started yet: the agent creates it once its model is set up (above)",
        )
    if not runtime.settings.tools:
        return logging.INFO, "  sandbox   none: agent.tools is off (the agent chats, runs no commands)"
    provider = runtime.provider
    if provider is None:
        return logging.WARNING, (
            f"  sandbox   NONE: the {configured} provider is not usable: "
            f"{runtime.sandbox_state().detail}; the agent cannot run commands"
        )
    from agent.sandbox.local import LocalProvider

    if isinstance(provider, LocalProvider):
        uid = f"uid {provider.run_as[0]}" if provider.run_as else "the daemon's own uid"
        if provider.bwrap is None:
            if provider.allow_unsandboxed:
                return logging.WARNING, (
                    "  sandbox   local WITHOUT bubblewrap: NOT ISOLATING. The agent's commands run "
                    f"directly on this host as {uid} (agent.sandbox.allow_unsandboxed is on); "
                    "install bubblewrap or use the docker provider"
                )
            return logging.WARNING, (
                "  sandbox   local, bubblewrap NOT INSTALLED: the agent's commands are refused "
                "(apt-get install bubblewrap, or use the docker provider)"
            )
        problem = await bwrap_problem(provider.bwrap, provider.run_as)
        if problem is not None:
            return logging.WARNING, (
                f"  sandbox   local, bubblewrap {provider.bwrap} CANNOT ISOLATE here: {problem}; "
                "the agent's commands will fail (docs/sandbox.md, docs/deploy.md)"
            )
        return (
            logging.INFO,
            f"  sandbox   local, bubblewrap {provider.bwrap}: isolating (commands run as {uid})",
        )
    from agent.sandbox.docker_provider import DockerProvider
    from agent.sandbox.docker_shared import SharedDockerProvider

    if isinstance(provider, SharedDockerProvider):
        return logging.INFO, (
            f"  sandbox   docker (shared engine), image {provider.image}, network {provider.network}: "
            "isolating (one container and volume per conversation, found by every daemon)"
        )
    if isinstance(provider, DockerProvider):
        return logging.INFO, (
            f"  sandbox   docker, image {provider.image}, network {provider.network}: isolating "
            "(one container per conversation)"
        )
    return logging.INFO, f"  sandbox   {type(provider).__name__}"


def log_destinations(handlers: Sequence[logging.Handler]) -> str:
    where: list[str] = []
    for handler in handlers:
        if isinstance(handler, logging.FileHandler):
            where.append(handler.baseFilename)
        elif isinstance(handler, logging.StreamHandler):
            stream = handler.stream
            where.append(
                "stderr" if stream is sys.stderr else "stdout" if stream is sys.stdout else str(stream)
            )
    return ", ".join(where) or "nowhere (no log handler)"


async def summary(daemon: Daemon) -> list[Line]:
    cfg = daemon.config
    runtime = runtime_of(daemon.harness)
    sandbox_root = runtime.sandbox_root if runtime is not None and runtime.settings.tools else "(none)"
    lines: list[Line] = [(logging.INFO, f"chital is up (pid {daemon.pid}):")]
    lines += channel_lines(daemon.channel_report())
    lines.append(model_line(daemon))
    lines.append(await sandbox_line(runtime, cfg.agent.sandbox.provider))
    store = daemon.store
    if store is None:
        database = "not open"
    elif store.dialect == SQLITE:
        database = str(store.path)
    else:  # the server's host, port and database name (the URL's user and password cut off)
        database = f"{store.dialect} at {store.path}"
    lines.append(
        (logging.INFO, f"  data      {cfg.storage.path}; database {database}; sandboxes {sandbox_root}")
    )
    lines.append((logging.INFO, f"  logs      {log_destinations(logging.getLogger().handlers)}"))
    if daemon.http_port is not None:
        host = cfg.http.host
        shown = f"[{host}]" if ":" in host else host
        lines.append(
            (logging.INFO, f"  http      http://{shown}:{daemon.http_port}/ (healthz, readyz, metrics)")
        )
    else:
        lines.append((logging.INFO, "  http      off (http.enabled is false)"))
    if daemon.hooks_port is not None:
        shown = f"[{cfg.hooks.host}]" if ":" in cfg.hooks.host else cfg.hooks.host
        lines.append(
            (logging.INFO, f"  hooks     http://{shown}:{daemon.hooks_port}/hooks/<name> (docs/hooks.md)")
        )
    if daemon.status_server is not None:
        lines.append((logging.INFO, f"  status    `chital status` (socket {daemon.status_server.path})"))
    return lines


async def log_summary(daemon: Daemon) -> None:
    """Wait for the channels to settle, then log the summary, line by line."""
    await settle(daemon)
    for level, text in await summary(daemon):
        log.log(level, "%s", text)
