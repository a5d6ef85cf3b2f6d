"""What the kubernetes provider's test modules share besides their fixtures (``k8s``, ``make`` in
tests/conftest.py): the namespace, the workspace, and thread ids with the characters that must not
reach a name, a label or a shell."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from agent.sandbox.kubernetes_provider import KubernetesProvider

WS = "/mnt/user-data/workspace"
NS = "chital"
Make = Callable[..., KubernetesProvider]


def thread_id(name: str = "") -> str:
    return f"slack:T1/{name or 'x'}/../ü {uuid.uuid4().hex[:8]}\n;$(id)"
