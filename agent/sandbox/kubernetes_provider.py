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

Commands: kube_exec.py. The client is blocking; every call runs in a worker thread. ``stream()``
swaps the ApiClient's ``call_api`` while it connects, so execs use their own, one connect at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from compat import kubernetes as kcompat

from . import kube_spec as ks
from .base import SandboxProvider
from .config import KubernetesSettings, SandboxLimits
from .engine_exec import IO_SECONDS
from .engine_files import EngineFiles
from .kube_exec import ExecStream, KubernetesSandbox, KubernetesUnavailable, api_problem, own_thread
from .paths import OUTPUTS, UPLOADS, WORKSPACE, PathMapper, SandboxError, ThreadDirs
from .probe import PROBE_THREAD
from .quota import DiskQuota, register

log = logging.getLogger(__name__)

_UNREACHABLE: tuple[type[Exception], ...] = (OSError, kcompat.TransportError)
"""What a REST call raises when the API server cannot be reached or does not answer in time."""

_STDIN_FRAME = 1024 * 1024  # bytes per websocket frame of an exec's stdin
API_SECONDS = 30.0
"""Each REST call's connect and read deadline, and an exec's connect deadline: an API server (or a
proxy in front of it) that accepts and never answers fails the call rather than holding a worker
thread, the thread's lock and, for an exec's connect, every other thread's execs."""


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
        """engine_exec.ExecTransport: an exec's arguments travel in its URL; data goes on stdin."""
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
                    """The configured kubeconfig, else $KUBECONFIG, else in-cluster (the daemon's
                    pod's service account), else ~/.kube/config."""
                    path = self.settings.kubeconfig
                    if path is None and not os.environ.get("KUBECONFIG"):
                        try:
                            cfg = client.Configuration()
                            config.load_incluster_config(client_configuration=cfg)
                            return client.ApiClient(cfg)
                        except config.ConfigException:
                            pass  # not in a cluster: ~/.kube/config
                    # $KUBECONFIG read now, not when the client was imported (its default is).
                    where = str(path) if path else os.environ.get("KUBECONFIG") or None
                    return config.new_client_from_config(config_file=where, context=self.settings.context)

                try:
                    rest, ws = new(), new()
                except Exception as e:  # a missing or unreadable kubeconfig, no context of that name
                    # Only the client's own config errors are quoted: a YAML error would quote
                    # the file's lines, which may hold a token.
                    why = str(e).splitlines()[0][:200] if isinstance(e, config.ConfigException) else ""
                    raise KubernetesUnavailable(
                        f"cannot load the Kubernetes client configuration: {type(e).__name__} {why}".rstrip()
                    ) from None
                kcompat.timed_connect(lambda: API_SECONDS)
                self._clients = (
                    _Timed(client.CoreV1Api(rest)),
                    _Timed(client.NetworkingV1Api(rest)),
                    client.CoreV1Api(ws),
                    ws,
                )
            return self._clients

    def _secrets(self) -> tuple[str, ...]:
        if self._clients is None:
            return ()
        found: list[str] = []
        for cfg in (self._clients[0].api_client.configuration, self._clients[3].configuration):
            # Both clients: each refreshes its own token (a rotating in-cluster one may differ).
            found += [str(v).split()[-1] for v in (cfg.api_key or {}).values() if str(v).split()]
            found.append(cfg.password or "")
        return tuple(found)

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
    ) -> ExecStream:
        """engine_exec.ExecTransport: ``argv`` in the thread's pod over the exec websocket, with
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
        return ExecStream(ws, read_timeout)

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
            name = policy["metadata"]["name"]
            try:
                try:
                    net.create_namespaced_network_policy(self.namespace, policy)
                except ApiException as e:
                    if e.status != 409:
                        raise
                    self._put_right(net, policy)
            except ApiException as e:
                raise self._problem(e, f"cannot create the NetworkPolicy {name}") from None
            except _UNREACHABLE as e:
                raise self._problem(e, f"cannot create the NetworkPolicy {name}") from None
        self._policies = True

    def _put_right(self, net: Any, policy: dict[str, Any]) -> None:
        """A policy of our name that exists (409) is ours only if it says what ours says: one of
        other content (an older release's, an operator's edit) would leave pods of that label
        with a network, so its spec is replaced with ours (a JSON patch of ``/spec``)."""
        name = policy["metadata"]["name"]
        found = net.api_client.sanitize_for_serialization(
            net.read_namespaced_network_policy(name, self.namespace)
        )
        if ks.same_policy(found.get("spec") or {}, policy["spec"]):
            return
        log.warning("the NetworkPolicy %s in %s differed from the sandbox's; replaced", name, self.namespace)
        net.patch_namespaced_network_policy(
            name, self.namespace, [{"op": "replace", "path": "/spec", "value": policy["spec"]}]
        )

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
                if found is not None and (found.metadata.annotations or {}).get(ks.THREAD) != thread_id:
                    raise KubernetesUnavailable(ks.taken("pod", name, self.namespace))
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
                        self._claim_is_ours(thread_id)
                    try:
                        core.create_namespaced_pod(self.namespace, manifest)
                    except ApiException as e:
                        if e.status != 409:  # 409: another daemon made it first; use that one
                            raise
                    continue
                else:
                    state = ks.pod_state(found)
                    if state == "ready":
                        uid = str(found.metadata.uid)
                        if uid not in self._ready:
                            self._prepare(thread_id)
                            self._ready.add(uid)
                        return uid
            except ApiException as e:
                raise self._problem(e, f"cannot make the sandbox pod {name}") from None
            except _UNREACHABLE as e:
                raise self._problem(e, f"cannot make the sandbox pod {name}") from None
            if time.monotonic() > deadline:
                raise KubernetesUnavailable(
                    f"the sandbox pod {name} in namespace {self.namespace} was not Running and ready "
                    f"within {self.settings.start_timeout:g} s (last seen: {state})"
                )
            time.sleep(0.5)

    def _claim_is_ours(self, thread_id: str) -> None:
        """A claim of the thread's name that exists was made for this thread (its
        ``chital/thread``), not for another whose id met this one's on the name's 64 bits."""
        core, _, _, _ = self._api()
        name = ks.claim_name(thread_id)
        found = core.read_namespaced_persistent_volume_claim(name, self.namespace)
        if (found.metadata.annotations or {}).get(ks.THREAD) != thread_id:
            raise KubernetesUnavailable(ks.taken("claim", name, self.namespace))

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
            await own_thread(lambda: self.ensure_pod(key))  # up to start_timeout: a thread of its own
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

        def rm() -> None:
            core, _, _, _ = self._api()
            with contextlib.suppress(ApiException), contextlib.suppress(*_UNREACHABLE):
                core.delete_namespaced_pod(ks.pod_name(key), self.namespace, grace_period_seconds=0)
            with contextlib.suppress(ApiException), contextlib.suppress(*_UNREACHABLE):
                core.delete_namespaced_persistent_volume_claim(ks.claim_name(key), self.namespace)

        try:
            await asyncio.to_thread(rm)
        except KubernetesUnavailable as e:
            log.warning("could not remove the sandbox of %s: %s", key, e)

    async def reap_idle(self) -> list[str]:
        """Delete sandbox pods whose ``chital/last-used`` is older than ``idle_timeout`` (any
        daemon's), and ended ones; claims stay. The delete is conditional on the version read,
        so a pod stamped meanwhile by another daemon is kept (409)."""
        if self.reap_gate is not None and not self.reap_gate():
            return []
        from kubernetes.client.rest import ApiException

        def sweep() -> list[str]:
            core, _, _, _ = self._api()
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
        except _UNREACHABLE as e:
            raise self._problem(e, "cannot list the sandbox pods") from None
        for tid in gone:
            self._sandboxes.pop(tid, None)
        if gone:
            log.info("reaped %d idle kubernetes sandbox pod(s)", len(gone))
        return gone

    async def reconcile(self) -> None:
        """Nothing to adopt: the pods are every daemon's. Check the API, the rights, the policy."""
        from kubernetes.client.rest import ApiException

        def check() -> None:
            core, _, _, _ = self._api()
            try:
                core.list_namespaced_pod(self.namespace, label_selector=f"{ks.SANDBOX}=1", limit=1)
            except ApiException as e:
                raise self._problem(e, f"cannot list pods in namespace {self.namespace}") from None
            except _UNREACHABLE as e:
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


class _Timed:
    """A generated API object whose every call has :data:`API_SECONDS` as its (connect, read)
    deadline unless it names its own: no REST call of this provider can wait forever."""

    def __init__(self, api: Any) -> None:
        self.api_client = api.api_client
        self._api = api

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("_request_timeout", (API_SECONDS, API_SECONDS))
            return method(*args, **kwargs)

        return call
