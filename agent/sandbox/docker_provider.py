"""The ``docker`` provider: one long-lived, locked-down container per conversation thread.

Containers are named ``chital-sbx-<hash>``, labelled with the thread and this provider's root (so
two daemons on one engine never touch each other's), reused across turns, removed after
``idle_timeout`` and reconciled at start-up. Each command is a ``docker exec`` whose processes are
all killed when it ends or times out (see ``_WRAPPER``). The Docker SDK is blocking, so every call
runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.types import Mount, Ulimit

from .base import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxProvider,
    SandboxUnavailable,
)
from .config import SandboxLimits
from .local import MAX_COMMAND_BYTES, sandbox_env
from .paths import OUTPUTS, SKILLS, UPLOADS, WORKSPACE, SandboxError, ThreadDirs, safe_thread_id

log = logging.getLogger(__name__)

LABEL = "chital.sandbox"
LABEL_THREAD = "chital.thread"
LABEL_INSTANCE = "chital.instance"
LABEL_CONFIG = "chital.config"

# Every process in a container carries CHITAL_EXEC: "idle" (container env) for the container's own
# processes, a fresh marker per exec (inherited by all it starts, even after setsid). The killer
# SIGKILLs what carries a given marker and whatever shed its environment (``env -i``) to hide. It is
# one process that never forks, because a fork bomb may hold every process slot; it repeats until
# nothing is left. With an exit code it exits with it silently, else it reports "left=N".
_KILLER = """
import os, signal, sys, time
mark, me = ("CHITAL_EXEC=" + sys.argv[1]).encode(), os.getpid()
def doomed(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return False
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read().split(b"\\0")
    except (OSError, IndexError):
        return False
    return mark in env or not any(e.startswith(b"CHITAL_EXEC=") for e in env)
def scan():
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) not in (1, me) and doomed(int(d))]
for _ in range(50):
    pids = scan()
    if not pids:
        break
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.02)
if len(sys.argv) > 2:
    sys.exit(int(sys.argv[2]))
