"""The ``local`` provider: each command runs in a fresh bubblewrap sandbox on this host.

Per command: ``prlimit`` sets rlimits, then ``bwrap`` unshares every namespace (no network, own
pid namespace), shows a read-only minimum of the system (/usr and its symlinks, a few /etc files,
a synthetic passwd), binds the thread's dirs at their virtual paths, mounts /tmp as tmpfs and runs
``bash -c`` with a clean environment. When the daemon runs as root, the whole chain first drops to
an unprivileged uid, so even a namespace escape lands as a nobody and the process limit counts.

Nothing outlives a command: bwrap is the pid namespace's init, so when the command ends (or we kill
bwrap on timeout) the kernel kills every process left inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

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


def sandbox_env(home: str = WORKSPACE) -> dict[str, str]:
    """The complete environment of sandboxed code: nothing of the daemon's."""
    return {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8"}


async def run_capped(
    argv: list[str],
    *,
    timeout: float,  # noqa: ASYNC109 - the command's limit, not ours
    max_output: int,
    kwargs: dict[str, Any],
) -> ExecResult:
    """Run ``argv`` in a new session, capture stdout+stderr capped, kill the group on timeout.

    Cancellation (a user's /stop) kills the process group too before re-raising.
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

    timed_out = False
    try:
        try:
            await asyncio.wait_for(pump(), timeout)
        except TimeoutError:
            timed_out = True
            _killpg(proc.pid)
            # The namespace dies with bwrap; drain what is left, bounded.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pump(), 5)
        rc = await asyncio.wait_for(proc.wait(), 10)
    except BaseException:
        _killpg(proc.pid)
        with contextlib.suppress(Exception):
            await asyncio.shield(proc.wait())
        raise
    return ExecResult(None if timed_out else rc, cap.text(), cap.truncated, timed_out)


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class LocalSandbox(Sandbox):
    def __init__(self, provider: LocalProvider, dirs: ThreadDirs) -> None:
        super().__init__(dirs, provider.run_as)
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
        if p.run_as is not None:
            kwargs.update(user=p.run_as[0], group=p.run_as[1], extra_groups=[])
        if p.bwrap is None:
            if not p.allow_unsandboxed:
                raise SandboxUnavailable(
                    "command execution is disabled: bubblewrap (bwrap) is not installed on this host. "
                    "Install it (apt-get install bubblewrap) or use the docker sandbox provider."
                )
            kwargs.update(env=sandbox_env(str(self.dirs.workspace)), cwd=str(self.dirs.workspace))
            argv = [*p.prlimit_args(), "/bin/bash", "-c", command]
            return await run_capped(argv, timeout=timeout, max_output=max_output, kwargs=kwargs)
        # bwrap options go through a pipe (--args) so the sandbox's /proc/1/cmdline does not
        # reveal host paths; only the user's own command stays visible to it.
        options = "\0".join(p.bwrap_options(self.dirs)) + "\0"
        rfd, wfd = os.pipe()
        try:
            os.write(wfd, options.encode())  # a few KiB: fits the pipe buffer without a reader
        finally:
            os.close(wfd)
        argv = [*p.prlimit_args(), p.bwrap, "--args", str(rfd), "/bin/bash", "-c", command]
        try:
            return await run_capped(
                argv, timeout=timeout, max_output=max_output, kwargs={**kwargs, "pass_fds": (rfd,)}
            )
        finally:
            os.close(rfd)


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
    ) -> None:
        super().__init__(idle_timeout)
        self.root = Path(root).resolve()
        self.skills_dir = Path(skills_dir).resolve() if skills_dir else None
        self.limits = limits or SandboxLimits()
        self.bwrap = shutil.which("bwrap") if bwrap == "auto" else bwrap
        self.allow_unsandboxed = allow_unsandboxed
        self.uid, self.gid = uid, gid
        # Drop privileges only when we have them; otherwise commands run as the daemon's own uid.
        self.run_as: tuple[int, int] | None = (uid, gid) if os.geteuid() == 0 else None
        self._sandboxes: dict[str, LocalSandbox] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        self._etc = self._write_etc()
        if self.run_as is not None and self.bwrap is not None:
            for p in (self.root, self.skills_dir):
                if p is not None and not _reachable(p, *self.run_as):
                    raise SandboxUnavailable(
                        f"sandbox uid {uid} cannot reach {p}: make its parent dirs traversable (o+x) "
                        "or choose another sandbox root"
                    )

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
        }
        for name, text in files.items():
            path = etc / name
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            os.chmod(path, 0o644)
        os.chmod(etc, 0o755)
        return etc

    def prlimit_args(self) -> list[str]:
        lim = self.limits
        mb = 1024 * 1024
        prlimit = shutil.which("prlimit") or "/usr/bin/prlimit"
        return [
            prlimit,
            f"--nproc={lim.pids}",
            f"--fsize={lim.file_size_mb * mb}",
            f"--cpu={lim.cpu_seconds}",
            f"--as={lim.memory_mb * mb}",
            f"--nofile={lim.open_files}",
            "--core=0",
            "--",
        ]

    def bwrap_options(self, dirs: ThreadDirs) -> list[str]:
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
            opts += ["--ro-bind", str(self._etc / name), f"/etc/{name}"]
        for name in _ETC_FILES:
            opts += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        mb = 1024 * 1024
        opts += [
            "--proc", "/proc", "--dev", "/dev",
            "--size", str(self.limits.tmp_size_mb * mb), "--tmpfs", "/tmp",
            "--bind", str(dirs.workspace), WORKSPACE,
            "--bind", str(dirs.uploads), UPLOADS,
            "--bind", str(dirs.outputs), OUTPUTS,
        ]  # fmt: skip
        if dirs.skills is not None:
            opts += ["--ro-bind", str(dirs.skills), SKILLS]
        opts += ["--remount-ro", "/", "--chdir", WORKSPACE, "--clearenv"]
        for key, value in sandbox_env().items():
            opts += ["--setenv", key, value]
        return opts

    def owner_for(self, thread_id: str) -> tuple[int, int] | None:
        return self.run_as

    async def acquire(self, thread_id: str) -> LocalSandbox:
        sb = self._sandboxes.get(thread_id)
        if sb is None:
            dirs = ThreadDirs.for_thread(self.root, thread_id, self.skills_dir)
            await asyncio.to_thread(dirs.ensure, self.run_as)
            sb = self._sandboxes[thread_id] = LocalSandbox(self, dirs)
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


def _reachable(path: Path, uid: int, gid: int) -> bool:
    """Can ``uid:gid`` traverse every directory down to ``path`` (and list ``path``)?"""
    chain = [*reversed(path.parents), path]
    for i, d in enumerate(chain):
        try:
            st = os.stat(d)
        except OSError:
            return False
        need = 0o5 if i == len(chain) - 1 else 0o1
        if st.st_uid == uid:
            bits = (st.st_mode >> 6) & 0o7
        elif st.st_gid == gid:
            bits = (st.st_mode >> 3) & 0o7
        else:
            bits = st.st_mode & 0o7
        if bits & need != need:
            return False
    return True
