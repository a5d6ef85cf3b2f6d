"""Run ``chital run`` as a real subprocess for end-to-end tests (kill -9, SIGTERM, restarts)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent


CHAT_TOKENS = (
    "TELEGRAM_BOT_TOKEN",
    "SLACK_BOT_TOKEN",
    "SLACK_APP_TOKEN",
    "DISCORD_BOT_TOKEN",
    "LARK_APP_ID",
    "LARK_APP_SECRET",
    "MATRIX_HOMESERVER",
    "MATRIX_USER_ID",
    "MATRIX_ACCESS_TOKEN",
    "DINGTALK_CLIENT_ID",
    "DINGTALK_CLIENT_SECRET",
)
MODEL_SETTINGS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHITAL_CONFIG", "CHITAL_DATA", "CHITAL_MODEL")
"""What the developer's shell may set that would change which model, config or data a child uses."""


def env_without(*names: str, **extra: str) -> dict[str, str]:
    """This process's environment for a child: without ``names`` and without any proxy variable
    (the fakes are on 127.0.0.1 and a proxy would swallow them), plus ``extra``. The one place
    the tests decide what of the developer's shell reaches a chital subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in names and "proxy" not in k.lower()}
    env.update(extra)
    return env


def clean_env() -> dict[str, str]:
    """The environment without chat tokens, a model key, a config path or a proxy: a shell where
    nothing but what the test sets reaches chital."""
    return env_without(*CHAT_TOKENS, "OPENAI_API_KEY", "CHITAL_CONFIG")


def chat_env() -> dict[str, str]:
    """The environment for a ``chital chat`` subprocess: no model key, model, base URL or config path
    from the developer's shell (the test's config must be what the chat uses), and no proxy."""
    return env_without("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHITAL_CONFIG", "CHITAL_MODEL")


class Finished(NamedTuple):
    """What a ``chital`` command left: its exit code and what it printed."""

    code: int
    out: str
    err: str
    """Empty unless the command ran with ``stderr_apart``."""


async def start_chital(
    *args: str,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    stderr_apart: bool = False,
    umask: int = -1,
) -> asyncio.subprocess.Process:
    """``chital ARGS`` started as an operator starts it: a fresh interpreter, pipes instead of a
    terminal, ``env`` (default: :func:`clean_env`), stderr folded into stdout unless
    ``stderr_apart``. For a command the test talks to while it runs (``chital mcp login``, a
    daemon that must exit by itself); :func:`run_chital` is the one that just runs to its end."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli.main",
        *args,
        cwd=str(cwd),
        env=env if env is not None else clean_env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE if stderr_apart else asyncio.subprocess.STDOUT,
        umask=umask,
    )


async def run_chital(
    *args: str,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    stdin: bytes = b"",
    timeout: float = 60,
    stderr_apart: bool = False,
    umask: int = -1,
) -> Finished:
    """``chital ARGS`` run to its end (:func:`start_chital`), with ``stdin`` as its input. The one
    way the tests run a chital command that ends by itself."""
    proc = await start_chital(*args, cwd=cwd, env=env, stderr_apart=stderr_apart, umask=umask)
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    return Finished(int(proc.returncode or 0), out.decode(), (err or b"").decode())