print("left=%d" % len(scan()))
"""
# Runs the user's command, then makes sure nothing it started survives, as with the local
# provider. Fast path, no fork: only init, the idle process and this shell exist. Otherwise the
# shell becomes the killer (exec, not fork) and exits with the command's status.
_WRAPPER = (
    'k=$2; bash -c "$1" 2>&1; rc=$?; set -- /proc/[0-9]*; [ $# -le 3 ] && exit $rc; '
    'exec python3 -c "$k" "$CHITAL_EXEC" "$rc"'
)


def container_name(thread_id: str) -> str:
    return "chital-sbx-" + hashlib.sha256(thread_id.encode()).hexdigest()[:16]


class DockerSandbox(Sandbox):
    def __init__(self, provider: DockerProvider, dirs: ThreadDirs, container_id: str) -> None:
        super().__init__(dirs, (provider.uid, provider.gid))
        self.provider = provider
        self.container_id = container_id
        self.busy = 0

    async def exec(
        self,
        command: str,
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the command's limit, not ours
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        if len(command.encode()) > MAX_COMMAND_BYTES:
            raise SandboxError(
                f"command longer than {MAX_COMMAND_BYTES} bytes; write a script file and run that"
            )
        self.touch()
        self.busy += 1
        try:
            return await self._exec(command, timeout, max_output)
        finally:
            self.busy -= 1
            self.touch()

    async def _exec(self, command: str, timeout: float, max_output: int) -> ExecResult:  # noqa: ASYNC109
        api = self.provider.client.api
        marker = uuid.uuid4().hex
        user = f"{self.provider.uid}:{self.provider.gid}"

        def start() -> tuple[str, Any]:
            exec_id = api.exec_create(
                self.container_id,
                ["/bin/sh", "-c", _WRAPPER, "chital-exec", command, _KILLER],
                user=user,
                workdir=WORKSPACE,
                environment={"CHITAL_EXEC": marker},
                stdout=True,
                stderr=True,
            )["Id"]
            return exec_id, api.exec_start(exec_id, stream=True)

        async def start_or_revive() -> tuple[str, Any]:
            try:
                return await asyncio.to_thread(start)
            except (NotFound, APIError) as e:
                # The container died (killed after a runaway command, removed by hand): start a
                # fresh one for this thread and try once more. Files live on the host.
                if isinstance(e, APIError) and e.status_code not in (404, 409):
                    raise
                await self.provider.revive(self)
                return await asyncio.to_thread(start)

        starting = asyncio.ensure_future(start_or_revive())
        try:
            exec_id, stream = await asyncio.shield(starting)
        except asyncio.CancelledError:
            # Cancelled while the exec was being started: let it start, then kill it below.
            try:
                exec_id, stream = await starting
            except Exception:
                raise asyncio.CancelledError from None
            cancelled_early = True
        except DockerException as e:
            raise SandboxUnavailable(f"docker exec failed: {_short(e)}") from None
        else:
            cancelled_early = False
        cap = OutputCap(max_output)

        def pump() -> None:
            for chunk in stream:
                cap.feed(chunk)

        reader = asyncio.ensure_future(asyncio.to_thread(pump))
        timed_out = False
        try:
            if cancelled_early:
                raise asyncio.CancelledError
            done, _ = await asyncio.wait({reader}, timeout=timeout)
            if not done:
                timed_out = True
                await self._kill(marker, reader, stream)
            else:
                reader.result()
        except BaseException:  # cancelled (/stop) or failed: nothing may keep running
            await asyncio.shield(self._kill(marker, reader, stream))
            raise
        if timed_out:
            return ExecResult(None, cap.text(), cap.truncated, True)
        info = await asyncio.to_thread(api.exec_inspect, exec_id)
        return ExecResult(info.get("ExitCode"), cap.text(), cap.truncated, False)

    async def _kill(self, marker: str, reader: asyncio.Future[None], stream: Any) -> None:
        """Kill every process of one exec; if any survive, kill the whole container.

        The marker sweep keeps the container (and its /tmp) but needs a process slot inside it; a
        fork bomb can deny that, and ``env -i`` sheds the marker. Killing the container from the
        engine needs nothing inside and takes every process with it; the next command revives it.
        """
        api = self.provider.client.api
        user = f"{self.provider.uid}:{self.provider.gid}"

        def sweep() -> bool:
            try:
                exec_id = api.exec_create(self.container_id, ["python3", "-c", _KILLER, marker], user=user)[
                    "Id"
                ]
                return b"left=0" in api.exec_start(exec_id)
            except DockerException:
                return False

        try:
            clean = await asyncio.wait_for(asyncio.to_thread(sweep), 10)
        except TimeoutError:
            clean = False
        done = False
        if clean:
            done = bool((await asyncio.wait({reader}, timeout=2))[0])
        if not done:
            log.warning("sandbox %s: processes survived the sweep; killing its container", self.id)
            with contextlib.suppress(DockerException):
                await asyncio.to_thread(api.kill, self.container_id)
            done = bool((await asyncio.wait({reader}, timeout=5))[0])
        if not done:
            with contextlib.suppress(Exception):
                stream.close()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(reader, 5)

    async def alive(self) -> bool:
        def check() -> bool:
            try:
                c = self.provider.client.containers.get(self.container_id)
            except NotFound:
                return False
            return c.status == "running"

        try:
            return await asyncio.to_thread(check)
        except DockerException:
            return False


class DockerProvider(SandboxProvider):
    """One container per thread on a Docker engine (local socket or ``DOCKER_HOST``)."""

    def __init__(
        self,
        root: Path | str,
        skills_dir: Path | str | None = None,
        *,
        image: str = "chital-sandbox:latest",
        limits: SandboxLimits | None = None,
        uid: int = 1000,
        gid: int = 1000,
        idle_timeout: float = 1800.0,
        network: bool = False,
        client: docker.DockerClient | None = None,
    ) -> None:
        super().__init__(idle_timeout)
        self.root = Path(root).resolve()
        self.skills_dir = Path(skills_dir).resolve() if skills_dir else None
        self.image = image
        self.limits = limits or SandboxLimits()
        self.uid, self.gid = uid, gid
        self.network = network
        self._client = client
        self._sandboxes: dict[str, DockerSandbox] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.instance = hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
        settings = [image, self.limits.model_dump(), uid, gid, network, str(self.skills_dir)]
        self.config_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.from_env()
            except DockerException as e:
                raise SandboxUnavailable(f"no Docker engine answers: {_short(e)}") from None
        return self._client

    async def ping(self) -> None:
        """Raise SandboxUnavailable unless the engine answers and has the image."""

        def check() -> None:
            try:
                self.client.ping()
                self.client.images.get(self.image)
            except NotFound:
                raise SandboxUnavailable(
                    f"sandbox image {self.image} is missing; run scripts/setup-sandbox.sh"
                ) from None
            except DockerException as e:
                raise SandboxUnavailable(f"no Docker engine answers: {_short(e)}") from None

        await asyncio.to_thread(check)

    def _lock(self, thread_id: str) -> asyncio.Lock:
        return self._locks.setdefault(thread_id, asyncio.Lock())

    async def acquire(self, thread_id: str) -> DockerSandbox:
        async with self._lock(thread_id):
            sb = self._sandboxes.get(thread_id)
            if sb is not None:
                if not await sb.alive():
                    await self._start(sb)
                sb.touch()
                return sb
            sb = DockerSandbox(self, ThreadDirs.for_thread(self.root, thread_id, self.skills_dir), "")
            await self._start(sb)
            return sb

    async def revive(self, sb: DockerSandbox) -> None:
        """Give ``sb`` a running container again (same object: a turn may hold it)."""
        async with self._lock(sb.thread_id):
            if not await sb.alive():
                await self._start(sb)

    async def _start(self, sb: DockerSandbox) -> None:
        await asyncio.to_thread(sb.dirs.ensure, (self.uid, self.gid))
        try:
            sb.container_id = await asyncio.to_thread(self._ensure_container, sb.dirs)
        except DockerException as e:
            raise SandboxUnavailable(f"cannot start the sandbox container: {_short(e)}") from None
        self._sandboxes[sb.thread_id] = sb

    def _ensure_container(self, dirs: ThreadDirs) -> str:
        name = container_name(dirs.thread_id)
        try:
            c = self.client.containers.get(name)
            if c.status == "running" and c.labels.get(LABEL_CONFIG) == self.config_hash:
                return str(c.id)
            c.remove(force=True)  # stopped or built from older settings: start afresh
        except NotFound:
            pass
        lim = self.limits
        mb = 1024 * 1024
        mounts = [
            Mount(WORKSPACE, str(dirs.workspace), type="bind"),
            Mount(UPLOADS, str(dirs.uploads), type="bind"),
            Mount(OUTPUTS, str(dirs.outputs), type="bind"),
        ]
        if dirs.skills is not None:
            mounts.append(Mount(SKILLS, str(dirs.skills), type="bind", read_only=True))
        try:
            c = self.client.containers.run(
                self.image,
                ["sleep", "infinity"],
                name=name,
                detach=True,
                init=True,  # docker-init reaps orphans of killed commands
                labels={
                    LABEL: "1",
                    LABEL_THREAD: dirs.thread_id,
                    LABEL_INSTANCE: self.instance,
                    LABEL_CONFIG: self.config_hash,
                },
                user=f"{self.uid}:{self.gid}",
                environment={**sandbox_env(), "CHITAL_EXEC": "idle"},
                working_dir=WORKSPACE,
                hostname="sandbox",
                network_mode="bridge" if self.network else "none",
                mem_limit=lim.memory_mb * mb,
                memswap_limit=lim.memory_mb * mb,
                nano_cpus=int(lim.cpus * 1e9),
                pids_limit=lim.pids,
                ulimits=[
                    Ulimit(name="fsize", soft=lim.file_size_mb * mb, hard=lim.file_size_mb * mb),
                    Ulimit(name="nofile", soft=lim.open_files, hard=lim.open_files),
                    Ulimit(name="core", soft=0, hard=0),
                ],
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                read_only=True,
                tmpfs={"/tmp": f"rw,nosuid,nodev,size={lim.tmp_size_mb}m,mode=1777"},
                mounts=mounts,
                ipc_mode="private",
            )
        except APIError as e:
            if e.status_code != 409:  # 409: a concurrent start won the name; use its container
                raise
            c = self.client.containers.get(name)
        return str(c.id)

    def owner_for(self, thread_id: str) -> tuple[int, int] | None:
        return (self.uid, self.gid)

    async def release(self, thread_id: str) -> None:
        sb = self._sandboxes.get(thread_id)
        if sb is not None:
            sb.touch()

    async def _remove(self, container_id: str) -> None:
        def rm() -> None:
            with contextlib.suppress(NotFound):
                self.client.api.remove_container(container_id, force=True)

        try:
            await asyncio.to_thread(rm)
        except DockerException as e:
            log.warning("could not remove sandbox container %s: %s", container_id[:12], _short(e))

    async def reap_idle(self) -> list[str]:
        cutoff = time.monotonic() - self.idle_timeout
        gone = []
        for tid, sb in list(self._sandboxes.items()):
            if sb.busy or sb.last_used >= cutoff:
                continue
            async with self._lock(tid):
                if self._sandboxes.get(tid) is sb and not sb.busy and sb.last_used < cutoff:
                    del self._sandboxes[tid]
                    await self._remove(sb.container_id)
                    gone.append(tid)
        if gone:
            log.info("reaped %d idle sandbox container(s)", len(gone))
        return gone

    async def reconcile(self) -> None:
        """Adopt running containers of this provider with current settings; remove the rest."""

        def listing() -> list[Any]:
            return list(
                self.client.containers.list(
                    all=True, filters={"label": [f"{LABEL}=1", f"{LABEL_INSTANCE}={self.instance}"]}
                )
            )

        try:
            containers = await asyncio.to_thread(listing)
        except DockerException as e:
            raise SandboxUnavailable(f"no Docker engine answers: {_short(e)}") from None
        adopted = 0
        for c in containers:
            tid = c.labels.get(LABEL_THREAD, "")
            dirs = ThreadDirs.for_thread(self.root, tid, self.skills_dir) if tid else None
            keep = (
                dirs is not None
                and c.status == "running"
                and c.labels.get(LABEL_CONFIG) == self.config_hash
                and c.name == container_name(tid)
                and dirs.workspace.is_dir()
                and tid not in self._sandboxes
            )
            if keep:
                assert dirs is not None
                self._sandboxes[tid] = DockerSandbox(self, dirs, str(c.id))
                adopted += 1
            else:
                await self._remove(str(c.id))
        log.info("sandbox reconcile: %d adopted, %d removed", adopted, len(containers) - adopted)

    async def close(self) -> None:
        """Remove every container of this provider: their state lives in the host dirs."""
        await super().close()
        sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        await asyncio.gather(*(self._remove(sb.container_id) for sb in sandboxes))
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._client.close)
            self._client = None


def _short(e: BaseException) -> str:
    """First line of an SDK error, bounded: enough to act on, never a wall of text."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:300]


__all__ = ["DockerProvider", "DockerSandbox", "container_name", "safe_thread_id"]
