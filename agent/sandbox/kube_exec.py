"""Commands in a ``kubernetes`` sandbox: the exec websocket, the wrapper, the kill, the caps.

Split from kubernetes_provider.py (the pod's lifecycle). A command is one exec whose program comes
on stdin (an exec's arguments travel in the request URL, which proxies cap near 8 KB): a small
runner reads the wrapper, the command and the killer, gives the command /dev/null as stdin and
becomes the wrapper's shell (docker_scripts.WRAPPER, as in Docker). Every process of the command
carries its marker (``CHITAL_EXEC``); on a timeout, a cancel or the disk quota, the daemon runs
the killer in an exec of its own, then cuts the stream. An in-pod ``timeout`` is the backstop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from compat import kubernetes as kcompat

from .base import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxUnavailable,
    settle,
)
from .docker_scripts import KILLER, WRAPPER
from .engine_files import EngineFiles, EngineRoom
from .local import MAX_COMMAND_BYTES
from .paths import WORKSPACE, SandboxError, ThreadDirs
from .quota import stopped_note

if TYPE_CHECKING:
    from .kubernetes_provider import KubernetesProvider

log = logging.getLogger(__name__)
T = TypeVar("T")

KILL_GRACE = 30  # the in-pod ``timeout`` fires this long after the daemon's own deadline
# The command's shell starts in the workspace (an exec has no working directory of its own).
_WRAPPER = f"cd {WORKSPACE} 2>/dev/null || cd /; " + WRAPPER
# Reads [wrapper, command, killer] from stdin (exactly its length), gives the command /dev/null
# as stdin (a v4 exec's stdin never ends) and becomes the wrapper's shell.
_RUNNER = (
    "import json,os,sys;d=json.loads(sys.stdin.buffer.read(int(sys.argv[1])));"
    "f=os.open('/dev/null',os.O_RDONLY);os.dup2(f,0);os.execv('/bin/sh',['sh','-c',d[0],'chital-exec',d[1],d[2]])"
)


def own_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """``fn`` in a thread of its own, as a future of the running loop.

    For the blocking calls that last as long as a command or a pod's start (reading a command's
    stream, making a pod): on the loop's default executor (min(32, cores + 4) workers) a few of
    them would hold every worker the rest of the daemon's ``to_thread`` calls need."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # handed to the awaiting task, as to_thread would
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="chital-kube-exec", daemon=True).start()
    return fut


class KubernetesUnavailable(SandboxUnavailable):
    """The API refused or could not be reached; the text names what, never a credential."""


