"""The shared Docker mode: a thread's sandbox follows its conversation to whichever daemon runs it.

``agent.sandbox.docker.shared: true``. Every daemon talks to the same engine (``DOCKER_HOST``, with
``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH`` for TLS, read by the Docker SDK), and a thread's files
live in a named volume on it, ``chital-ws-<hash>``, mounted at ``/mnt/user-data`` in the container
``chital-sbx-<hash>`` (hash: the first 16 hex digits of the thread id's SHA-256, so any id maps to
a safe name). Both are found by name, so any daemon finds what another made.

Created once, without a lock of the daemons' own: the engine is the lock. A volume create of an
existing name returns that volume; a container create of a taken name fails with 409, which here
means "another daemon made it" and is answered by using that container. So two daemons starting a
thread's sandbox at the same moment end with one volume and one container, with no row in the
database that a dead daemon could leave locked.

File tools go through the engine (engine_files.py), never a host path. Idle containers are
removed by any daemon's reaper (the volume stays): the last use is a stamp in a root-owned tmpfs
in the container that sandboxed code cannot write, and a container running anything besides its
idle process is never reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import os
import stat
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.types import Mount
from docker.utils.socket import frames_iter

from compat.docker import close_response, raw_socket

from .base import SandboxUnavailable
from .config import SandboxLimits
from .docker_provider import LABEL, LABEL_CONFIG, LABEL_THREAD, DockerProvider, DockerSandbox, short_error
from .engine_exec import IO_SECONDS
from .engine_files import EngineFiles, EngineRoom
from .paths import SKILLS, USER_DATA, SandboxError, ThreadDirs
from .probe import PROBE_THREAD

log = logging.getLogger(__name__)

LABEL_SHARED = "chital.shared"
LABEL_SKILLS = "chital.skills"
STAMP_DIR = "/run/chital"
STAMP = f"{STAMP_DIR}/used"

# Run as root in the container (no capabilities): seconds since the stamp, and how many processes
# run besides docker-init, the idle ``sleep`` and this one (a command, or a file operation).
IDLE_CHECK = """
import os, time
me = os.getpid()
try:
    age = time.time() - os.stat("STAMP").st_mtime
except OSError:
    age = 1e9
busy = 0
for d in os.listdir("/proc"):
    if d.isdigit() and int(d) not in (1, me):
        try:
            with open("/proc/" + d + "/cmdline", "rb") as f:
                argv = f.read().split(b"\\0")
        except OSError:
            continue
        if argv[:2] != [b"sleep", b"infinity"]:
            busy += 1
print(round(age, 1), busy)
""".replace("STAMP", STAMP)


def thread_key(thread_id: str) -> str:
    return hashlib.sha256(thread_id.encode()).hexdigest()[:16]


def volume_name(thread_id: str) -> str:
    return "chital-ws-" + thread_key(thread_id)


class _DockerExecStream:
    """An exec's attached socket, read as Docker's multiplexed frames with a timeout per read."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        raw = raw_socket(sock)
        if raw is not None:
            raw.settimeout(IO_SECONDS)

    def frames(self) -> Any:
        return frames_iter(self.sock, tty=False)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sock.close()
        close_response(self.sock)


class SharedDockerSandbox(EngineRoom, DockerSandbox):
    """A thread's container on the shared engine; its files are in the volume (EngineFiles)."""

    def __init__(self, provider: SharedDockerProvider, dirs: ThreadDirs, container_id: str) -> None:
        super().__init__(provider, dirs, container_id, None)
        self.files: EngineFiles = EngineFiles(provider, self.mapper, provider.quota)


