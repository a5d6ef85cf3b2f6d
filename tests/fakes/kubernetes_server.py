"""A fake Kubernetes API server on 127.0.0.1 for driving the official ``kubernetes`` client offline.

HTTPS with a throwaway CA and a bearer token (``write_kubeconfig``); core/v1 pods and
persistentvolumeclaims and networking.k8s.io/v1 networkpolicies with the real paths, JSON shapes,
status codes and ``Status`` bodies; ``pods/{name}/exec`` over the websocket channel protocol, each
command in a fresh bubblewrap sandbox built from the pod spec (kubernetes_exec.py). Pods go
Pending → Running once their claims exist; a claim is a directory under ``root/pvcs``.
docs/testing.md "Fake Kubernetes API server" lists what it speaks, its test hooks (``fail``,
``start_delay``, ``hold_pending``, ``kill_pod``, ``requests``, ``exec_argvs``) and what it does not
model (scheduling, nodes, watches, RBAC, resource limits, images, tty).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import secrets
import shutil
import ssl
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.fakes import kubernetes_exec as kexec
from tests.fakes import kubernetes_pods as kpods
from tests.fakes.kubernetes_objects import (
    FIELDS,
    POD_FIELDS,
    ApiError,
    apply_patch,
    field_selector_matches,
    generate_name,
    kubeconfig,
    label_selector_matches,
    make_tls,
    now,
    selector_matches,
    status_body,
    valid_name,
)

KINDS = {
    "pods": ("Pod", "v1"),
    "persistentvolumeclaims": ("PersistentVolumeClaim", "v1"),
    "networkpolicies": ("NetworkPolicy", "networking.k8s.io/v1"),
}
PVC_FINALIZER = "kubernetes.io/pvc-protection"
BODY = web.RequestKey("body", object)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Request:
    """One request as the server saw it (the bearer token is never kept)."""

    method: str
    path: str
    query: list[tuple[str, str]]
    content_type: str
    body: Any
    authorized: bool
    status: int = 0


@dataclass
class _Failure:
    status: int
    message: str
    times: int


@dataclass
class _Pod:
    obj: dict[str, Any]
    dir: Path
    procs: set[asyncio.subprocess.Process] = field(default_factory=set)
    task: asyncio.Task[None] | None = None


class FakeKubernetes:
    """``async with FakeKubernetes(tmp_path) as k8s:``, or ``with FakeKubernetes(root).threaded()``."""

    def __init__(
        self,
        root: Path,
        *,
        token: str = "fake-k8s-token",
        namespace: str = "chital",
        start_delay: float = 0.2,
        tls: bool = True,
        runtime_classes: set[str] | None = None,
        delete_grace: float = 0.0,
    ) -> None:
        self.root = Path(root)
        self.token, self.namespace = token, namespace
        self.namespaces = {"default", namespace}
        self.start_delay = start_delay
        """Seconds from creation to Running (once the pod's PVCs exist)."""
        self.tls = tls
        self.hold_pending = False
        """While True, new pods stay Pending (a slow image pull, a full cluster); False lets them go."""
        self.runtime_classes = runtime_classes
        """RuntimeClasses that exist (None: any ``runtimeClassName`` is accepted)."""
        self.delete_grace = delete_grace
        """Seconds a deleted pod stays (``deletionTimestamp`` set, name taken) before it is gone,
        like a real pod's graceful termination; a DELETE with ``gracePeriodSeconds: 0`` skips it.
        Its processes are killed at once either way."""
        self.requests: list[Request] = []
        self.exec_argvs: list[list[str]] = []
        """The sandbox command line of every exec, in order."""
        self.forged_answers: list[bytes] = []
        """The next file operations' execs (``python3 -I``) print these instead of running, one each."""
        self.raw_answers: dict[str, bytes] = {}
        """``command`` or ``files`` -> bytes: the next exec of that kind is answered with these bytes
        after the upgrade, as they are (a hostile API server; kubernetes_exec.frame builds frames)."""
        self.exec_abandoned = 0
        """Execs whose client went away before the command ended (their process was killed)."""
        self.objects: dict[str, dict[tuple[str, str], Any]] = {k: {} for k in KINDS}
        """resource -> (namespace, name) -> object (pods hold a ``_Pod``)."""
        self._failures: dict[tuple[str, str], list[_Failure]] = {}
        self._rv = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ca_pem = b""
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> FakeKubernetes:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)  # nothing here is for the sandboxes' users to reach by path
        self._loop = asyncio.get_running_loop()
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        for prefix in ("/api/v1", "/apis/networking.k8s.io/v1"):
            app.router.add_route("*", prefix + "/namespaces/{ns}/{resource}", self._collection)
            app.router.add_route("*", prefix + "/namespaces/{ns}/{resource}/{name}", self._item)
            app.router.add_get(prefix + "/namespaces/{ns}/{resource}/{name}/status", self._item)
        app.router.add_route("*", "/api/v1/namespaces/{ns}/pods/{name}/exec", self._exec)
        ctx = None
        if self.tls:
            self.ca_pem, cert, key = make_tls(self.root / "tls")
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(cert, key)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        for pod in list(self.objects["pods"].values()):
            self._end_pod(pod)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeKubernetes:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextlib.contextmanager
    def threaded(self) -> Iterator[FakeKubernetes]:
        """Run on a private event loop in a thread, for tests calling the blocking client."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fake-k8s", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(30)
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(self.stop(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)
            loop.close()

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run a state change on the server's loop (tests may call from another thread)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            return fn()
        try:
            if asyncio.get_running_loop() is loop:
                return fn()
        except RuntimeError:
            pass

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result(30)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path, *, token: str | None = None, namespace: str | None = None) -> Path:
        """A kubeconfig (JSON, which is YAML) for this server: cluster, token user, a context
        with the namespace. ``token`` defaults to the right one."""
        ca = self.ca_pem if self.tls else None
        config = kubeconfig(self.url, ca, token or self.token, namespace or self.namespace)
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path

    # -- test hooks ------------------------------------------------------------------------------
    def fail(
        self, verb: str, resource: str, status: int = 500, *, times: int = 1, message: str | None = None
    ) -> None:
        """The next ``times`` requests ``verb`` (create/get/list/delete/deletecollection/patch/exec) on ``resource``
        (pods, persistentvolumeclaims, networkpolicies) answer ``status`` with a Status body."""
        failure = _Failure(status, message or f"injected failure ({status})", times)
        self._failures.setdefault((verb, resource), []).append(failure)

    def kill_pod(self, name: str, namespace: str | None = None) -> None:
        """Node loss: the pod's processes die and it turns ``Failed`` (it stays until deleted)."""

        def kill() -> None:
            pod = self.objects["pods"][(namespace or self.namespace, name)]
            self._end_pod(pod)
            pod.obj["status"] = kpods.node_lost_status(pod.obj)
            self._bump(pod.obj)

        self._on_loop(kill)

    def pod(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The stored pod object (a copy), or None."""
        pod = self.objects["pods"].get((namespace or self.namespace, name))
        return copy.deepcopy(pod.obj) if pod is not None else None

    def pvc_dir(self, name: str, namespace: str | None = None) -> Path:
        return self.root / "pvcs" / (namespace or self.namespace) / name

    def volume_dir(self, pod: _Pod, volume: dict[str, Any]) -> Path:
        ns = pod.obj["metadata"]["namespace"]
        if "persistentVolumeClaim" in volume:
            return self.pvc_dir(volume["persistentVolumeClaim"]["claimName"], ns)
        path = pod.dir / "emptydir" / volume["name"]
        if not path.is_dir():
            path.mkdir(parents=True)
            path.chmod(0o777)  # the kubelet makes emptyDir world-writable
        return path

    def egress_allowed(self, pod: dict[str, Any]) -> bool:
        """False when a NetworkPolicy of the pod's namespace selects it with ``Egress`` in its
        ``policyTypes`` and no egress rules (deny all); any other policy is taken as allowing."""
        ns, labels = pod["metadata"]["namespace"], pod["metadata"].get("labels")
        for (pns, _), policy in self.objects["networkpolicies"].items():
            spec = policy.get("spec") or {}
            if pns == ns and label_selector_matches(spec.get("podSelector"), labels):
                if "Egress" in (spec.get("policyTypes") or []) and not spec.get("egress"):
                    return False
        return True

    # -- plumbing --------------------------------------------------------------------------------
    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
        authorized = secrets.compare_digest(request.headers.get("Authorization", ""), f"Bearer {self.token}")
        entry = Request(
            request.method, request.path, list(request.query.items()),
            request.headers.get("Content-Type", ""), body, authorized,
        )  # fmt: skip
        self.requests.append(entry)
        request[BODY] = body
        try:
            if not authorized:
                raise ApiError(401, "Unauthorized")
            response = await handler(request)
        except ApiError as e:
            response = web.json_response(
                status_body(e.code, e.message, reason=e.reason, details=e.details), status=e.code
            )
        except web.HTTPNotFound:
            response = web.json_response(
                status_body(404, "the server could not find the requested resource"), status=404
            )
        entry.status = response.status
        return response

    def _fault(self, verb: str, resource: str) -> None:
        queue = self._failures.get((verb, resource))
        if queue:
            failure = queue[0]
            failure.times -= 1
            if failure.times <= 0:
                queue.pop(0)
            raise ApiError(failure.status, failure.message)

    def _bump(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    @staticmethod
    def _resource(request: web.Request) -> str:
        resource = request.match_info["resource"]
        group = "networking.k8s.io/v1" if request.path.startswith("/apis/") else "v1"
        if resource not in KINDS or KINDS[resource][1] != group:
            raise web.HTTPNotFound()
        return resource

    @staticmethod
    def _public(resource: str, stored: Any) -> dict[str, Any]:
        obj = stored.obj if isinstance(stored, _Pod) else stored
        return copy.deepcopy(obj)  # type: ignore[no-any-return]

    # -- REST ------------------------------------------------------------------------------------
    async def _collection(self, request: web.Request) -> web.StreamResponse:
        resource, ns = self._resource(request), request.match_info["ns"]
        kind, api_version = KINDS[resource]
        if request.method in ("GET", "DELETE"):
            self._fault("list" if request.method == "GET" else "deletecollection", resource)
            if request.query.get("watch") in ("true", "1"):
                raise ApiError(400, "the fake Kubernetes server does not model watches")
            labels, fields = request.query.get("labelSelector"), request.query.get("fieldSelector")
            known = POD_FIELDS if resource == "pods" else FIELDS
            items = []
            for (ons, _), stored in sorted(self.objects[resource].items()):
                obj = self._public(resource, stored)
                try:
                    chosen = ons == ns and selector_matches(labels, obj["metadata"].get("labels"))
                    chosen = field_selector_matches(fields, obj, known) and chosen
                except ValueError as e:
                    raise ApiError(400, str(e)) from None
                if chosen:
                    items.append(obj)
            body = {
                "kind": kind + "List",
                "apiVersion": api_version,
                "metadata": {"resourceVersion": str(next(self._rv))},
                "items": items,
            }
            if request.method == "DELETE":  # deletecollection: the selected items, each deleted
                for obj in items:
                    self._delete(resource, ns, obj["metadata"]["name"], request[BODY])
            return web.json_response(body)
        if request.method != "POST":
            raise ApiError(405, "the server does not allow this method on the requested resource")
        self._fault("create", resource)
        return web.json_response(self._create(resource, ns, request[BODY]), status=201)

    def _create(self, resource: str, ns: str, body: Any) -> dict[str, Any]:
        kind, api_version = KINDS[resource]
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        if ns not in self.namespaces:
            raise ApiError(404, f'namespaces "{ns}" not found', details={"name": ns, "kind": "namespaces"})
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name") or (generate_name(meta["generateName"]) if meta.get("generateName") else "")
        if not name:
            raise ApiError(
                422, f'{kind} "" is invalid: metadata.name: Required value: name or generateName is required'
            )
        if not valid_name(name):
            raise ApiError(422, f'{kind} "{name}" is invalid: metadata.name: Invalid value: "{name}"')
        if meta.get("namespace") not in (None, ns):
            raise ApiError(
                400, "the namespace of the provided object does not match the namespace sent on the request"
            )
        if (ns, name) in self.objects[resource]:
            raise ApiError(
                409, f'{resource} "{name}" already exists', "AlreadyExists", {"name": name, "kind": resource}
            )
        obj["kind"], obj["apiVersion"] = kind, api_version
        meta.update(name=name, namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now())
        self._bump(obj)
        if resource == "pods":
            kpods.check_pod(obj, self.runtime_classes)
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            pod = _Pod(obj, self.root / "pods" / ns / name)
            self.objects["pods"][(ns, name)] = pod
            pod.task = asyncio.get_running_loop().create_task(self._start_pod(pod))
        elif resource == "persistentvolumeclaims":
            meta.setdefault("finalizers", [PVC_FINALIZER])
            storage = ((obj.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
            obj["status"] = {
                "phase": "Bound",
                "accessModes": (obj.get("spec") or {}).get("accessModes", ["ReadWriteOnce"]),
                "capacity": {"storage": storage or "1Gi"},
            }
            d = self.pvc_dir(name, ns)
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o777)  # as local-path provisioners make them; fsGroup narrows it per pod
            self.objects[resource][(ns, name)] = obj
        else:
            try:
                label_selector_matches((obj.get("spec") or {}).get("podSelector"), {})
            except ValueError as e:
                raise ApiError(422, f'NetworkPolicy "{name}" is invalid: spec.podSelector: {e}') from None
            self.objects[resource][(ns, name)] = obj
        return self._public(resource, self.objects[resource][(ns, name)])

    async def _item(self, request: web.Request) -> web.StreamResponse:
        resource, ns, name = self._resource(request), request.match_info["ns"], request.match_info["name"]
        stored = self.objects[resource].get((ns, name))
        verb = {"GET": "get", "DELETE": "delete", "PATCH": "patch"}.get(request.method)
        if verb is None:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        self._fault(verb, resource)
        if stored is None:
            raise ApiError(404, f'{resource} "{name}" not found', details={"name": name, "kind": resource})
        if verb == "get":
            return web.json_response(self._public(resource, stored))
        if verb == "patch":
            return web.json_response(self._patch(resource, stored, request))
        return web.json_response(self._delete(resource, ns, name, request[BODY]))

    def _patch(self, resource: str, stored: Any, request: web.Request) -> dict[str, Any]:
        obj = stored.obj if isinstance(stored, _Pod) else stored
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        patched = apply_patch(obj, ctype, request[BODY])
        if resource == "pods" and patched.get("spec") != obj.get("spec"):
            name = obj["metadata"]["name"]
            raise ApiError(
                422,
                f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other than image and tolerations',
            )
        obj["metadata"] = patched["metadata"]
        if resource != "pods":
            obj["spec"] = patched.get("spec")
        self._bump(obj)
        return self._public(resource, stored)

    def _delete(self, resource: str, ns: str, name: str, options: Any) -> dict[str, Any]:
        stored = self.objects[resource][(ns, name)]
        if resource == "pods":
            self._end_pod(stored)
            if "deletionTimestamp" in stored.obj["metadata"]:
                return self._public(resource, stored)  # already terminating
            immediate = isinstance(options, dict) and options.get("gracePeriodSeconds") == 0
            if self.delete_grace <= 0 or immediate:
                self._remove_pod(stored)
                return self._public(resource, stored)
            stored.obj["metadata"]["deletionTimestamp"] = now()
            stored.obj["metadata"]["deletionGracePeriodSeconds"] = int(self.delete_grace)
            self._bump(stored.obj)
            asyncio.get_running_loop().call_later(self.delete_grace, self._remove_pod, stored)
            return self._public(resource, stored)
        if resource == "persistentvolumeclaims":
            stored["metadata"].setdefault("deletionTimestamp", now())
            self._bump(stored)
            body = self._public(resource, stored)
            self._release_pvcs(ns)
            return body
        gone = self.objects[resource].pop((ns, name))
        details = {
            "name": name,
            "group": "networking.k8s.io",
            "kind": resource,
            "uid": gone["metadata"]["uid"],
        }
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}

    def _remove_pod(self, pod: _Pod) -> None:
        ns, name = pod.obj["metadata"]["namespace"], pod.obj["metadata"]["name"]
        if self.objects["pods"].get((ns, name)) is pod:
            del self.objects["pods"][(ns, name)]
            shutil.rmtree(pod.dir, ignore_errors=True)
            self._release_pvcs(ns)

    def _pvc_users(self, ns: str, claim: str) -> list[str]:
        return [
            pname
            for (pns, pname), pod in self.objects["pods"].items()
            if pns == ns
            and any(
                (v.get("persistentVolumeClaim") or {}).get("claimName") == claim
                for v in pod.obj["spec"].get("volumes") or []
            )
        ]

    def _release_pvcs(self, ns: str) -> None:
        """Remove the terminating PVCs no pod uses any more (the pvc-protection finalizer)."""
        for (pns, name), pvc in list(self.objects["persistentvolumeclaims"].items()):
            if pns == ns and "deletionTimestamp" in pvc["metadata"] and not self._pvc_users(ns, name):
                del self.objects["persistentvolumeclaims"][(ns, name)]
                shutil.rmtree(self.pvc_dir(name, ns), ignore_errors=True)

    # -- pod lifecycle ---------------------------------------------------------------------------
    def _missing_claim(self, pod: _Pod) -> str | None:
        ns = pod.obj["metadata"]["namespace"]
        for v in pod.obj["spec"].get("volumes") or []:
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim is None:
                continue
            pvc = self.objects["persistentvolumeclaims"].get((ns, claim))
            if pvc is None:
                return f'persistentvolumeclaim "{claim}" not found'
            if "deletionTimestamp" in pvc["metadata"]:
                return f'persistentvolumeclaim "{claim}" is being deleted'
        return None

    async def _start_pod(self, pod: _Pod) -> None:
        """Pending until the claims exist (re-checked, as the scheduler retries), then Running;
        or stuck in ``CreateContainerConfigError`` when the kubelet would refuse the container."""
        await asyncio.sleep(self.start_delay)
        while self.hold_pending or (why := self._missing_claim(pod)) is not None:
            if self.hold_pending:
                await asyncio.sleep(0.05)
                continue
            if pod.obj["status"].get("conditions") != kpods.unschedulable(why):
                pod.obj["status"]["conditions"] = kpods.unschedulable(why)
                self._bump(pod.obj)
            await asyncio.sleep(0.1)
        refused = kpods.config_error(pod.obj)
        if refused is not None:
            pod.obj["status"] = kpods.waiting_status(pod.obj, "CreateContainerConfigError", refused)
            self._bump(pod.obj)
            return
        pod.dir.mkdir(parents=True, exist_ok=True)
        spec = pod.obj["spec"]
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        for v in spec.get("volumes") or []:
            d = self.volume_dir(pod, v)
            if fs_group is not None:  # the kubelet's volume ownership management
                shutil.chown(d, group=int(fs_group))
                d.chmod(d.stat().st_mode & 0o7777 | 0o2070)  # g+rwxs, as SetVolumeOwnership
        pod.obj["status"] = kpods.running_status(pod.obj)
        self._bump(pod.obj)

    def _end_pod(self, pod: _Pod) -> None:
        if pod.task is not None:
            pod.task.cancel()
        for proc in list(pod.procs):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    # -- exec ------------------------------------------------------------------------------------
    async def _exec(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "POST"):
            raise ApiError(405, "the server does not allow this method on the requested resource")
        self._fault("exec", "pods")
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = self.objects["pods"].get((ns, name))
        if pod is None:
            raise ApiError(404, f'pods "{name}" not found', details={"name": name, "kind": "pods"})
        return await kexec.handle_exec(self, request, pod)
