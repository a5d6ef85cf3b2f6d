"""Pods for the fake Kubernetes API server: what the API server validates at creation and the
status objects the kubelet would report. Pure functions over the pod's JSON, so the server module
keeps only storage, HTTP and timing.

Statuses follow what ``kubectl get pod -o json`` shows on a real cluster, trimmed to the fields a
client reads: ``phase``, ``conditions`` (``PodScheduled``/``Initialized``/``ContainersReady``/
``Ready``) and one ``containerStatuses`` entry per container with its ``state``.
"""

from __future__ import annotations

import uuid
from pathlib import PurePosixPath
from typing import Any

from tests.fakes.kubernetes_exec import run_as
from tests.fakes.kubernetes_objects import ApiError, now

VOLUME_TYPES = {"persistentVolumeClaim", "emptyDir"}


def check_pod(obj: dict[str, Any], runtime_classes: set[str] | None) -> None:
    """The API server's and admission's refusals the fake models (422 Invalid, 403 Forbidden)."""
    spec = obj.get("spec") or {}
    name = obj["metadata"]["name"]
    if not spec.get("containers"):
        raise ApiError(422, f'Pod "{name}" is invalid: spec.containers: Required value')
    runtime = spec.get("runtimeClassName")
    if runtime is not None and runtime_classes is not None and runtime not in runtime_classes:
        raise ApiError(403, f'pod rejected: RuntimeClass "{runtime}" not found')
    volumes = {}
    for v in spec.get("volumes") or []:
        if not (VOLUME_TYPES & set(v)):
            kinds = sorted(set(v) - {"name"})
            raise ApiError(
                422,
                f'Pod "{name}": volume "{v.get("name")}" ({kinds}): the fake models only {sorted(VOLUME_TYPES)}',
            )
        volumes[v["name"]] = v
    for c in spec["containers"]:
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                raise ApiError(
                    422,
                    f'Pod "{name}" is invalid: spec.containers[].volumeMounts.name: Not found: "{m.get("name")}"',
                )
            sub = PurePosixPath(m.get("subPath") or "")
            if ".." in sub.parts or sub.is_absolute():
                raise ApiError(
                    422,
                    f'Pod "{name}" is invalid: spec.containers[].volumeMounts.subPath: must be a relative path without ".."',
                )


def config_error(obj: dict[str, Any]) -> str | None:
    """Why the kubelet would refuse to start a container (``CreateContainerConfigError``): only
    ``runAsNonRoot`` with an effective uid 0 is modelled (the fake's "image" runs as root)."""
    pod_sc = obj["spec"].get("securityContext") or {}
    for c in obj["spec"]["containers"]:
        non_root = (c.get("securityContext") or {}).get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root and run_as(obj, c)[0] == 0:
            meta = obj["metadata"]
            return (
                "container has runAsNonRoot and image will run as root "
                f'(pod: "{meta["name"]}_{meta["namespace"]}({meta["uid"]})", container: {c["name"]})'
            )
    return None


def container_status(c: dict[str, Any], state: dict[str, Any], *, ready: bool) -> dict[str, Any]:
    status = {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": ready}
    if "waiting" not in state:
        status["containerID"] = "fake://" + uuid.uuid4().hex
    return status | {"started": ready, "restartCount": 0, "state": state}


def unschedulable(why: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": f"0/1 nodes are available: {why}.",
        }
    ]


def waiting_status(obj: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    """Scheduled, but the containers cannot start."""
    state = {"waiting": {"reason": reason, "message": message}}
    return {
        "phase": "Pending",
        "qosClass": "BestEffort",
        "hostIP": "127.0.0.1",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
        ],
        "containerStatuses": [container_status(c, state, ready=False) for c in obj["spec"]["containers"]],
    }


def running_status(obj: dict[str, Any]) -> dict[str, Any]:
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": now()}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    started = {"running": {"startedAt": now()}}
    return {
        "phase": "Running",
        "qosClass": "BestEffort",
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "startTime": now(),
        "conditions": conditions,
        "containerStatuses": [container_status(c, started, ready=True) for c in obj["spec"]["containers"]],
    }


def node_lost_status(obj: dict[str, Any]) -> dict[str, Any]:
    name = obj["metadata"]["name"]
    ended = {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now()}}
    return {
        "phase": "Failed",
        "reason": "NodeLost",
        "message": f"Node fake-node which was running pod {name} is unresponsive",
        "conditions": [{"type": "Ready", "status": "False", "reason": "NodeLost"}],
        "containerStatuses": [container_status(c, ended, ready=False) for c in obj["spec"]["containers"]],
    }