class SharedDockerProvider(DockerProvider):
    """One container and one named volume per thread on an engine all daemons share."""

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
        super().__init__(
            root,
            skills_dir,
            image=image,
            limits=limits,
            uid=uid,
            gid=gid,
            idle_timeout=idle_timeout,
            network=network,
            client=client,
            min_free_mb=0,
        )
        self.user = f"{uid}:{gid}"
        settings = [image, self.limits.model_dump(), uid, gid, network, "shared"]
        self.base_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
        """The settings' hash without the skills dir's path: each daemon has its own copy of the
        skills (their content is what counts, see ``_skills_volume``)."""
        self._skills: tuple[object, bytes, str] | None = None
        self.stdin_data = False
        """engine_exec.ExecTransport: data goes in as base64 arguments (an exec's are in its
        JSON body here, ~1 MB per exec)."""
        self.probe_id = f"{PROBE_THREAD}-{uuid.uuid4().hex[:12]}"
        """The start-up probe's thread, one per daemon: daemons starting together must not
        remove each other's probe container mid-command."""

    def _key(self, thread_id: str) -> str:
        return self.probe_id if thread_id == PROBE_THREAD else thread_id

    def owner_for(self, thread_id: str) -> tuple[int, int] | None:
        return (self.uid, self.gid)

    def files_for(self, thread_id: str) -> EngineFiles:
        """The thread's files through the engine (its container is made when first needed)."""
        key = self._key(thread_id)
        from .paths import PathMapper

        dirs = ThreadDirs.for_thread(self.root, key, self.skills_dir)
        return EngineFiles(self, PathMapper(dirs), self.quota)

    def open_exec(self, thread_id: str, argv: list[str], stdin: bytes | None = None) -> _DockerExecStream:
        """engine_exec.ExecTransport: ``argv`` as the sandbox user in the thread's container."""
        assert stdin is None  # stdin_data is False: data travels as arguments
        api = self.client.api

        def start() -> Any:
            name = self.ensure_container(thread_id, fast=True)
            exec_id = api.exec_create(name, argv, user=self.user, workdir="/", stdout=True, stderr=True)["Id"]
            return api.exec_start(exec_id, socket=True)

        try:
            try:
                sock = start()
            except (NotFound, APIError) as e:
                if isinstance(e, APIError) and e.status_code not in (404, 409):
                    raise
                self.ensure_container(thread_id, fast=False)  # reaped meanwhile
                sock = start()
        except DockerException as e:
            raise SandboxError(
                f"the sandbox's files are unreachable: {str(e).splitlines()[0][:200]}"
            ) from None
        return _DockerExecStream(sock)

    # --- the container, made once on the engine ----------------------------------------------

    def ensure_container(self, thread_id: str, *, fast: bool = False) -> str:
        """The name (``fast``: without asking the engine) or id of the thread's running
        container, made if missing. Blocking; safe from any thread and any daemon at once."""
        name = container_name(thread_id)
        if fast:
            return name
        volume = volume_name(thread_id)
        labels = {LABEL: "1", LABEL_SHARED: "1", LABEL_THREAD: thread_id}
        self.client.volumes.create(volume, labels=labels)  # an existing volume is returned as is
        skills = self._skills_volume()
        config = hashlib.sha256(f"{self.base_hash}:{skills}".encode()).hexdigest()[:16]
        for _ in range(40):
            try:
                c = self.client.containers.get(name)
            except NotFound:
                c = None
            if c is not None and c.labels.get(LABEL_CONFIG) != config:
                with contextlib.suppress(NotFound):
                    c.remove(force=True)  # built from other settings: anew (the volume stays)
                c = None
            if c is None:
                mounts = [Mount(USER_DATA, volume, type="volume")]
                if skills is not None:
                    mounts.append(Mount(SKILLS, skills, type="volume", read_only=True))
                spec = self._spec(name, {**labels, LABEL_CONFIG: config}, mounts, self.user)
                spec["tmpfs"] = {**spec["tmpfs"], STAMP_DIR: "rw,nosuid,nodev,noexec,size=64k,mode=0755"}
                try:
                    return str(self.client.containers.run(**spec).id)
                except APIError as e:
                    if e.status_code != 409:  # 409: another daemon made it first; use that one
                        raise
                continue
            if c.status != "running":
                with contextlib.suppress(APIError):  # another daemon may be starting it too
                    c.start()
                c.reload()
            if c.status == "running":
                return str(c.id)
            time.sleep(0.25)  # created by another daemon, not started yet
        raise SandboxUnavailable(f"the sandbox container {name} could not be started")

    def _skills_archive(self) -> tuple[bytes, str] | None:
        """The skills dir as a tar (links and special files left out; owner root, no times, so
        equal content gives equal bytes on every daemon) and its hash; rebuilt when it changed."""
        if self.skills_dir is None or not self.skills_dir.is_dir():
            return None
        view = self.skills_dir
        seen = []
        for dirpath, dirnames, filenames in os.walk(view):
            dirnames.sort()
            for name in sorted(filenames):
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(dirpath, name))
                    seen.append((dirpath, name, st.st_size, st.st_mtime_ns, st.st_mode))
        if self._skills is not None and self._skills[0] == seen:
            return self._skills[1], self._skills[2]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for dirpath, dirnames, filenames in os.walk(view):
                dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
                rel = os.path.relpath(dirpath, view)
                if rel != ".":
                    info = tarfile.TarInfo(rel)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                for name in sorted(filenames):
                    path = os.path.join(dirpath, name)
                    try:
                        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    except OSError:
                        continue
                    with os.fdopen(fd, "rb") as f:
                        st = os.fstat(f.fileno())
                        if not stat.S_ISREG(st.st_mode):
                            continue
                        data = f.read()
                    info = tarfile.TarInfo(os.path.normpath(os.path.join(rel, name)))
                    info.size, info.mode = len(data), 0o755 if st.st_mode & 0o111 else 0o644
                    tar.addfile(info, io.BytesIO(data))
        data = buf.getvalue()
        digest = hashlib.sha256(data).hexdigest()[:16]
        self._skills = (seen, data, digest)
        return data, digest

    def _skills_volume(self) -> str | None:
        """A read-only volume holding the skills, named after their content, so every daemon with
        the same skills mounts the same one (a daemon's host path means nothing to a remote
        engine). Filled once through the archive API into a container that is never started; a
        marker container of the volume's name, made after, says it is complete."""
        archive = self._skills_archive()
        if archive is None:
            return None
        data, digest = archive
        name = f"chital-skills-{digest}"
        labels = {LABEL: "1", LABEL_SKILLS: "1"}
        try:
            self.client.containers.get(name)
            return name
        except NotFound:
            pass
        self.client.volumes.create(name, labels=labels)
        filler = self.client.containers.create(
            self.image,
            ["true"],
            name=f"{name}-fill-{uuid.uuid4().hex[:8]}",
            labels=labels,
            network_mode="none",
            mounts=[Mount("/skills", name, type="volume")],
        )
        try:
            filler.put_archive("/skills", data)
        finally:
            filler.remove(force=True)
        with contextlib.suppress(APIError):  # 409: another daemon marked it complete first
            self.client.containers.create(
                self.image,
                ["true"],
                name=name,
                labels=labels,
                network_mode="none",
                mounts=[Mount("/skills", name, type="volume", read_only=True)],
            )
        return name

    def _stamp(self, thread_id: str) -> None:
        """Mark the thread's container as used now (root-owned tmpfs: sandboxed code cannot)."""
        api = self.client.api
        with contextlib.suppress(DockerException):
            exec_id = api.exec_create(container_name(thread_id), ["touch", STAMP], user="0", workdir="/")[
                "Id"
            ]
            api.exec_start(exec_id)

    async def acquire(self, thread_id: str) -> DockerSandbox:
        key = self._key(thread_id)
        async with self._lock(key):
            sb = self._sandboxes.get(key)
            if sb is None:
                sb = SharedDockerSandbox(self, ThreadDirs.for_thread(self.root, key, self.skills_dir), "")
            assert isinstance(sb, SharedDockerSandbox)
            sb.room_known = False  # a new turn: other daemons may have run commands meanwhile
            await self._start(sb)
            await asyncio.to_thread(self._stamp, key)
            sb.touch()
            return sb

    async def _start(self, sb: DockerSandbox) -> None:
        try:
            sb.container_id = await asyncio.to_thread(self.ensure_container, sb.thread_id)
        except DockerException as e:
            raise SandboxUnavailable(f"cannot start the sandbox container: {short_error(e)}") from None
        self._sandboxes[sb.thread_id] = sb

    async def release(self, thread_id: str) -> None:
        key = self._key(thread_id)
        sb = self._sandboxes.get(key)
        if sb is not None:
            sb.touch()
            await asyncio.to_thread(self._stamp, key)

    async def discard(self, thread_id: str) -> None:
        """Remove the thread's container and its volume (the start-up probe's)."""
        key = self._key(thread_id)
        async with self._lock(key):
            self._sandboxes.pop(key, None)

            def rm() -> None:
                with contextlib.suppress(NotFound):
                    self.client.api.remove_container(container_name(key), force=True)
                with contextlib.suppress(NotFound):
                    self.client.api.remove_volume(volume_name(key), force=True)

            try:
                await asyncio.to_thread(rm)
            except DockerException as e:
                log.warning("could not remove the sandbox of %s: %s", key, short_error(e))

    # --- lifecycle across daemons ------------------------------------------------------------

    def _idle(self, c: Any) -> bool:
        """Is container ``c`` unused for ``idle_timeout`` and running nothing?"""
        if c.status != "running":
            return True
        api = self.client.api
        exec_id = api.exec_create(c.id, ["python3", "-I", "-c", IDLE_CHECK], user="0", workdir="/")["Id"]
        out = api.exec_start(exec_id)
        try:
            age, busy = float(out.split()[0]), int(out.split()[1])
        except (ValueError, IndexError):
            return False
        return busy == 0 and age > self.idle_timeout

    async def reap_idle(self) -> list[str]:
        """Remove shared containers idle longer than ``idle_timeout`` (any daemon's; their
        volumes stay). One that another daemon uses meanwhile is revived by its next call."""
        if self.reap_gate is not None and not self.reap_gate():
            return []  # another daemon (the timers' owner) reaps the shared containers

        def sweep() -> list[str]:
            gone = []
            filters = {"label": [f"{LABEL}=1", f"{LABEL_SHARED}=1"]}
            for c in self.client.containers.list(all=True, filters=filters):
                try:
                    if self._idle(c):
                        c.remove(force=True)
                        gone.append(c.labels.get(LABEL_THREAD, c.name))
                except DockerException:
                    continue
            return gone

        gone = await asyncio.to_thread(sweep)
        for tid in gone:
            self._sandboxes.pop(tid, None)
        if gone:
            log.info("reaped %d idle shared sandbox container(s)", len(gone))
        return gone

    async def reconcile(self) -> None:
        """Nothing to adopt or remove: the containers are every daemon's. Check the engine."""
        await self.ping()

    async def close(self) -> None:
        """Leave the containers to the other daemons (and the reaper); close the client."""
        await self.stop_reaper()
        self._sandboxes = {}
        if self._client is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._client.close)
            self._client = None


def container_name(thread_id: str) -> str:
    return "chital-sbx-" + thread_key(thread_id)