def api_problem(e: BaseException, what: str, secrets: tuple[str, ...] = ()) -> str:
    """One line on a failed API call, with the status and the API's own reason, never headers,
    and with any credential this daemon holds cut out (a proxy may echo one back)."""
    status = getattr(e, "status", None)
    reason = str(getattr(e, "reason", "") or "")
    if status == 0 or status is None:  # the websocket handshake: "Handshake status 401 ..."
        found = re.search(r"Handshake status (\d{3})", reason)
        status = int(found.group(1)) if found else None
        timed_out = "timed out" in reason.lower() or isinstance(e, TimeoutError)
        reason = "" if found else "no answer in time" if timed_out else type(e).__name__
    message = ""
    body = getattr(e, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = str(json.loads(body).get("message") or "")[:200]
    if status == 401:
        text = f"{what}: the Kubernetes API refused this daemon's credentials (401 Unauthorized)"
    elif status == 403 and "exceeded quota" in message:
        text = f"{what}: the namespace's ResourceQuota is full (too many sandboxes at once; "
        text += f"idle ones are reaped): {message}"
    elif status == 403:
        text = f"{what}: the Kubernetes API forbids it (403 Forbidden; see the Role in docs/scale-out.md)"
        text += f": {message}" if message else ""
    elif status is None:
        text = f"{what}: the Kubernetes API is unreachable ({reason or type(e).__name__})"
    else:
        text = f"{what}: the Kubernetes API answered {status} {reason}".rstrip() + (
            f": {message}" if message else ""
        )
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text


_STATUS_CAP = 64 * 1024  # the exec's final Status (channel 3): a few hundred bytes from a real API


class ExecStream:
    """One exec websocket, read frame by frame (compat/kubernetes.py); keeps the final Status."""

    def __init__(self, ws: Any, timeout: float | None) -> None:
        self.ws = ws
        self.timeout = timeout
        self._status = bytearray()

    def frames(self) -> Iterator[tuple[int, bytes]]:
        for channel, data in kcompat.frames(self.ws, self.timeout):
            if channel == kcompat.ERROR_CHANNEL:  # the Status, possibly in several frames
                if len(self._status) + len(data) <= _STATUS_CAP:
                    self._status += data
                continue
            yield channel, data

    @property
    def status(self) -> dict[str, Any] | None:
        """The exec's final Status, or None: none came, or not a JSON object (nested past the
        parser's depth included: the API server's answer is read as hostile)."""
        try:
            got = json.loads(bytes(self._status)) if self._status else None
        except (ValueError, RecursionError):
            return None
        return got if isinstance(got, dict) else None

    def exit_code(self) -> int | None:
        """The program's exit status from the Status the API sends last; None: none came (the
        connection was cut, e.g. the pod went away)."""
        status = self.status
        if status is None:
            return None
        if status.get("status") == "Success":
            return 0
        details = status.get("details")
        causes = details.get("causes") if isinstance(details, dict) else None
        for cause in causes if isinstance(causes, list) else []:
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                message = cause.get("message")
                if isinstance(message, str) and re.fullmatch(r"-?[0-9]{1,10}", message):
                    return int(message)
        return None

    def close(self) -> None:
        kcompat.abort(self.ws)


class KubernetesSandbox(EngineRoom, Sandbox):
    """A thread's pod; its files are in the claim (EngineFiles over the exec websocket)."""

    def __init__(self, provider: KubernetesProvider, dirs: ThreadDirs) -> None:
        super().__init__(dirs, (provider.uid, provider.gid), provider.quota)
        self.provider = provider
        self.files: EngineFiles = EngineFiles(provider, self.mapper, provider.quota)
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
        beat = asyncio.ensure_future(self._heartbeat())
        try:
            await self._before_command()
            res = await self._exec(command, timeout, max_output)
            if res.stopped is None and (note := await self._after_command()):
                res = ExecResult(res.exit_code, f"{res.output}\n{note}", res.truncated, res.timed_out)
            return res
        finally:
            beat.cancel()
            self.busy -= 1
            self.touch()

    async def _heartbeat(self) -> None:
        """Stamp the pod while a command runs, so the reaper never takes a busy one."""
        every = min(30.0, self.provider.idle_timeout / 3)
        while True:
            await asyncio.sleep(every)
            await asyncio.to_thread(self.provider.stamp, self.thread_id)

    async def _exec(self, command: str, timeout: float, max_output: int) -> ExecResult:  # noqa: ASYNC109
        marker = uuid.uuid4().hex
        # The in-pod ``timeout`` is the backstop for a daemon that dies or loses the API mid-command:
        # it kills the command's process group KILL_GRACE seconds after the daemon's own deadline.
        # The command and the scripts go on stdin (an exec's arguments travel in its URL).
        script = json.dumps([_WRAPPER, command, KILLER]).encode()
        argv = ["timeout", "-s", "KILL", str(int(timeout) + KILL_GRACE), "env", f"CHITAL_EXEC={marker}"]
        argv += ["python3", "-I", "-c", _RUNNER, str(len(script))]
        p = self.provider
        starting = own_thread(lambda: p.open_exec(self.thread_id, argv, script, None))
        try:
            stream = await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                (await starting).close()
            await asyncio.shield(self._kill(marker))
            raise
        except SandboxError as e:
            raise SandboxUnavailable(str(e)) from None
        cap = OutputCap(max_output)

        def pump() -> bool:
            """Whether the stream ended as streams end (a close, a cut connection), not broken."""
            try:
                for _channel, data in stream.frames():
                    cap.feed(data)
            except kcompat.StreamBroken as e:
                cap.feed(f"\n[{e}; the command was killed]\n".encode())
                return False
            except (TimeoutError, OSError):
                pass
            return True

        reader = own_thread(pump)
        dog = asyncio.ensure_future(self._watch_disk())
        timed_out, stopped = False, None
        try:
            racing: set[asyncio.Future[Any]] = {reader, dog}
            done, _ = await asyncio.wait(racing, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done:
                if dog in done:
                    stopped = dog.result()
                else:
                    timed_out = True
                await self._kill(marker, reader, stream)
            elif not reader.result():  # cut in mid-stream: the command would run on unread
                await self._kill(marker, reader, stream)
        except BaseException:  # cancelled (/stop) or failed: nothing may keep running
            await asyncio.shield(self._kill(marker, reader, stream))
            raise
        finally:
            dog.cancel()
        if stopped is not None:
            return ExecResult(None, cap.text() + stopped_note(stopped), cap.truncated, False, stopped)
        if timed_out:
            return ExecResult(None, cap.text(), cap.truncated, True)
        code = stream.exit_code()
        stream.close()
        if code in (None, 137) and not await asyncio.to_thread(p.pod_running, self.thread_id):
            note = "\n[the sandbox pod went away while the command ran; its files are kept, run it again]"
            return ExecResult(code, cap.text() + note, cap.truncated, False)
        return ExecResult(code, cap.text(), cap.truncated, False)

    async def _kill(self, marker: str, reader: asyncio.Future[Any] | None = None, stream: Any = None) -> None:
        """Kill every process of one command: an exec of the killer (docker_scripts.KILLER) with
        its marker, then the stream is cut. Should that exec fail (the API unreachable), the
        in-pod ``timeout`` still kills the command's group later; what left that group (setsid)
        lives until the pod is reaped or replaced."""
        argv = ["env", "CHITAL_EXEC=killer-" + uuid.uuid4().hex, "python3", "-I", "-c", KILLER, marker]

        def sweep() -> None:
            killer = self.provider.open_exec(self.thread_id, argv, None, 30.0, revive=False)
            try:
                for _ in killer.frames():
                    pass
            finally:
                killer.close()

        try:
            async with asyncio.timeout(30):
                await asyncio.to_thread(sweep)
        except (TimeoutError, SandboxError, OSError) as e:
            log.warning("sandbox %s: the kill exec failed (%s); the pod's timeout remains", self.id, e)
        if stream is not None:
            stream.close()
        if reader is not None:
            await settle(reader, 10)
