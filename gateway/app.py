"""The daemon's lifecycle: start the store, the harness, the channels and the HTTP endpoint; on SIGTERM
drain running turns within the grace period, then close everything in reverse order."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from typing import Any

from aiohttp import web

from agent.events import OutputFile, TurnFailed
from channels.base import Channel, ChannelState

from .config import Config
from .core import Gateway
from .http import build_app, describe_state
from .metrics import Metrics
from .registry import build_channels
from .store import Store
from .supervisor import ChannelSupervisor

log = logging.getLogger(__name__)


class UnconfiguredHarness:
    """Stands in when the model cannot be set up (no API key...), so the daemon still starts and every
    message gets a clear answer instead of silence."""

    def __init__(self, reason: str, model_name: str = "(not configured)") -> None:
        self.reason = reason
        self.model_name = model_name

    async def run(self, thread_id: str, **_: Any) -> Any:
        yield TurnFailed(f"The model is not configured: {self.reason}")

    async def message_count(self, thread_id: str) -> int:
        return 0

    async def save_upload(self, thread_id: str, name: str, data: bytes) -> str:
        raise RuntimeError(f"the agent is not configured ({self.reason})")

    async def read_output(self, thread_id: str, path: str, max_bytes: int) -> OutputFile:
        raise RuntimeError(f"the agent is not configured ({self.reason})")

    async def close(self) -> None:
        return None


async def open_harness(config: Config) -> Any:
    """The agent runtime, or an :class:`UnconfiguredHarness` explaining why not."""
    from agent.runtime import AgentRuntime

    spec = config.model_spec()
    if spec.use.startswith("langchain_openai:") and not (
        spec.kwargs().get("api_key") or os.environ.get("OPENAI_API_KEY")
    ):
        index = config.models.index(spec)
        reason = f"no API key: set OPENAI_API_KEY (or models[{index}].api_key in config.yaml)"
        log.error("the agent's model %r is not configured: %s", spec.name, reason)
        return UnconfiguredHarness(reason)
    runtime = AgentRuntime(config.agent, spec, config.storage.path)
    try:
        await runtime.start()
        return runtime
    except Exception as exc:  # the message of a config error, never the key itself
        with contextlib.suppress(Exception):
            await runtime.close()
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        log.error("the agent could not be set up: %s", reason, exc_info=True)
        return UnconfiguredHarness(reason)


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.store: Store | None = None
        self.harness: Any = None
        self.gateway: Gateway | None = None
        self.supervisors: list[ChannelSupervisor] = []
        self.off: dict[str, str] = {}
        self._runner: web.AppRunner | None = None
        self._resumed: set[str] = set()
        self.http_port: int | None = None

    # -- status ---------------------------------------------------------------------------------
    def channel_report(self) -> dict[str, dict[str, object]]:
        report = {
            s.channel.name: describe_state(s.channel.state, s.channel.reason, s.channel.state_since)
            for s in self.supervisors
        }
        for name, why in self.off.items():
            report[name] = {"state": ChannelState.DISABLED.value, "reason": why}
        return report

    def ready(self) -> bool:
        return self.store is not None and all(
            s.channel.state is ChannelState.CONNECTED for s in self.supervisors
        )

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        cfg.storage.path.mkdir(parents=True, exist_ok=True)
        self.store = await Store.open(cfg.storage.path / "gateway.sqlite", cfg.storage.reserve_mb << 20)
        self.harness = await open_harness(cfg)
        self.gateway = Gateway(cfg, self.store, self.harness, self.metrics)
        channels, self.off = build_channels(cfg)
        for name, why in self.off.items():
            log.info("channel %s is off: %s", name, why)
        for channel in channels:
            sink = self.gateway.attach(channel)
            channel.add_status_listener(self._on_channel_state)
            self.supervisors.append(ChannelSupervisor(channel, sink, self.metrics))
        if cfg.http.enabled:
            await self._start_http()
        for sup in self.supervisors:
            sup.start()
        if not self.supervisors:
            log.warning("no chat channel is on; the daemon serves only /healthz and `chital chat`")
        # The start-up heap (a couple of thousand modules) never becomes garbage: move it out of the
        # collector's sight, and collect less often (turns allocate many short-lived objects; the
        # default threshold runs a collection every few hundred allocations).
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 50)

    def _on_channel_state(self, channel: Channel) -> None:
        log.info(
            "channel %s: %s%s",
            channel.name,
            channel.state.value,
            f" ({channel.reason})" if channel.reason else "",
        )
        if channel.state is ChannelState.CONNECTED and channel.name not in self._resumed:
            # Resume unfinished work of this platform once it can deliver again.
            self._resumed.add(channel.name)
            assert self.gateway is not None
            asyncio.get_running_loop().create_task(self.gateway.resume(channel.name))

    async def _start_http(self) -> None:
        app = build_app(self, self.metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.http.host, self.config.http.port)
        await site.start()
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.http_port = sockets[0].getsockname()[1] if sockets else self.config.http.port
        log.info("health and metrics on http://%s:%s/", self.config.http.host, self.http_port)

    async def stop(self) -> None:
        grace = self.config.concurrency.shutdown_grace
        if self.gateway is not None:
            cut = await self.gateway.close(grace)
            if cut:
                log.warning("%d turn(s) cut off by shutdown; they resume at the next start", cut)
        for sup in self.supervisors:
            await sup.stop()
        if self.harness is not None:
            with contextlib.suppress(Exception):
                await self.harness.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self.store is not None:
            await self.store.close()
            self.store = None

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        log.info("chital is running; SIGTERM or Ctrl-C stops it")
        await stop.wait()
        log.info("stopping: draining running turns (up to %.0fs)", self.config.concurrency.shutdown_grace)
        await self.stop()
        log.info("stopped cleanly")
