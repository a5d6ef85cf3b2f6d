"""The ``local`` provider: each command runs in a fresh bubblewrap sandbox on this host.

Per command: ``prlimit`` sets the per-process rlimits, then ``bwrap`` unshares every namespace (no
network, own pid and user namespace), shows a read-only minimum of the system (/usr and its
symlinks, a few /etc files, a synthetic passwd), binds the thread's dirs at their virtual paths,
mounts /tmp as tmpfs and runs ``prlimit`` again *inside* the new user namespace for the limits the
kernel counts per user (processes, pending signals, message queues) before ``bash -c`` with a clean
environment. Since Linux counts those per (user namespace, uid), each sandbox gets its own
counter: a fork bomb in one cannot starve the others, although all run as one host uid. When the
daemon runs as root, the whole chain first drops to an unprivileged uid (one per thread with
``uid_range``), so even a namespace escape lands as a nobody.

Nothing outlives a command: bwrap is the pid namespace's init, so when the command ends (or we kill
bwrap on timeout) the kernel kills every process left inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import quota as disk
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
from .owners import UidPool, make_root, traversal_problem
from .paths import OUTPUTS, SKILLS, UPLOADS, WORKSPACE, SandboxError, ThreadDirs

log = logging.getLogger(__name__)

MAX_COMMAND_BYTES = 100_000  # one argv string may not exceed 128 KiB (MAX_ARG_STRLEN)
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Read-only host /etc files programs commonly need; nothing with secrets or host identity.
_ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "os-release",
    "mime.types",
    "ssl/certs",
    "ca-certificates.conf",
    "bash.bashrc",
    "inputrc",
)
_SYS_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Run both outside and inside the sandbox, which shows the host's /usr, /bin and /sbin read-only.
_PRLIMIT = shutil.which("prlimit", path="/usr/bin:/bin:/usr/sbin:/sbin") or "/usr/bin/prlimit"
_SIGPENDING = 4096
_MSGQUEUE = 819200  # bytes, the kernel's default


def sandbox_env(home: str = WORKSPACE) -> dict[str, str]:
    """The complete environment of sandboxed code: nothing of the daemon's."""
    return {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8"}


async def run_capped(
    argv: list[str],
    *,
    timeout: float,  # noqa: ASYNC109 - the command's limit, not ours
    max_output: int,
    kwargs: dict[str, Any],
    watchdog: Callable[[], Awaitable[str]] | None = None,
) -> ExecResult:
    """Run ``argv`` in a new session, capture stdout+stderr capped, kill the group on timeout.

    ``watchdog`` (the disk quota's) races the command: when it returns a reason first, the group
    is killed and the reason closes the output (``ExecResult.stopped``). Cancellation (a user's
    /stop) kills the process group too before re-raising.
    """
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        **kwargs,
    )
    cap = OutputCap(max_output)
    assert proc.stdout is not None
    stdout = proc.stdout

    async def pump() -> None:
        while chunk := await stdout.read(65536):
            cap.feed(chunk)

    reader = asyncio.ensure_future(pump())
    dog = asyncio.ensure_future(watchdog()) if watchdog is not None else None
    timed_out, stopped = False, None
    try:
        done, _ = await asyncio.wait(
            {reader} if dog is None else {reader, dog}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if reader in done:
            reader.result()
        else:
            if dog is not None and dog in done:
                stopped = dog.result()
            else:
                timed_out = True
            _killpg(proc.pid)
            # The namespace dies with bwrap; drain what is left, bounded.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await reader
        async with asyncio.timeout(10):
            rc = await proc.wait()
    except BaseException:
        _killpg(proc.pid)
        reader.cancel()
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    finally:
        if dog is not None:
            dog.cancel()
    if stopped is not None:
        return ExecResult(None, cap.text() + disk.stopped_note(stopped), cap.truncated, False, stopped)
    return ExecResult(None if timed_out else rc, cap.text(), cap.truncated, timed_out)


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class LocalSandbox(Sandbox):
    def __init__(self, provider: LocalProvider, dirs: ThreadDirs, owner: tuple[int, int] | None) -> None:
        super().__init__(dirs, owner, provider.quota)
        self.provider = provider

    async def exec(
        self,
        command: str,
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - the command's limit, not ours
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        self.touch()
        if len(command.encode()) > MAX_COMMAND_BYTES:
            raise SandboxError(
                f"command longer than {MAX_COMMAND_BYTES} bytes; write a script file and run that"
            )
        p = self.provider
        kwargs: dict[str, Any] = {"env": dict(_HOST_ENV), "cwd": "/"}
        if self.owner is not None:
            kwargs.update(user=self.owner[0], group=self.owner[1], extra_groups=[])
        if p.bwrap is None and not p.allow_unsandboxed:
            raise SandboxUnavailable(
                "command execution is disabled: bubblewrap (bwrap) is not installed on this host. "
                "Install it (apt-get install bubblewrap) or use the docker sandbox provider."
            )
        await disk.before_command(self.dirs, self.quota)
        watchdog = functools.partial(disk.watch, self.dirs, self.quota)
        if p.bwrap is None:
            kwargs.update(env=sandbox_env(str(self.dirs.workspace)), cwd=str(self.dirs.workspace))
            # No user namespace here: the process limit is the host uid's, shared (development only).
            argv = [*p.prlimit_args(), *p.counted_limits(), "--", "/bin/bash", "-c", command]
            res = await run_capped(
                argv, timeout=timeout, max_output=max_output, kwargs=kwargs, watchdog=watchdog
            )
            return await self._noted(res)
        # bwrap options go through a pipe (--args) so the sandbox's /proc/1/cmdline does not
        # reveal host paths; only the user's own command stays visible to it.
        options = "\0".join(p.bwrap_options(self.dirs)) + "\0"
        rfd, wfd = os.pipe()
        try:
            os.write(wfd, options.encode())  # a few KiB: fits the pipe buffer without a reader
        finally:
            os.close(wfd)
        inner = [_PRLIMIT, *p.counted_limits(), "--", "/bin/bash", "-c", command]
        argv = [*p.prlimit_args(), "--", p.bwrap, "--args", str(rfd), *inner]
        try:
            res = await run_capped(
                argv,
                timeout=timeout,
                max_output=max_output,
                kwargs={**kwargs, "pass_fds": (rfd,)},
                watchdog=watchdog,
            )
        finally:
            os.close(rfd)
        return await self._noted(res)

    async def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        network: bool = False,
        memory_mb: int | None = None,
        max_line: int = 1024 * 1024,
    ) -> asyncio.subprocess.Process:
        """A long-lived process under the same bubblewrap boundary as ``exec`` (docs/sandbox.md):
        only bubblewrap, never unsandboxed (a coding agent on the bare host would see everything).
        Its options, the environment's values included, go through a pipe, never argv."""
        self.touch()
        p = self.provider
        if p.bwrap is None:
            raise SandboxUnavailable(
                "coding agents need bubblewrap (bwrap), which is not installed on this host"
            )
        await disk.before_command(self.dirs, self.quota)
        kwargs: dict[str, Any] = {"env": dict(_HOST_ENV), "cwd": "/"}
        if self.owner is not None:
            kwargs.update(user=self.owner[0], group=self.owner[1], extra_groups=[])
        options = "\0".join(p.bwrap_options(self.dirs, env=env, network=network)) + "\0"
        rfd, wfd = os.pipe()
        try:
            os.write(wfd, options.encode())
        finally:
            os.close(wfd)
        inner = [_PRLIMIT, *p.counted_limits(), "--", *argv]
        outer = [*p.prlimit_args(memory_mb), "--", p.bwrap, "--args", str(rfd), *inner]
        try:
            return await asyncio.create_subprocess_exec(
                *outer,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                limit=max_line,
                pass_fds=(rfd,),
                **kwargs,
            )
        finally:
            os.close(rfd)

    async def _noted(self, res: ExecResult) -> ExecResult:
        """Tell the model at once when this command left the thread without room."""
        if res.stopped is not None:
            return res
        note = await disk.after_command(self.dirs, self.quota)
        if note is None:
            return res
        return ExecResult(res.exit_code, f"{res.output}\n{note}", res.truncated, res.timed_out)


class LocalProvider(SandboxProvider):
    """Bubblewrap sandboxes on this host. Cheap: nothing runs between commands."""

    def __init__(
        self,
        root: Path | str,
        skills_dir: Path | str | None = None,
        *,
        limits: SandboxLimits | None = None,
        uid: int = 1000,
        gid: int = 1000,
        idle_timeout: float = 1800.0,
        allow_unsandboxed: bool = False,
        bwrap: str | None = "auto",
        min_free_mb: int = disk.DEFAULT_MIN_FREE_MB,
        uid_range: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(idle_timeout)
        self.root = Path(root).resolve()
        self.skills_dir = Path(skills_dir).resolve() if skills_dir else None
        self.limits = limits or SandboxLimits()
        self.bwrap = shutil.which("bwrap") if bwrap == "auto" else bwrap
        self.allow_unsandboxed = allow_unsandboxed
        self.uid, self.gid = uid, gid
        as_root = os.geteuid() == 0
        # Drop privileges only when we have them; otherwise commands run as the daemon's own uid.
        self.run_as: tuple[int, int] | None = (uid, gid) if as_root else None
        self.uids = UidPool(self.root, *uid_range) if uid_range and as_root else None
        self.quota = disk.DiskQuota.from_limits(self.limits, min_free_mb)
        disk.register(self.root, self.quota)
        self._sandboxes: dict[str, LocalSandbox] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        make_root(self.root, self.run_as)
        self._etc = self._write_etc()
        if self.run_as is not None:
            # What ThreadDirs.ensure creates (0711 root and threads/) must pass this, restart or not.
            probe = (self.uids.first, self.uids.first) if self.uids else self.run_as
            problem = traversal_problem(self.root, *probe)
            if problem is None and self.skills_dir is not None:
                problem = traversal_problem(self.skills_dir, *probe, read=True)
            if problem is not None:
                raise SandboxUnavailable(problem)

    def _write_etc(self) -> Path:
        """Synthetic passwd/group/hosts: programs need them, the host's must stay hidden."""
        etc = self.root / "etc"
        etc.mkdir(exist_ok=True)
        files = {
            "passwd": f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"sandbox:x:{self.uid}:{self.gid}:sandbox:{WORKSPACE}:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "group": f"root:x:0:\nsandbox:x:{self.gid}:\nnogroup:x:65534:\n",
            "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n",
            "hostname": "sandbox\n",
            "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
            "nsswitch-net.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
        }
        for name, text in files.items():
            path = etc / name
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            os.chmod(path, 0o644)
        os.chmod(etc, 0o755)
        return etc

    def prlimit_args(self, memory_mb: int | None = None) -> list[str]:
        """Per-process rlimits, set before bwrap (and inherited by everything in the sandbox).

        Not the process count: RLIMIT_NPROC is counted per user, so set out here it would be one
        budget for every sandbox of the host uid (see ``counted_limits``). The file size limit
        never exceeds the disk quota, so no single file overshoots it.
        """
        lim = self.limits
        mb = 1024 * 1024
        return [
            _PRLIMIT,
            f"--fsize={min(lim.file_size_mb, lim.disk_mb) * mb}",
            f"--cpu={lim.cpu_seconds}",
            f"--as={(memory_mb or lim.memory_mb) * mb}",
            f"--nofile={lim.open_files}",
            "--core=0",
        ]

    def counted_limits(self) -> list[str]:
        """The rlimits the kernel counts per user, for a ``prlimit`` run inside the sandbox.

        Linux counts processes, pending signals and message-queue bytes per (user namespace,
        uid) and checks each namespace level against its own limit: set inside bwrap's fresh user
        namespace, they give every sandbox a counter of its own, while bwrap itself runs with the
        daemon's (high) limits, which then bound only the host uid's total.
        """
        return [f"--nproc={self.limits.pids}", f"--sigpending={_SIGPENDING}", f"--msgqueue={_MSGQUEUE}"]

    def bwrap_options(
        self, dirs: ThreadDirs, *, env: Mapping[str, str] | None = None, network: bool = False
    ) -> list[str]:
        """``env``: more variables for the process (a coding agent's own key, never a command's);
        ``network``: keep the host's network namespace (and resolve names with its DNS)."""
        opts = [
            "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox",
            "--uid", str(self.uid), "--gid", str(self.gid),
            "--ro-bind", "/usr", "/usr",
        ]  # fmt: skip
        for d in _SYS_DIRS:
            if os.path.islink(d):
                opts += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                opts += ["--ro-bind", d, d]
        for name in ("passwd", "group", "hosts", "hostname", "nsswitch.conf"):
            source = "nsswitch-net.conf" if network and name == "nsswitch.conf" else name
            opts += ["--ro-bind", str(self._etc / source), f"/etc/{name}"]
        if network:
            opts += ["--share-net", "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
        for name in _ETC_FILES:
            opts += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        mb = 1024 * 1024
        opts += [
            # bwrap's /dev is a tmpfs the sandbox user owns, as big as half the RAM: capped
            # /dev/shm inside it, then made read-only (device nodes stay usable).
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(self.limits.tmp_size_mb * mb), "--tmpfs", "/dev/shm",
            "--remount-ro", "/dev",
            "--size", str(self.limits.tmp_size_mb * mb), "--tmpfs", "/tmp",
            "--bind", str(dirs.workspace), WORKSPACE,
            "--bind", str(dirs.uploads), UPLOADS,
            "--bind", str(dirs.outputs), OUTPUTS,
        ]  # fmt: skip
        if dirs.skills is not None:
            opts += ["--ro-bind", str(dirs.skills), SKILLS]
        opts += ["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv"]
        for key, value in {**(env or {}), **sandbox_env()}.items():
            opts += ["--setenv", key, value]
        return opts

    def owner_for(self, thread_id: str) -> tuple[int, int] | None:
        """Blocking when ``uid_range`` is on (it may scan the threads dir): call from a worker."""
        if self.uids is None:
            return self.run_as
        return self.uids.owner(ThreadDirs.for_thread(self.root, thread_id, self.skills_dir))

    async def acquire(self, thread_id: str) -> LocalSandbox:
        async with self._locks.setdefault(thread_id, asyncio.Lock()):
            sb = self._sandboxes.get(thread_id)
            if sb is None:
                dirs = ThreadDirs.for_thread(self.root, thread_id, self.skills_dir)
                owner = self.run_as
                if self.uids is not None:
                    owner = await asyncio.to_thread(self.uids.owner, dirs)
                await asyncio.to_thread(dirs.ensure, owner)
                sb = self._sandboxes[thread_id] = LocalSandbox(self, dirs, owner)
            sb.touch()
            return sb

    async def release(self, thread_id: str) -> None:
        sb = self._sandboxes.get(thread_id)
        if sb is not None:
            sb.touch()

    async def reap_idle(self) -> list[str]:
        # Nothing runs between commands; forgetting the object is all there is to reap.
        cutoff = time.monotonic() - self.idle_timeout
        gone = [t for t, sb in self._sandboxes.items() if sb.last_used < cutoff]
        for t in gone:
            del self._sandboxes[t]
            lock = self._locks.get(t)
            if lock is not None and not lock.locked():
                del self._locks[t]  # the lock map must not grow with every thread ever seen
        return gone

    async def reconcile(self) -> None:
        """Nothing survives a restart (bwrap dies with its parent); only check the host."""
        if self.bwrap is None:
            log.warning(
                "bubblewrap not found: sandbox commands are %s",
                "run UNSANDBOXED" if self.allow_unsandboxed else "refused",
            )

    async def close(self) -> None:
        await super().close()
        self._sandboxes.clear()
