"""The daemon's lifecycle: start the store, the harness, the channels and the HTTP endpoint; on SIGTERM
drain running turns within the grace period, then close everything in reverse order.

Start-up acquires in this order: the data directory (checked writable, the disk reserve held), the
HTTP endpoint (so a taken port fails in a second, before the agent stack is imported, and /healthz
answers while the rest starts), the database, the agent (gateway/daemon/agent_setup.py), the gateway,
the channels, then the background tasks. Each release is registered as its resource is acquired
(:mod:`gateway.daemon.lifecycle`): a failure at any step releases what was opened, newest first, and
ends in one :class:`StartupError` line instead of a traceback and a half-started process.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import gc
import logging
import os
import signal
import time
from pathlib import Path

from aiohttp import web

from channels.base import Channel, ChannelState
from gateway.agent_api import AgentHarness, sandbox_report
from gateway.commands.mcp import reload_mcp
from gateway.config import data_dir
from gateway.config.platforms import build_channels
from gateway.config.schema import Config
from gateway.config.secrets import redactor_for
from gateway.daemon import listeners
from gateway.daemon.agent_setup import UnconfiguredHarness, open_harness
from gateway.daemon.cluster import Cluster, Leases
from gateway.daemon.gateway import Gateway
from gateway.daemon.lifecycle import (
    Resources,
    StartupError,
    database_error,
    one_line,
    postgres_error,
    prepare_data_dir,
    vendor_check,
)
from gateway.daemon.menus import Menus
from gateway.daemon.standby import standby_leader_only
from gateway.daemon.status import RecentErrors, StatusServer, StatusUnavailable, snapshot, socket_path
from gateway.daemon.summary import log_summary, runtime_of
from gateway.daemon.timers import TimerOwner, take_timers
from gateway.ops import tracing
from gateway.ops.http import describe_state
from gateway.ops.logs import RedactingFilter
from gateway.ops.metrics import Metrics
from gateway.ops.supervisor import ChannelSupervisor
from gateway.ops.systemd import Notifier
from gateway.ops.tasks import TaskTracker, cancel_and_wait, slow_stop_reported
from gateway.store.journal import Store
from gateway.store.retention import Retention
from gateway.store.schema import known_version
from gateway.turns.usage import UsageRecorder

log = logging.getLogger(__name__)


class DaemonState(enum.StrEnum):
    """Where the daemon is in its life (``/readyz``'s and ``chital status``'s ``state``; the values
    are what they show). Only forward: new → starting → running → stopping → stopped."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.store: Store | None = None
        self.harness: AgentHarness | None = None
        self.gateway: Gateway | None = None
        self.supervisors: list[ChannelSupervisor] = []
        self.cluster: Cluster | None = None
        self.standby: set[ChannelSupervisor] = set()
        """Leader-only channels (Telegram polling, Discord's gateway) waiting for leadership."""
        self.off: dict[str, str] = {}
        self._logged_state: dict[str, ChannelState] = {}
        """The state last logged per channel: a change of reason alone is not a new event."""
        self._runner: web.AppRunner | None = None
        self.http_port: int | None = None
        self.hooks_port: int | None = None
        """The hooks' own listener (docs/hooks.md), None when no hook is configured."""
        self.retention: Retention | None = None
        self.timers: TimerOwner | None = None  # who runs approval timeouts, schedules, retention
        self.status_server: StatusServer | None = None
        """``chital status``'s Unix socket (gateway/daemon/status.py); None when it could not be opened."""
        self.recent_errors = RecentErrors(
            RedactingFilter(redactor_for(config)), type(config.channels).model_fields
        )
        self.started: float | None = None
        self.pid = os.getpid()
        self.state = DaemonState.NEW
        """new → starting → running → stopping → stopped (a failed start goes to stopped at once)."""
        self.tasks = TaskTracker()
        """The daemon's one task tracker. Each part spawns through a child of it and cancels its own
        at its moment of the shutdown; what is left at the end outlived its owner."""
        self._resources = Resources(self.tasks.child())
        self._drained = False
        self.metrics.ready.set_function(lambda: 1.0 if self.ready() else 0.0)

    # -- status ---------------------------------------------------------------------------------
    def channel_report(self) -> dict[str, dict[str, object]]:
        report = {
            s.channel.name: describe_state(s.channel.state, s.channel.reason, s.channel.state_since)
            for s in self.supervisors
        }
        for s in self.supervisors:
            if s.channel.notice:  # e.g. WhatsApp replies refused outside the 24-hour window
                report[s.channel.name]["notice"] = s.channel.notice
        for sup in self.standby:
            sends = sup.channel.can_send_only and sup.channel.state is ChannelState.CONNECTED
            report[sup.channel.name] = {
                "state": "standby",
                "reason": "another daemon is the leader" + ("; connected for sending" if sends else ""),
            }
        for name, why in self.off.items():
            report[name] = {"state": ChannelState.DISABLED.value, "reason": why}
        return report

    def agent_report(self) -> dict[str, object]:
        harness = self.harness
        if harness is None:
            return {"state": "starting", "reason": "the agent is being set up"}
        if isinstance(harness, UnconfiguredHarness):
            return {"state": "failed", "model": harness.model_name, "reason": harness.reason}
        return {"state": "ready", "model": harness.model_name}

    def sandbox_report(self) -> dict[str, str]:
        """The sandbox as the agent's start-up probe found it (a command really ran isolated, or
        why not): ``state`` ready, failed, unsandboxed, off, or starting/not started."""
        return sandbox_report(self.harness)

    def not_ready_reasons(self) -> list[str]:
        """Why ``/readyz`` says not ready, one short line per cause; empty when ready."""
        reasons: list[str] = []
        if self.cluster is not None and self.cluster.refusal is not None:
            reasons.append(f"storage: {self.cluster.refusal}")
        if self.state is not DaemonState.RUNNING:
            reasons.append(f"the daemon is {self.state}")
        agent = self.agent_report()
        if agent["state"] != "ready":
            reasons.append(f"agent: {agent['reason']}")
        if self.store is not None and self.store.disk_full:
            reasons.append(f"storage: the disk under {self.config.storage.path} is full (reserve in use)")
        for sup in self.supervisors:
            ch = sup.channel
            if sup not in self.standby and ch.state is not ChannelState.CONNECTED:
                reasons.append(
                    f"channel {ch.name}: {ch.state.value}" + (f" ({ch.reason})" if ch.reason else "")
                )
        return reasons

    def ready(self) -> bool:
        return not self.not_ready_reasons()

    def readiness(self) -> dict[str, object]:
        """The body of ``/readyz``: the verdict, why, and the state of each part."""
        reasons = self.not_ready_reasons()
        storage: dict[str, object] = {"path": str(self.config.storage.path), "open": self.store is not None}
        if self.store is not None:
            storage["disk_full"] = self.store.disk_full
            schema = self.store.schema  # as read at start, and on each lease renewal
            storage["schema"] = {"version": schema.version, "floor": schema.floor, "known": known_version()}
        if self.retention is not None and self.retention.last is not None:
            storage["last_prune_rows"] = self.retention.last.journal
        return {
            "ready": not reasons,
            "state": self.state,
            "why": reasons,
            "agent": self.agent_report(),
            "sandbox": self.sandbox_report(),
            "storage": storage,
            "channels": self.channel_report(),
        }

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Acquire everything in order. On any failure, or when cancelled (SIGTERM during start-up),
        release what was acquired, newest first; a failure ends in :class:`StartupError`."""
        if self.state is not DaemonState.NEW:
            raise RuntimeError(f"Daemon.start() called while the daemon is {self.state}")
        self.state = DaemonState.STARTING
        try:
            await self._acquire()
        except BaseException as exc:
            self.state = DaemonState.STOPPING
            await self._resources.release_all()
            await self._end_tasks()
            self.state = DaemonState.STOPPED
            if isinstance(exc, StartupError) or not isinstance(exc, Exception):
                raise
            log.debug("start-up failed", exc_info=True)
            raise StartupError(f"start-up failed: {one_line(exc)}") from exc
        self.state = DaemonState.RUNNING
        self.started = time.time()
        # The start-up heap (a couple of thousand modules) never becomes garbage: move it out of the
        # collector's sight, and collect less often (turns allocate many short-lived objects; the
        # default threshold runs a collection every few hundred allocations).
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 50)

    async def _acquire(self) -> None:
        cfg, res = self.config, self._resources
        vendor_check()
        await asyncio.to_thread(prepare_data_dir, cfg.storage.path, cfg.storage.reserve_mb << 20)
        fixed = await asyncio.to_thread(data_dir.secure, cfg)  # 0700, files 0600 (gateway/config/data_dir.py)
        if fixed:
            log.warning("%s", fixed)
        if cfg.http.enabled:
            self._runner, self.http_port = await listeners.start_http(self, self._resources)
        await self._start_status()
        res.push("tracing", await tracing.start(cfg))  # released late: the drain's spans go out too
        db_path, url = self.db_path, cfg.storage.database_url
        try:
            if url:
                self.store = await Store.open_postgres(url)
            else:
                self.store = await Store.open(db_path, cfg.storage.reserve_mb << 20)
        except Exception as exc:
            raise (postgres_error(url, exc) if url else database_error(db_path, exc)) from exc
        res.push("the database", self._close_store)
        ttls = [
            getattr(cfg.access_for(name), "pairing_code_ttl", 0.0) for name in type(cfg.channels).model_fields
        ]
        web = cfg.channels.web
        self.retention = Retention(
            self.store, cfg.storage, self.metrics, ttls, web.keep_days if web.enabled else None
        )
        try:
            await self.retention.start(prune=not url)  # PostgreSQL: the timers' owner prunes
        except Exception as exc:
            raise database_error(db_path, exc) from exc

        from gateway.schedules.clock import ScheduleClock
        from gateway.schedules.runner import GatewayScheduler

        clock = ScheduleClock()  # made first: scheduler, gateway and runner (fires, pushes) share it
        scheduler = GatewayScheduler(self.store, cfg, clock) if cfg.schedules.enabled else None
        from gateway.turns.budget import Budgets  # the agent's stack: imported as the agent is opened

        recorder = UsageRecorder(self.store, self.metrics, cfg.usage, Budgets(self.store, cfg))
        res.push("the usage records", recorder.close)  # after the agent closes, before the store
        from agent.acp.tool import PermissionRelay  # coding agents' permission requests
        from gateway.turns.background import BackgroundTasks

        acp_relay = PermissionRelay()
        background = BackgroundTasks(self.store, cfg, redactor_for(cfg))  # bound to the gateway below
        starter = background if cfg.tasks.enabled else None
        self.harness = await open_harness(cfg, scheduler, recorder, acp_relay=acp_relay, background=starter)
        res.push("the agent", self.harness.close)
        url = cfg.storage.database_url
        leases = Leases(self.store, ttl=cfg.storage.lease_seconds) if url else None  # before the gateway
        self.gateway = Gateway(
            cfg, self.store, self.harness, self.metrics, schedule_clock=clock, cluster=leases,
            tasks=self.tasks.child(),
        )  # fmt: skip
        from gateway.turns.live_approvals import ask_live

        acp_relay.target = functools.partial(ask_live, self.gateway.approvals)
        background.bind(self.gateway)
        self.gateway.runner.background = background
        self.gateway.runner.speaker.usage_settled = recorder.flushed  # speech reads the budget after
        if leases is not None and url:
            # Released after the gateway drained: its heartbeat keeps our leases while turns finish.
            self.cluster = Cluster(leases, self.gateway, url, tasks=self.tasks.child())
            res.push("the cluster", self.cluster.close)
        res.push("the gateway", self._close_gateway)

        self.menus = Menus(cfg, self.store, self.tasks.child())
        res.push("the command menus", self.menus.close)
        channels, self.off = build_channels(cfg, self.store)  # the summary says which are off and why
        for channel in channels:
            sink = self.gateway.attach(channel)
            channel.add_status_listener(self._on_channel_state)
            self.menus.watch(channel)  # its native command menu (gateway/daemon/menus.py)
            sup = ChannelSupervisor(channel, sink, self.metrics, tasks=self.tasks.child())
            self.supervisors.append(sup)
            res.push(f"channel {channel.name}", sup.close)
        if self.cluster is not None:
            standby_leader_only(self.supervisors, self.standby, self.cluster)
            self.cluster.on_refuse.append(self._close_channels)
        for sup in self.supervisors:
            if sup not in self.standby:
                sup.start()  # (send-only standbys were started by standby_leader_only)
        self.timers, runner = await take_timers(self, clock, scheduler)  # before the cluster's first lead
        res.push("the timers", self.timers.close)
        if (runtime := runtime_of(self.harness)) is not None and runtime.provider is not None:
            timers = self.timers  # sandboxes on a shared engine: reaped by the timers' owner alone
            runtime.provider.reap_gate = lambda: timers.owned
        if self.cluster is not None:
            self.cluster.start()
        if cfg.hooks.hooks or any(ch.web_routes() for ch in channels):
            # hooks, and the webhooks of platforms that call us
            self.hooks_port = await listeners.start_hooks(self, self._resources)
        res.spawn(runner.run(), "pushes")
        res.spawn(log_summary(self), "startup-summary")

    @property
    def db_path(self) -> Path:
        return self.config.storage.path / "gateway.sqlite"

    async def _start_status(self) -> None:
        """Recent errors are kept from here on; ``chital status`` reaches them on the socket."""
        root = logging.getLogger()
        root.addHandler(self.recent_errors)
        self._resources.push("the recent-errors log", self._drop_recent_errors)
        server = StatusServer(
            socket_path(self.config.storage.path),
            lambda: snapshot(self, self.recent_errors),
            redactor_for(self.config),
        )
        try:
            await server.start()
        except StatusUnavailable as exc:
            log.warning("%s; `chital status` will not reach this daemon", exc)
            return
        self.status_server = server
        self._resources.push("the status socket", server.close)

    async def _drop_recent_errors(self) -> None:
        logging.getLogger().removeHandler(self.recent_errors)

    async def _close_store(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            await store.close()

    async def _close_channels(self) -> None:
        """For good, the daemon staying up (its schema is too old to write, gateway/daemon/cluster.py):
        their platforms then deliver to the other daemons. The shutdown's release closes them again."""
        for sup in self.supervisors:
            await sup.close()

    async def _close_gateway(self) -> None:
        """Released on a failed start-up, or after :meth:`stop` drained it (then nothing is left)."""
        if self.gateway is not None and not self._drained:
            self._drained = True
            await self.gateway.close(0)

    def _on_channel_state(self, channel: Channel) -> None:
        # One line per change of state. A reconnecting channel reports each step of each attempt
        # (start-up failed, connection error, retrying in…): the supervisor logs one line per
        # attempt with the delay, so repeats of the same state go to debug.
        trouble = channel.state in (ChannelState.RECONNECTING, ChannelState.FAILED)
        repeat = self._logged_state.get(channel.name) == channel.state
        self._logged_state[channel.name] = channel.state
        log.log(
            logging.DEBUG if repeat else logging.WARNING if trouble else logging.INFO,
            "channel %s: %s%s",
            channel.name,
            channel.state.value,
            f" ({channel.reason})" if channel.reason else "",
        )
        # Resuming unfinished work on every (re)connect is the gateway's own (Gateway.attach).

    async def stop(self) -> list[tuple[str, BaseException]]:
        """Drain running turns for ``shutdown_grace`` while the channels can still deliver, then
        release everything newest first. Returns the releases that failed (each is logged)."""
        if self.state in (DaemonState.STOPPING, DaemonState.STOPPED):
            return []
        if self.state is not DaemonState.RUNNING:
            raise RuntimeError(f"Daemon.stop() called while the daemon is {self.state}")
        self.state = DaemonState.STOPPING
        grace = self.config.concurrency.shutdown_grace
        if self.gateway is not None and not self._drained:
            self._drained = True
            try:
                cut = await self.gateway.close(grace)
                if cut:
                    log.warning("%d turn(s) cut off by shutdown; they resume at the next start", cut)
            except Exception as exc:
                log.error("draining the gateway failed: %s", one_line(exc))
        errors = await self._resources.release_all()
        await self._end_tasks()
        self.state = DaemonState.STOPPED
        return errors

    async def _end_tasks(self) -> None:
        """Every part has stopped its tasks; one still running outlived its owner: say which."""
        left = sorted(task.get_name() for task in self.tasks.running)
        if left:
            log.warning("background task(s) still running after shutdown, cancelled: %s", ", ".join(left))
        await self.tasks.close()

    def _reload_on_hangup(self) -> None:
        """SIGHUP: re-read the MCP servers from the config file, as an admin's ``/mcp reload``
        does (gateway/commands/mcp.py); nothing else of the config is re-applied."""
        if self.state is not DaemonState.RUNNING:
            log.warning("SIGHUP ignored: the daemon is not running yet (or stopping)")
            return

        async def reload() -> None:
            text = await reload_mcp(self.config, self.harness)
            log.info("SIGHUP: %s", text.replace("\n", "; "))

        self._resources.spawn(reload(), "mcp-reload")

    async def run_forever(self) -> None:
        """Start, run until SIGTERM/SIGINT, stop. A signal during start-up aborts the start (what
        was opened is released). Raises :class:`StartupError` when the daemon cannot start."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload_on_hangup)
        starting = asyncio.create_task(self.start(), name="start")
        signalled = asyncio.create_task(stop.wait(), name="wait-for-signal")
        await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            log.info("stop requested during start-up: releasing what was opened")
            async with slow_stop_reported(15):
                # Again after 30 s only: the start's own release of what it opened runs under
                # its first cancel and must not be cut, but a cancel it lost must not hang us.
                await cancel_and_wait([starting], again_after=30)
                if not starting.cancelled():
                    starting.result()  # a StartupError that won the race is still the daemon's exit
                    await self.stop()  # the start finished despite the cancel: all of it is open
            return
        if starting.exception() is not None:
            signalled.cancel()
            starting.result()  # raises the StartupError
        log.info("chital is running; SIGTERM or Ctrl-C stops it")
        notifier = Notifier.from_environ()
        watchdog: asyncio.Task[None] | None = None
        if notifier is not None:
            notifier.send("READY=1", f"STATUS=running, health on port {self.http_port}")
            watchdog = asyncio.create_task(notifier.watchdog(), name="systemd-watchdog")
        await signalled
        grace = self.config.concurrency.shutdown_grace
        log.info("stopping: draining running turns (up to %.0fs)", grace)
        if notifier is not None:
            notifier.send("STOPPING=1", "STATUS=stopping: draining running turns")
        async with slow_stop_reported(grace + 5):
            errors = await self.stop()
        if watchdog is not None:
            await cancel_and_wait([watchdog])
        if errors:
            log.error("stopped with %d error(s) while closing", len(errors))
        else:
            log.info("stopped cleanly")
