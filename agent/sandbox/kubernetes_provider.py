"""The ``kubernetes`` provider: a thread's sandbox is a pod with a claim, found by name by any daemon.

``agent.sandbox.provider: kubernetes``. The shape of the shared Docker mode (docker_shared.py) on a
cluster: a thread's files live in a PersistentVolumeClaim ``chital-ws-<hash>`` mounted at
``/mnt/user-data`` in the pod ``chital-sbx-<hash>`` (kube_spec.py), both in one namespace, so
whichever daemon runs a turn finds what another made. The API server is the lock: a create of a
taken name is 409, read as "another daemon made it", and that one is used.

Everything goes through the API: commands and file operations are execs over the exec websocket
(``kubernetes.stream``), file operations one exec of engine_script.py each (engine_files.py) with
data on stdin. An exec cannot choose its user here (it runs as the pod's), so the last use is
not a root-owned file as in Docker but an annotation ``chital/last-used`` that the daemon patches
(sandboxed code has no API credentials: no service account token is mounted). The reaper, on the
timers' owner only, deletes pods whose stamp is older than ``idle_timeout``; claims stay.

The client is blocking; every call runs in a worker thread. ``stream()`` swaps the ApiClient's
``call_api`` while it connects, so execs use an ApiClient of their own, one connect at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from compat import kubernetes as kcompat

from . import kube_spec as ks
from .base import (
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxProvider,
    SandboxUnavailable,
)
from .config import KubernetesSettings, SandboxLimits
from .docker_scripts import KILLER, WRAPPER
from .engine_files import IO_SECONDS, EngineFiles
from .local import MAX_COMMAND_BYTES
from .paths import OUTPUTS, UPLOADS, WORKSPACE, PathMapper, SandboxError, ThreadDirs
from .probe import PROBE_THREAD
from .quota import DiskQuota, QuotaExceeded, register, stopped_note

log = logging.getLogger(__name__)

WATCH_EVERY = 2.0  # seconds between disk measurements while a command runs
KILL_GRACE = 30  # the in-pod ``timeout`` fires this long after the daemon's own deadline
_STDIN_FRAME = 1024 * 1024
# The command's shell starts in the workspace (an exec has no working directory of its own).
_WRAPPER = f"cd {WORKSPACE} 2>/dev/null || cd /; " + WRAPPER
# Reads [wrapper, command, killer] from stdin (exactly its length), gives the command /dev/null
# as stdin (a v4 exec's stdin never ends) and becomes the wrapper's shell.
_RUNNER = (
    "import json,os,sys;d=json.loads(sys.stdin.buffer.read(int(sys.argv[1])));"
    "f=os.open('/dev/null',os.O_RDONLY);os.dup2(f,0);os.execv('/bin/sh',['sh','-c',d[0],'chital-exec',d[1],d[2]])"
)


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
        reason = "" if found else type(e).__name__
    message = ""
    body = getattr(e, "body", None)
    if body:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            message = str(json.loads(body).get("message") or "")[:200]
    if status == 401:
        text = f"{what}: the Kubernetes API refused this daemon's credentials (401 Unauthorized)"
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


class _ExecStream:
    """One exec websocket, read frame by frame (compat/kubernetes.py); keeps the final Status."""

    def __init__(self, ws: Any, timeout: float | None) -> None:
        self.ws = ws
        self.timeout = timeout
        self.status: dict[str, Any] | None = None

    def frames(self) -> Iterator[tuple[int, bytes]]:
        for channel, data in kcompat.frames(self.ws, self.timeout):
            if channel == kcompat.ERROR_CHANNEL:
                with contextlib.suppress(ValueError):
                    got = json.loads(data)
                    self.status = got if isinstance(got, dict) else None
                continue
            yield channel, data

    def exit_code(self) -> int | None:
        """The program's exit status from the Status the API sends last; None: none came (the
        connection was cut, e.g. the pod went away)."""
        if self.status is None:
            return None
        if self.status.get("status") == "Success":
            return 0
        for cause in (self.status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                with contextlib.suppress(ValueError, TypeError):
                    return int(cause.get("message"))
        return None

    def close(self) -> None:
        kcompat.abort(self.ws)


class KubernetesSandbox(Sandbox):
    """A thread's pod; its files are in the claim (EngineFiles over the exec websocket)."""

    def __init__(self, provider: KubernetesProvider, dirs: ThreadDirs) -> None:
        super().__init__(dirs, (provider.uid, provider.gid), provider.quota)
        self.provider = provider
        self.files: EngineFiles = EngineFiles(provider, self.mapper, provider.quota)
        self.busy = 0
        self.room_known = False
        """As in the shared Docker mode: the last measurement, after this turn's previous command,
        found room, so the check before the next command is skipped (``acquire`` clears it)."""

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
            if not self.room_known:
                await asyncio.to_thread(self.files.room, 0)
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

    async def _after_command(self) -> str | None:
        self.room_known = False
        try:
            await asyncio.to_thread(self.files.room, 0)
        except QuotaExceeded as e:
            return f"[{e}; further commands are refused until then]"
        except Exception:  # a failed measurement must not fail the command that ran
            log.exception("sandbox quota check after a command in %s failed", self.id)
            return None
        self.room_known = True
        return None

    async def _watch_disk(self) -> str:
        while True:
            await asyncio.sleep(WATCH_EVERY)
            try:
                await asyncio.to_thread(self.files.room, 0)
            except QuotaExceeded as e:
                return str(e)
            except Exception:  # try again next tick
                log.exception("sandbox quota watchdog for %s failed", self.id)

    async def _exec(self, command: str, timeout: float, max_output: int) -> ExecResult:  # noqa: ASYNC109
        marker = uuid.uuid4().hex
        # The in-pod ``timeout`` is the backstop for a daemon that dies or loses the API mid-command:
        # it kills the command's process group KILL_GRACE seconds after the daemon's own deadline.
        # The command and the scripts go on stdin (an exec's arguments travel in its URL).
        script = json.dumps([_WRAPPER, command, KILLER]).encode()
        argv = ["timeout", "-s", "KILL", str(int(timeout) + KILL_GRACE), "env", f"CHITAL_EXEC={marker}"]
        argv += ["python3", "-I", "-c", _RUNNER, str(len(script))]
        p = self.provider
        starting = asyncio.ensure_future(asyncio.to_thread(p.open_exec, self.thread_id, argv, script, None))
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

        def pump() -> None:
            with contextlib.suppress(TimeoutError, OSError):
                for _channel, data in stream.frames():
                    cap.feed(data)

        reader = asyncio.ensure_future(asyncio.to_thread(pump))
        dog = asyncio.ensure_future(self._watch_disk())
        timed_out, stopped = False, None
        try:
            done, _ = await asyncio.wait({reader, dog}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if reader not in done:
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
            return ExecResult(None, cap.text() + stopped_note(stopped), cap.truncated, False, stopped)
        if timed_out:
            return ExecResult(None, cap.text(), cap.truncated, True)
        code = stream.exit_code()
        stream.close()
        if code in (None, 137) and not await asyncio.to_thread(p.pod_running, self.thread_id):
            note = "\n[the sandbox pod went away while the command ran; its files are kept, run it again]"
            return ExecResult(code, cap.text() + note, cap.truncated, False)
        return ExecResult(code, cap.text(), cap.truncated, False)

    async def _kill(
        self, marker: str, reader: asyncio.Future[None] | None = None, stream: Any = None
    ) -> None:
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
            await asyncio.wait_for(asyncio.to_thread(sweep), 30)
        except (TimeoutError, SandboxError, OSError) as e:
            log.warning("sandbox %s: the kill exec failed (%s); the pod's timeout remains", self.id, e)
        if stream is not None:
            stream.close()
        if reader is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(reader, 10)


class KubernetesProvider(SandboxProvider):
    """One pod and one claim per thread in one namespace every daemon uses."""

    def __init__(
        self,
        root: Path | str,
        settings: KubernetesSettings,
        *,
        image: str = "chital-sandbox:latest",
        limits: SandboxLimits | None = None,
        uid: int = 1000,
        gid: int = 1000,
        idle_timeout: float = 1800.0,
        network: bool = False,
        skills_dir: Path | str | None = None,
    ) -> None:
        super().__init__(idle_timeout)
        self.root = Path(root).resolve()
        self.settings = settings
        self.namespace = settings.namespace
        self.limits = limits or SandboxLimits()
        self.uid, self.gid, self.network = uid, gid, network
        self.quota = DiskQuota.from_limits(self.limits, 0)  # the claim's filesystem is the cluster's
        register(self.root, self.quota)
        if skills_dir is not None:
            log.warning("agent.sandbox.skills_dir is not mounted in kubernetes sandboxes (not supported yet)")
        self.image = settings.image or image
        self.stdin_data = True
        """engine_files.ExecTransport: an exec's arguments travel in its URL; data goes on stdin."""
        self._sandboxes: dict[str, KubernetesSandbox] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._clients: tuple[Any, Any, Any, Any] | None = None
        self._connect_lock = threading.Lock()
        self._client_lock = threading.Lock()
        self._policies = False
        self._ready: set[str] = set()  # pod uids whose dirs this daemon made
        self.probe_id = f"{PROBE_THREAD}-{uuid.uuid4().hex[:12]}"

    # --- the client, made on first use ----------------------------------------------------------

    def _api(self) -> tuple[Any, Any, Any, Any]:
        """(CoreV1Api for REST, NetworkingV1Api, CoreV1Api for execs, the execs' ApiClient)."""
        with self._client_lock:
            if self._clients is None:
                from kubernetes import client, config

                def new() -> Any:
                    path = self.settings.kubeconfig
                    if path is None:
                        try:
                            cfg = client.Configuration()
                            config.load_incluster_config(client_configuration=cfg)
                            return client.ApiClient(cfg)
                        except config.ConfigException:
                            pass  # not in a cluster: KUBECONFIG or ~/.kube/config
                    return config.new_client_from_config(
                        config_file=str(path) if path else None, context=self.settings.context
                    )

                try:
                    rest, ws = new(), new()
                except Exception as e:  # a missing or unreadable kubeconfig, no context of that name
                    raise KubernetesUnavailable(
                        f"cannot load the Kubernetes client configuration: {type(e).__name__}: {str(e)[:200]}"
                    ) from None
                self._clients = (
                    client.CoreV1Api(rest),
                    client.NetworkingV1Api(rest),
                    client.CoreV1Api(ws),
                    ws,
                )
            return self._clients

    def _secrets(self) -> tuple[str, ...]:
        if self._clients is None:
            return ()
        cfg = self._clients[3].configuration
        return (*tuple(str(v).split()[-1] for v in (cfg.api_key or {}).values() if v), cfg.password or "")

    def _problem(self, e: BaseException, what: str) -> KubernetesUnavailable:
        return KubernetesUnavailable(api_problem(e, what, self._secrets()))

    def _key(self, thread_id: str) -> str:
        return self.probe_id if thread_id == PROBE_THREAD else thread_id

    def owner_for(self, thread_id: str) -> tuple[int, int] | None:
        return (self.uid, self.gid)

    def files_for(self, thread_id: str) -> EngineFiles:
        dirs = ThreadDirs.for_thread(self.root, self._key(thread_id), None)
        return EngineFiles(self, PathMapper(dirs), self.quota)

    # --- execs ------------------------------------------------------------------------------------

    def open_exec(
        self,
        thread_id: str,
        argv: list[str],
        stdin: bytes | None = None,
        read_timeout: float | None = IO_SECONDS,
        *,
        revive: bool = True,
    ) -> _ExecStream:
        """engine_files.ExecTransport: ``argv`` in the thread's pod over the exec websocket, with
        ``stdin`` written to it; a pod that is gone is made again first (``revive``)."""
        from kubernetes.client.rest import ApiException
        from kubernetes.stream import stream

        _, _, core_ws, _ = self._api()
        name = ks.pod_name(thread_id)

        def start() -> Any:
            with self._connect_lock:  # stream() swaps the ApiClient's call_api while it connects
                return stream(
                    core_ws.connect_get_namespaced_pod_exec,
                    name,
                    self.namespace,
                    container=ks.CONTAINER,
                    command=argv,
                    stdin=stdin is not None,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    binary=True,
                    _preload_content=False,
                )

        try:
            try:
                ws = start()
            except ApiException:
                if not revive:
                    raise
                self.ensure_pod(thread_id)  # reaped, killed or never made: made again, files kept
                ws = start()
        except ApiException as e:
            raise SandboxError(api_problem(e, f"exec in the sandbox pod {name}", self._secrets())) from None
        except KubernetesUnavailable as e:
            raise SandboxError(str(e)) from None
        if stdin is not None:
            try:
                for i in range(0, len(stdin), _STDIN_FRAME):
                    ws.write_channel(0, stdin[i : i + _STDIN_FRAME])
            except Exception as e:
                kcompat.abort(ws)
                raise SandboxError(f"the sandbox's files are unreachable ({type(e).__name__})") from None
        return _ExecStream(ws, read_timeout)

    def pod_running(self, thread_id: str) -> bool:
        """Is the thread's pod there and running (after a command ended by a kill or a cut)?"""
        core, _, _, _ = self._api()
        try:
            pod = core.read_namespaced_pod(ks.pod_name(thread_id), self.namespace)
        except Exception:  # gone, or the API unreachable: either way, not known to be running
            return False
        return pod.metadata.deletion_timestamp is None and pod.status.phase == "Running"

    def stamp(self, thread_id: str) -> None:
        """Patch the pod's ``chital/last-used`` to now (a pod that is gone needs none)."""
        core, _, _, _ = self._api()
        body = {"metadata": {"annotations": {ks.LAST_USED: ks.stamp()}}}
        with contextlib.suppress(Exception):
            core.patch_namespaced_pod(ks.pod_name(thread_id), self.namespace, body)

    # --- the pod, made once in the namespace ---------------------------------------------------

    def ensure_policies(self) -> None:
        """The NetworkPolicies, once per namespace (409: already there): both, whatever this
        daemon's ``network``, so daemons of either setting find their pods covered
        (kube_spec.deny_policy, kube_spec.ingress_policy)."""
        from kubernetes.client.rest import ApiException

        if self._policies:
            return
        _, net, _, _ = self._api()
        for policy in (ks.deny_policy(), ks.ingress_policy()):
            try:
                net.create_namespaced_network_policy(self.namespace, policy)
            except ApiException as e:
                if e.status != 409:
                    raise self._problem(
                        e, f"cannot create the NetworkPolicy {policy['metadata']['name']}"
                    ) from None
        self._policies = True

    def ensure_pod(self, thread_id: str) -> str:
        """The uid of the thread's Running and ready pod, made if missing, replaced if made from
        other settings or ended. Blocking; safe from any thread and any daemon at once."""
        from kubernetes.client.rest import ApiException

        self.ensure_policies()
        core, _, _, _ = self._api()
        name = ks.pod_name(thread_id)
        spec = ks.pod_spec(
            thread_id,
            image=self.image,
            limits=self.limits,
            uid=self.uid,
            gid=self.gid,
            runtime_class=self.settings.runtime_class,
        )
        manifest = ks.pod(thread_id, spec, self.network)
        wanted = manifest["metadata"]["annotations"][ks.SPEC_HASH]
        deadline = time.monotonic() + self.settings.start_timeout
        state = "not made yet"
        while True:
            try:
                try:
                    found = core.read_namespaced_pod(name, self.namespace)
                except ApiException as e:
                    if e.status != 404:
                        raise
                    found = None
                if found is not None and found.metadata.deletion_timestamp is not None:
                    state = "being deleted"
                elif found is not None and (
                    (found.metadata.annotations or {}).get(ks.SPEC_HASH) != wanted
                    or found.status.phase in ("Failed", "Succeeded")
                ):
                    state = f"replaced ({found.status.phase})"
                    with contextlib.suppress(ApiException):  # another daemon may be deleting it too
                        core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
                elif found is None:
                    try:
                        core.create_namespaced_persistent_volume_claim(
                            self.namespace,
                            ks.claim(thread_id, self.settings.volume_size, self.settings.storage_class),
                        )
                    except ApiException as e:
                        if e.status != 409:  # 409: the claim exists (an earlier pod, another daemon)
                            raise
                    try:
                        core.create_namespaced_pod(self.namespace, manifest)
                    except ApiException as e:
                        if e.status != 409:  # 409: another daemon made it first; use that one
                            raise
                    continue
                else:
                    state = _pod_state(found)
                    if state == "ready":
                        uid = str(found.metadata.uid)
                        if uid not in self._ready:
                            self._prepare(thread_id)
                            self._ready.add(uid)
                        return uid
            except ApiException as e:
                raise self._problem(e, f"cannot make the sandbox pod {name}") from None
            if time.monotonic() > deadline:
                raise KubernetesUnavailable(
                    f"the sandbox pod {name} in namespace {self.namespace} was not Running and ready "
                    f"within {self.settings.start_timeout:g} s (last seen: {state})"
                )
            time.sleep(0.5)

    def _prepare(self, thread_id: str) -> None:
        """The three dirs of /mnt/user-data, in a claim that may be new (as the sandbox user; the
        claim's root is group-writable through fsGroup)."""
        argv = ["mkdir", "-p", WORKSPACE, UPLOADS, OUTPUTS]
        s = self.open_exec(thread_id, argv, None, 60.0, revive=False)
        try:
            for _ in s.frames():
                pass
        finally:
            s.close()

    # --- the provider's lifecycle ------------------------------------------------------------------

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def acquire(self, thread_id: str) -> KubernetesSandbox:
        key = self._key(thread_id)
        async with self._lock(key):
            sb = self._sandboxes.get(key)
            if sb is None:
                sb = KubernetesSandbox(self, ThreadDirs.for_thread(self.root, key, None))
                self._sandboxes[key] = sb
            sb.room_known = False  # a new turn: other daemons may have run commands meanwhile
            await asyncio.to_thread(self.ensure_pod, key)
            await asyncio.to_thread(self.stamp, key)
            sb.touch()
            return sb

    async def release(self, thread_id: str) -> None:
        key = self._key(thread_id)
        if key in self._sandboxes:
            self._sandboxes[key].touch()
            await asyncio.to_thread(self.stamp, key)

    async def discard(self, thread_id: str) -> None:
        """Delete the thread's pod and its claim (the start-up probe's)."""
        from kubernetes.client.rest import ApiException

        key = self._key(thread_id)
        self._sandboxes.pop(key, None)
        core, _, _, _ = self._api()

        def rm() -> None:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(ks.pod_name(key), self.namespace, grace_period_seconds=0)
            with contextlib.suppress(ApiException):
                core.delete_namespaced_persistent_volume_claim(ks.claim_name(key), self.namespace)

        await asyncio.to_thread(rm)

    async def reap_idle(self) -> list[str]:
        """Delete sandbox pods whose ``chital/last-used`` is older than ``idle_timeout`` (any
        daemon's), and ended ones; claims stay. The delete is conditional on the version read,
        so a pod stamped meanwhile by another daemon is kept (409)."""
        if self.reap_gate is not None and not self.reap_gate():
            return []
        from kubernetes.client.rest import ApiException

        core, _, _, _ = self._api()

        def sweep() -> list[str]:
            gone = []
            pods = core.list_namespaced_pod(self.namespace, label_selector=f"{ks.SANDBOX}=1").items
            now = time.time()
            for p in pods:
                notes = p.metadata.annotations or {}
                if p.metadata.deletion_timestamp is not None:
                    continue
                try:
                    age = now - float(notes.get(ks.LAST_USED, "0"))
                except ValueError:
                    age = float("inf")
                if age <= self.idle_timeout and p.status.phase not in ("Failed", "Succeeded"):
                    continue
                body = {"preconditions": {"resourceVersion": p.metadata.resource_version}}
                try:
                    core.delete_namespaced_pod(
                        p.metadata.name, self.namespace, body=body, grace_period_seconds=0
                    )
                except ApiException:
                    continue
                gone.append(notes.get(ks.THREAD, p.metadata.name))
            return gone

        try:
            gone = await asyncio.to_thread(sweep)
        except ApiException as e:
            raise self._problem(e, "cannot list the sandbox pods") from None
        for tid in gone:
            self._sandboxes.pop(tid, None)
        if gone:
            log.info("reaped %d idle kubernetes sandbox pod(s)", len(gone))
        return gone

    async def reconcile(self) -> None:
        """Nothing to adopt: the pods are every daemon's. Check the API, the rights, the policy."""
        from kubernetes.client.rest import ApiException

        core, _, _, _ = self._api()

        def check() -> None:
            try:
                core.list_namespaced_pod(self.namespace, label_selector=f"{ks.SANDBOX}=1", limit=1)
            except ApiException as e:
                raise self._problem(e, f"cannot list pods in namespace {self.namespace}") from None
            self.ensure_policies()

        await asyncio.to_thread(check)

    async def close(self) -> None:
        """Leave the pods to the other daemons (and the reaper); close the clients."""
        await self.stop_reaper()
        self._sandboxes = {}
        clients, self._clients = self._clients, None
        if clients is not None:
            for api in {
                id(clients[0].api_client): clients[0].api_client,
                id(clients[3]): clients[3],
            }.values():
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(api.close)


def _pod_state(pod: Any) -> str:
    """ "ready", or what the pod is waiting on (its phase and its container's reason), for the
    error that names what the daemon waited for."""
    status = pod.status
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
    if status.phase == "Running" and ready:
        return "ready"
    why = [str(status.phase)]
    for c in status.container_statuses or []:
        waiting = c.state.waiting if c.state is not None else None
        if waiting is not None and waiting.reason:
            why.append(f"{waiting.reason}: {(waiting.message or '')[:200]}".rstrip(": "))
    return "; ".join(why)