def free_port() -> int:
    """A port for a daemon's listener to bind later, taken below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` goes back into that range once the probe closes,
    and every outgoing connection and every fake server (they bind port 0) draws from the same
    range: on a busy machine one took it before the daemon started ("address already in use",
    seen in CI). Below the range only another free_port() can collide, one in ten thousand."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a machine whose ports below the range are all taken: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def sandbox_root() -> Path:
    """A sandbox root the unprivileged sandbox user can traverse (pytest's tmp dirs are 0700 and
    the daemon, as root, runs sandboxed commands as uid 1000)."""
    root = Path(tempfile.mkdtemp(prefix="chital-sbx-", dir="/tmp"))
    root.chmod(0o755)
    return root


def base_config(data_dir: Path, model_base_url: str, http_port: int) -> dict[str, Any]:
    """A config for tests: fake model, no channel on (tests switch theirs on), fast delivery.
    In the PostgreSQL pass (``CHITAL_TEST_POSTGRES=1``) ``storage.url`` is a fresh database for
    ``data_dir`` (the one :func:`tests.fakes.gateway_rig.store_at` opens for its gateway.sqlite)."""
    from tests.fakes.gateway_rig import TEST_POSTGRES, test_database_url

    storage: dict[str, Any] = {"path": str(data_dir)}
    if TEST_POSTGRES:
        storage["url"] = test_database_url(data_dir / "gateway.sqlite")
    return {
        "models": [
            {
                "name": "default",
                "use": "langchain_openai:ChatOpenAI",
                "model": "fake-model",
                "base_url": model_base_url,
                "api_key": "sk-test-key-never-logged",
            }
        ],
        "agent": {
            "model_timeout": 20,
            "model_retries": 2,
            "retry_backoff": 0.05,
            "sandbox": {"root": str(sandbox_root())},
            "context": {"title": "truncate"},
            "memory": {"debounce_seconds": 0.5},
        },
        "channels": {
            name: {"enabled": False}
            for name in ("telegram", "slack", "discord", "lark", "matrix", "whatsapp", "dingtalk", "wecom")
        },
        "storage": storage,
        "concurrency": {"max_turns": 8, "shutdown_grace": 5},
        "delivery": {"first_edit_delay": 0.2},
        "http": {"host": "127.0.0.1", "port": http_port},
        "log_level": "INFO",
    }


class DaemonProcess:
    """One ``chital run`` subprocess. Logs go to ``<dir>/daemon-N.log`` (printed on test failure)."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = workdir
        self.config = config
        self.config_path = workdir / "config.yaml"
        self.port = int(config["http"]["port"])
        self.proc: asyncio.subprocess.Process | None = None
        self.runs = 0
        self.log_path = workdir / "daemon-0.log"
        self.launcher = ["-m", "gateway.cli.main"]
        """What the interpreter runs before ``run -c CONFIG``: the real entry point, or a test's
        launcher around it (tests/upgraded_daemon.py: the next schema version)."""
        self.prefix: list[str] = []
        """A command the daemon runs under (a bench's profiler: ``py-spy record … --``)."""

    @property
    def sandbox_root(self) -> Path:
        return Path(self.config["agent"]["sandbox"]["root"])

    def write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config), encoding="utf-8")

    async def start(self, *, wait_ready: bool = True, timeout: float = 30.0) -> None:
        self.write_config()
        self.runs += 1
        self.log_path = self.workdir / f"daemon-{self.runs}.log"
        env = env_without(PYTHONUNBUFFERED="1")
        log = self.log_path.open("wb")
        self.proc = await asyncio.create_subprocess_exec(
            *self.prefix,
            sys.executable,
            *self.launcher,
            "run",
            "-c",
            str(self.config_path),
            cwd=str(REPO),
            env=env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
        log.close()
        await self.wait_http(timeout)
        if wait_ready:
            await self.wait_ready(timeout)

    async def get(self, path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{self.port}{path}") as r:
            body = await r.text()
            try:
                return r.status, json.loads(body)
            except json.JSONDecodeError:
                return r.status, body

    async def wait_http(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc and self.proc.returncode is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                status, _ = await self.get("/healthz")
                if status == 200:
                    return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        raise AssertionError(f"daemon did not serve /healthz in {timeout}s:\n{self.logs()}")

    async def wait_ready(self, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        body: Any = None
        while time.monotonic() < deadline:
            status, body = await self.get("/readyz")
            if status == 200:
                return body  # type: ignore[no-any-return]
            await asyncio.sleep(0.05)
        raise AssertionError(f"daemon not ready in {timeout}s: {body}\n{self.logs()}")

    async def wait_channel_state(self, name: str, state: str, timeout: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        body: Any = None
        while time.monotonic() < deadline:
            _, body = await self.get("/readyz")
            info = body["channels"].get(name, {})
            if info.get("state") == state:
                return info  # type: ignore[no-any-return]
            await asyncio.sleep(0.05)
        raise AssertionError(f"channel {name} never reached {state}: {body}")

    async def metrics(self) -> str:
        _, body = await self.get("/metrics")
        return str(body)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    async def terminate(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            tail = self.log_path.read_text(errors="replace")[-4000:]
            raise AssertionError(
                f"the daemon did not exit {timeout:g}s after SIGTERM; its log ends:\n{tail}"
            ) from None
        # A stop must release every thread: one left over held `docker stop` for the CLI's 3 s
        # grace (gateway/cli/main.py _exit_if_threads_linger), an idle quota pool among them.
        # Nor a background task: each part cancels its own (gateway/ops/tasks.py).
        lingering = [
            ln
            for ln in self.log_path.read_text(errors="replace").splitlines()
            if "did not finish" in ln or "still running after shutdown" in ln
        ]
        assert not lingering, f"the daemon's stop left threads or tasks behind: {lingering}"
        return code

    async def wait_exit(self, timeout: float = 10.0) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout)

    def logs(self) -> str:
        parts = []
        for i in range(1, self.runs + 1):
            p = self.workdir / f"daemon-{i}.log"
            if p.exists():
                parts.append(f"--- run {i} ---\n" + p.read_text(errors="replace")[-8000:])
        return "\n".join(parts)

    async def cli(self, *args: str) -> tuple[int, str]:
        """``chital ARGS -c <this daemon's config>``: (exit code, output)."""
        done = await run_chital(*args, "-c", str(self.config_path), env=env_without())
        return done.code, done.out

    async def close(self) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()


class ChatFake(Protocol):
    """What the daemon helpers need of a fake platform server (tests/fakes/*_server.py)."""

    platform: str

    def channel_settings(self) -> dict[str, Any]: ...


class Connects(Protocol):
    """A fake whose server sees the daemon's connection (Slack's Socket Mode, Discord's gateway)."""

    async def wait_connected(self) -> None: ...


def chat_config(
    tmp_path: Path,
    model_base_url: str,
    *fakes: ChatFake,
    allow: Iterable[str] = (),
    group_policy: str | None = None,
    **sections: dict[str, Any],
) -> dict[str, Any]:
    """:func:`base_config` with each fake's channel on, ``allow`` as the allowed users, and each
    keyword a config section whose keys are merged over the base's (``agent={"tools": False}``
    keeps the base's other agent settings). The one factory for a daemon's config, so a test
    states only what it changes."""
    cfg = base_config(tmp_path / "data", model_base_url, free_port())
    for fake in fakes:
        cfg["channels"][fake.platform] = fake.channel_settings()
    access: dict[str, Any] = {"allow_users": list(allow)}
    if group_policy is not None:
        access["group_policy"] = group_policy
    cfg["access"] = access
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


@contextlib.asynccontextmanager
async def started_daemon(
    workdir: Path, config: dict[str, Any], *connected: Connects
) -> AsyncIterator[DaemonProcess]:
    """``chital run`` started on ``config`` and, for each fake in ``connected``, connected to it;
    killed when the block ends (a test that wants a clean stop calls ``terminate`` itself)."""
    d = DaemonProcess(workdir, config)
    try:
        await d.start()
        for fake in connected:
            await fake.wait_connected()
        yield d
    finally:
        await d.close()
