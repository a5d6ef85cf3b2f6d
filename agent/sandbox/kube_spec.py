"""What the ``kubernetes`` provider asks the cluster for: names, the pod, its claim, the policies.

Plain data (dicts as the API takes them), no client: the guarantees of docs/sandbox.md are read
here in one place, and tested without a cluster. The provider (kubernetes_provider.py) sends them.

Names carry the first 16 hex digits of the SHA-256 of the thread id (as the shared Docker mode's),
so any id maps to a valid object name and label value; the raw id is only an annotation.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from .config import SandboxLimits
from .local import sandbox_env
from .paths import USER_DATA

SANDBOX = "chital/sandbox"
THREAD_HASH = "chital/thread-hash"
NETWORK = "chital/network"
THREAD = "chital/thread"
SPEC_HASH = "chital/spec-hash"
LAST_USED = "chital/last-used"
CONTAINER = "sandbox"
DENY_POLICY = "chital-sandbox-deny"
INGRESS_POLICY = "chital-sandbox-no-ingress"


def thread_key(thread_id: str) -> str:
    return hashlib.sha256(thread_id.encode()).hexdigest()[:16]


def pod_name(thread_id: str) -> str:
    return "chital-sbx-" + thread_key(thread_id)


def claim_name(thread_id: str) -> str:
    return "chital-ws-" + thread_key(thread_id)


def labels(thread_id: str, network: bool) -> dict[str, str]:
    return {SANDBOX: "1", THREAD_HASH: thread_key(thread_id), NETWORK: "on" if network else "off"}


def stamp() -> str:
    """The ``chital/last-used`` value: Unix seconds (the daemons' clocks are kept in sync, as
    the lease already needs)."""
    return f"{time.time():.3f}"


def claim(thread_id: str, size: str, storage_class: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    meta = {
        "name": claim_name(thread_id),
        "labels": {SANDBOX: "1", THREAD_HASH: thread_key(thread_id)},
        "annotations": {THREAD: thread_id},
    }
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def pod_spec(
    thread_id: str,
    *,
    image: str,
    limits: SandboxLimits,
    uid: int,
    gid: int,
    runtime_class: str | None,
) -> dict[str, Any]:
    """The pod's ``spec``: the locked-down sandbox, the thread's claim at /mnt/user-data.

    No process-count limit here: Kubernetes has none per pod in the spec (it is the kubelet's
    ``podPidsLimit``, node-wide; docs/scale-out.md). The environment is the sandbox's whole
    environment; ``CHITAL_EXEC=idle`` marks every process an exec starts as none of a command's
    until the command's wrapper gives it a marker of its own (docker_scripts.KILLER).
    """
    env = [{"name": k, "value": v} for k, v in {**sandbox_env(), "CHITAL_EXEC": "idle"}.items()]
    memory = f"{limits.memory_mb}Mi"
    container = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sleep", "infinity"],
        "workingDir": "/",
        "env": env,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "privileged": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {
            "limits": {
                "cpu": str(limits.cpus),
                "memory": memory,
                "ephemeral-storage": f"{limits.tmp_size_mb}Mi",
            },
            "requests": {"cpu": "50m", "memory": "64Mi"},
        },
        "volumeMounts": [{"name": "user-data", "mountPath": USER_DATA}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "fsGroup": gid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "user-data", "persistentVolumeClaim": {"claimName": claim_name(thread_id)}},
            {"name": "tmp", "emptyDir": {"sizeLimit": f"{limits.tmp_size_mb}Mi"}},
        ],
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return spec


def spec_hash(spec: dict[str, Any], network: bool) -> str:
    """Sixteen hex digits naming the settings a pod was made with: a daemon finding a pod of other
    settings replaces it (the claim stays)."""
    return hashlib.sha256(json.dumps([spec, network], sort_keys=True).encode()).hexdigest()[:16]


def pod(thread_id: str, spec: dict[str, Any], network: bool) -> dict[str, Any]:
    meta = {
        "name": pod_name(thread_id),
        "labels": labels(thread_id, network),
        "annotations": {THREAD: thread_id, SPEC_HASH: spec_hash(spec, network), LAST_USED: stamp()},
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def same_policy(found: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Does a NetworkPolicy spec read back from the API say what ``wanted`` says? (The API omits
    empty lists and may order ``policyTypes`` its own way.)"""

    def norm(spec: dict[str, Any]) -> tuple[Any, ...]:
        selector = spec.get("podSelector") or {}
        return (
            selector.get("matchLabels") or {},
            selector.get("matchExpressions") or [],
            sorted(spec.get("policyTypes") or []),
            spec.get("ingress") or [],
            spec.get("egress") or [],
        )

    return norm(found) == norm(wanted)


def deny_policy() -> dict[str, Any]:
    """Sandbox pods without network (label chital/network=off): no ingress, no egress."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": DENY_POLICY, "labels": {SANDBOX: "1"}},
        "spec": {
            "podSelector": {"matchLabels": {SANDBOX: "1", NETWORK: "off"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def ingress_policy() -> dict[str, Any]:
    """Sandbox pods made with ``agent.sandbox.network: true`` (chital/network=on): no ingress.
    No policy selects them for Egress, so their egress is open (as Docker's bridge): nothing
    here relies on policies adding up, and a pod of either setting is covered by exactly one."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": INGRESS_POLICY, "labels": {SANDBOX: "1"}},
        "spec": {
            "podSelector": {"matchLabels": {SANDBOX: "1", NETWORK: "on"}},
            "policyTypes": ["Ingress"],
            "ingress": [],
        },
    }


def taken(kind: str, name: str, namespace: str) -> str:
    return (
        f"the sandbox {kind} {name} in namespace {namespace} belongs to another thread (its "
        f"chital/thread annotation differs); refused so no thread reaches another's files"
    )


def pod_state(pod: Any) -> str:
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
