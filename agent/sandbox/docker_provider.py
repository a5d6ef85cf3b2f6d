"""The ``docker`` provider: one long-lived, locked-down container per conversation thread.

Containers are named ``chital-sbx-<hash>``, labelled with the thread and this provider's root (so
two daemons on one engine never touch each other's), reused across turns, removed after
``idle_timeout`` and reconciled at start-up. Each command is a ``docker exec`` whose processes are
all killed when it ends or times out (docker_scripts.py). The Docker SDK is blocking, so every
call runs in a worker thread.

Process limits come from the container's pids cgroup (``pids_limit``), a counter per container.
Never from an ``nproc`` ulimit: RLIMIT_NPROC counts every process of the host uid, across all
containers (and local sandboxes) running as it, so one fork bomb would starve every sandbox. None
is set here (containers keep the engine's own, high, limit; the engine cannot raise it further),
and an engine-wide ``--default-ulimit nproc`` must not be configured. The disk quota is measured
on the host dirs the container binds (quota.py), exactly as for the local provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.types import Mount, Ulimit

from . import quota as disk
from .base import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxProvider,
    SandboxUnavailable,
    settle,
)
from .config import SandboxLimits
from .docker_scripts import KILLER, WRAPPER
from .local import MAX_COMMAND_BYTES, sandbox_env
from .owners import UidPool, make_root, traversal_problem
from .paths import OUTPUTS, SKILLS, UPLOADS, WORKSPACE, SandboxError, ThreadDirs, safe_thread_id

log = logging.getLogger(__name__)

LABEL = "chital.sandbox"
LABEL_THREAD = "chital.thread"
LABEL_INSTANCE = "chital.instance"
LABEL_CONFIG = "chital.config"


def container_name(thread_id: str) -> str:
    return "chital-sbx-" + hashlib.sha256(thread_id.encode()).hexdigest()[:16]


class DockerSandbox(Sandbox):
    def __init__(
        self,
        provider: DockerProvider,
        dirs: ThreadDirs,
        container_id: str,
        owner: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(dirs, owner or (provider.uid, provider.gid), provider.quota)
        self.provider = provider
        self.container_id = container_id
        self.busy = 0

    @property
    def user(self) -> str:
        """The container user: the thread's host uid:gid (bind mounts keep host ownership)."""
        assert self.owner is not None
        return f"{self.owner[0]}:{self.owner[1]}"

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
            await self._before_command()
            res = await self._exec(command, timeout, max_output)
            if res.stopped is None and (note := await self._after_command()):
                res = ExecResult(res.exit_code, f"{res.output}\n{note}", res.truncated, res.timed_out)
            return res
        finally:
            self.busy -= 1
            self.touch()

    async def _before_command(self) -> None:
        await disk.before_command(self.dirs, self.quota)

    async def _after_command(self) -> str | None:
        return await disk.after_command(self.dirs, self.quota)

    async def _watch_disk(self) -> str:
        """Returns why the running command must stop (the disk quota or floor); races it."""
        return await disk.watch(self.dirs, self.quota)

    async def _exec(self, command: str, timeout: float, max_output: int) -> ExecResult:  # noqa: ASYNC109
        api = self.provider.client.api
        marker = uuid.uuid4().hex
        user = self.user

        def start() -> tuple[str, Any]:
            exec_id = api.exec_create(
                self.container_id,
                ["/bin/sh", "-c", WRAPPER, "chital-exec", command, KILLER],
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
            raise SandboxUnavailable(f"docker exec failed: {short_error(e)}") from None
        else:
            cancelled_early = False
        cap = OutputCap(max_output)

        def pump() -> None:
            for chunk in stream:
                cap.feed(chunk)

        reader = asyncio.ensure_future(asyncio.to_thread(pump))
        dog = asyncio.ensure_future(self._watch_disk())
        timed_out, stopped = False, None
        try:
            if cancelled_early:
                raise asyncio.CancelledError
            done, _ = await asyncio.wait({reader, dog}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                reader.result()
            else:
                if dog in done:
                    stopped = dog.result()
                else:
                    timed_out = True
                await self._kill(marker, reader, stream)
        except BaseException:  # cancelled (/stop) or failed: nothing may keep running
            await asyncio.shield(self._kill(marker, reader, stream))
            raise
        finally:
            dog.cancel()
        if stopped is not None:
            return ExecResult(None, cap.text() + disk.stopped_note(stopped), cap.truncated, False, stopped)
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
        user = self.user

        def sweep() -> bool:
            try:
                made = api.exec_create(self.container_id, ["python3", "-c", KILLER, marker], user=user)
                return b"left=0" in api.exec_start(made["Id"])
            except DockerException:
                return False

        try:
            async with asyncio.timeout(10):
                clean = await asyncio.to_thread(sweep)
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
        await settle(reader, 5)

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
        min_free_mb: int = disk.DEFAULT_MIN_FREE_MB,
        uid_range: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(idle_timeout)
        self.root = Path(root).resolve()
        self.skills_dir = Path(skills_dir).resolve() if skills_dir else None
        self.image = image
        self.limits = limits or SandboxLimits()
        self.uid, self.gid = uid, gid
        self.network = network
        self._client = client
        self.quota = disk.DiskQuota.from_limits(self.limits, min_free_mb)
        disk.register(self.root, self.quota)
        self.uids = UidPool(self.root, *uid_range) if uid_range and os.geteuid() == 0 else None
        self._sandboxes: dict[str, DockerSandbox] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.instance = hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
        settings = [image, self.limits.model_dump(), uid, gid, network, str(self.skills_dir), uid_range]
        self.config_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.from_env()
            except DockerException as e:
                raise SandboxUnavailable(f"no Docker engine answers: {short_error(e)}") from None
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
                raise SandboxUnavailable(f"no Docker engine answers: {short_error(e)}") from None

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
            dirs = ThreadDirs.for_thread(self.root, thread_id, self.skills_dir)
            owner = await asyncio.to_thread(self.uids.owner, dirs) if self.uids else None
            sb = DockerSandbox(self, dirs, "", owner)
            await self._start(sb)
            return sb

    async def revive(self, sb: DockerSandbox) -> None:
        """Give ``sb`` a running container again (same object: a turn may hold it)."""
        async with self._lock(sb.thread_id):
            if not await sb.alive():
                await self._start(sb)

    async def _start(self, sb: DockerSandbox) -> None:
        await asyncio.to_thread(sb.dirs.ensure, sb.owner)
        try:
            sb.container_id = await asyncio.to_thread(self._ensure_container, sb.dirs, sb.user)
        except DockerException as e:
            raise SandboxUnavailable(f"cannot start the sandbox container: {short_error(e)}") from None
        self._sandboxes[sb.thread_id] = sb

    def _ensure_container(self, dirs: ThreadDirs, user: str) -> str:
        name = container_name(dirs.thread_id)
        try:
            c = self.client.containers.get(name)
            if self._current(c, user):
                return str(c.id)
            c.remove(force=True)  # stopped or built from older settings: start afresh
        except NotFound:
            pass
        mounts = [
            Mount(WORKSPACE, str(dirs.workspace), type="bind"),
            Mount(UPLOADS, str(dirs.uploads), type="bind"),
            Mount(OUTPUTS, str(dirs.outputs), type="bind"),
        ]
        if dirs.skills is not None:
            mounts.append(Mount(SKILLS, str(dirs.skills), type="bind", read_only=True))
        labels = {
            LABEL: "1",
            LABEL_THREAD: dirs.thread_id,
            LABEL_INSTANCE: self.instance,
            LABEL_CONFIG: self.config_hash,
        }
        try:
            c = self.client.containers.run(**self._spec(name, labels, mounts, user))
        except APIError as e:
            if e.status_code != 409:  # 409: a concurrent start won the name; use its container
                raise
            c = self.client.containers.get(name)
        return str(c.id)

    def _spec(self, name: str, labels: dict[str, str], mounts: list[Mount], user: str) -> dict[str, Any]:
        """The locked-down container of one thread: everything ``containers.run`` is given."""
        lim = self.limits
        mb = 1024 * 1024
        fsize = min(lim.file_size_mb, lim.disk_mb) * mb  # no single file beyond the disk quota
        return dict(
            image=self.image,
            command=["sleep", "infinity"],
            name=name,
            detach=True,
            init=True,  # docker-init reaps orphans of killed commands
            labels=labels,
            user=user,
            environment={**sandbox_env(), "CHITAL_EXEC": "idle"},
            working_dir=WORKSPACE,
            hostname="sandbox",
            network_mode="bridge" if self.network else "none",
            mem_limit=lim.memory_mb * mb,
            memswap_limit=lim.memory_mb * mb,
            nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.pids,
            ulimits=[
                Ulimit(name="fsize", soft=fsize, hard=fsize),
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

    def owner_for(self, thread_id: str) -> tuple[int, int] | None:
        """Blocking when ``uid_range`` is on (it may scan the threads dir): call from a worker."""
        if self.uids is None:
            return (self.uid, self.gid)
        return self.uids.owner(ThreadDirs.for_thread(self.root, thread_id, self.skills_dir))

    def _current(self, c: Any, user: str) -> bool:
        """Is container ``c`` running, made from the current settings, as the thread's user?"""
        return bool(
            c.status == "running"
            and c.labels.get(LABEL_CONFIG) == self.config_hash
            and c.attrs.get("Config", {}).get("User") == user
        )

    async def release(self, thread_id: str) -> None:
        sb = self._sandboxes.get(thread_id)
        if sb is not None:
            sb.touch()

    async def discard(self, thread_id: str) -> None:
        async with self._lock(thread_id):
            sb = self._sandboxes.pop(thread_id, None)
            if sb is not None:
                await self._remove(sb.container_id)

    async def _remove(self, container_id: str) -> None:
        def rm() -> None:
            with contextlib.suppress(NotFound):
                self.client.api.remove_container(container_id, force=True)

        try:
            await asyncio.to_thread(rm)
        except DockerException as e:
            log.warning("could not remove sandbox container %s: %s", container_id[:12], short_error(e))

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

    def _check_host(self) -> None:
        """As root: create the root as ``ThreadDirs.ensure`` keeps it, and make sure the sandbox
        uid can search down to it (the daemon's file tools act with that uid's rights)."""
        if os.geteuid() != 0:
            return
        owner = (self.uid, self.gid)
        make_root(self.root, owner)
        probe = (self.uids.first, self.uids.first) if self.uids else owner
        problem = traversal_problem(self.root, *probe)
        if problem is None and self.skills_dir is not None:
            problem = traversal_problem(self.skills_dir, *probe, read=True)
        if problem is not None:
            raise SandboxUnavailable(problem)

    async def reconcile(self) -> None:
        """Adopt running containers of this provider with current settings; remove the rest."""
        await asyncio.to_thread(self._check_host)

        def listing() -> list[Any]:
            return list(
                self.client.containers.list(
                    all=True, filters={"label": [f"{LABEL}=1", f"{LABEL_INSTANCE}={self.instance}"]}
                )
            )

        try:
            containers = await asyncio.to_thread(listing)
        except DockerException as e:
            raise SandboxUnavailable(f"no Docker engine answers: {short_error(e)}") from None
        adopted = 0
        for c in containers:
            tid = c.labels.get(LABEL_THREAD, "")
            dirs = ThreadDirs.for_thread(self.root, tid, self.skills_dir) if tid else None
            owner = None
            if dirs is not None and self.uids is not None and dirs.workspace.is_dir():
                owner = await asyncio.to_thread(self.uids.owner, dirs)
            sb = DockerSandbox(self, dirs, str(c.id), owner) if dirs is not None else None
            keep = (
                sb is not None
                and self._current(c, sb.user)
                and c.name == container_name(tid)
                and sb.dirs.workspace.is_dir()
                and tid not in self._sandboxes
            )
            if keep:
                assert sb is not None
                self._sandboxes[tid] = sb
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


def short_error(e: BaseException) -> str:
    """First line of an SDK error, bounded: enough to act on, never a wall of text."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:300]


__all__ = ["DockerProvider", "DockerSandbox", "container_name", "safe_thread_id"]
