"""The fake Kubernetes API server (tests/fakes/kubernetes_server.py) driven by the official client.

Everything goes through ``kubernetes.client`` loaded from the kubeconfig the fake writes (HTTPS,
its own CA, a bearer token) and ``kubernetes.stream.stream`` for exec, so what passes here is what
the sandbox provider will see. The exec sandboxes are real bubblewrap sandboxes, so isolation,
uids on the PVC directory and denied egress are checked for real.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.kubernetes_exec import BWRAP, SETPRIV
from tests.fakes.kubernetes_server import FakeKubernetes

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.stream import stream  # noqa: E402

pytestmark = [
    pytest.mark.skipif(BWRAP is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the fake's exec sandboxes drop from root to the pod's uid"),
]

NS = "chital"
UID, GID = 4321, 4321


def wait(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[FakeKubernetes]:
    with FakeKubernetes(tmp_path / "k8s", namespace=NS, start_delay=0.1).threaded() as fake:
        yield fake


def api_client(fake: FakeKubernetes, tmp_path: Path, token: str | None = None) -> client.ApiClient:
    cfg = client.Configuration()
    path = fake.write_kubeconfig(tmp_path / f"kubeconfig-{token or 'ok'}", token=token)
    config.load_kube_config(config_file=str(path), client_configuration=cfg)
    return client.ApiClient(cfg)


@pytest.fixture
def core(k8s: FakeKubernetes, tmp_path: Path) -> Iterator[client.CoreV1Api]:
    with api_client(k8s, tmp_path) as api:
        yield client.CoreV1Api(api)


def pvc(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def pod(name: str, claim: str | None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    if claim is not None:
        volumes.append({"name": "work", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "work", "mountPath": "/workspace"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": "chital-sandbox"}},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"runAsUser": UID, "runAsGroup": GID, "runAsNonRoot": True},
            "containers": [
                {
                    "name": "sandbox",
                    "image": "python:3-slim",
                    "command": ["sleep", "infinity"],
                    "env": [{"name": "GREETING", "value": "hi"}],
                    "workingDir": "/workspace" if claim else "/",
                    "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False},
                    "resources": {"limits": {"memory": "256Mi", "cpu": "500m"}},
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        },
    }


def running(core: client.CoreV1Api, name: str) -> client.V1Pod:
    def ready() -> client.V1Pod | None:
        p = core.read_namespaced_pod(name, NS)
        statuses = p.status.container_statuses or []
        return p if p.status.phase == "Running" and statuses and statuses[0].ready else None

    return wait(ready, f"pod {name} Running")


def run(
    core: client.CoreV1Api, name: str, command: list[str], stdin: bytes | None = None
) -> tuple[bytes, bytes, int]:
    """exec as the provider does it: binary channels, stdin closed (v5) once written."""
    resp = stream(
        core.connect_get_namespaced_pod_exec, name, NS, command=command,
        stdin=stdin is not None, stdout=True, stderr=True, tty=False,
        _preload_content=False, binary=True,
    )  # fmt: skip
    out, err = bytearray(), bytearray()
    if stdin is not None:
        for i in range(0, len(stdin), 1 << 20):
            resp.write_stdin(stdin[i : i + (1 << 20)])
        resp.close_channel(0)
    while resp.is_open():
        resp.update(timeout=1)
        out += resp.read_stdout(timeout=0) if resp.peek_stdout() else b""
        err += resp.read_stderr(timeout=0) if resp.peek_stderr() else b""
    out += resp.read_stdout(timeout=0) if resp.peek_stdout() else b""
    err += resp.read_stderr(timeout=0) if resp.peek_stderr() else b""
    code = resp.returncode
    resp.close()
    return bytes(out), bytes(err), code


@pytest.fixture
def sandbox(k8s: FakeKubernetes, core: client.CoreV1Api) -> str:
    core.create_namespaced_persistent_volume_claim(NS, pvc("work-a", {"chital/thread": "a"}))
    created = core.create_namespaced_pod(
        NS, pod("sb-a", "work-a", {"app": "chital-sandbox", "chital/thread": "a"})
    )
    assert created.status.phase == "Pending"
    running(core, "sb-a")
    return "sb-a"


def test_exec_streams_stdin_stdout_stderr_and_exit_codes(core: client.CoreV1Api, sandbox: str) -> None:
    assert run(core, sandbox, ["cat"], b"hello\n") == (b"hello\n", b"", 0)
    out, err, code = run(
        core,
        sandbox,
        ["python3", "-I", "-c", "import sys; print('out'); sys.stderr.write('err'); sys.exit(3)"],
    )
    assert (out, err, code) == (b"out\n", b"err", 3)
    out, _, code = run(core, sandbox, ["sh", "-c", 'echo "$GREETING $HOSTNAME $(pwd)"; kill -9 $$'])
    assert (out, code) == (b"hi sb-a /workspace\n", 137)
    # The default, preloaded form returns stdout and stderr together, as text.
    said = stream(
        core.connect_get_namespaced_pod_exec,
        sandbox,
        NS,
        command=["echo", "preloaded"],
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
    )
    assert said == "preloaded\n"


def test_exec_carries_megabytes_both_ways(core: client.CoreV1Api, sandbox: str) -> None:
    out, _, code = run(
        core, sandbox, ["python3", "-I", "-c", "import sys; sys.stdout.buffer.write(b'x' * 5_000_000)"]
    )
    assert (len(out), set(out), code) == (5_000_000, {ord("x")}, 0)
    blob = os.urandom(3_000_000)
    digest = "import hashlib, sys; d = sys.stdin.buffer.read(); print(len(d), hashlib.sha256(d).hexdigest())"
    out, _, code = run(core, sandbox, ["python3", "-I", "-c", digest], blob)
    assert (out.decode().split(), code) == ([str(len(blob)), hashlib.sha256(blob).hexdigest()], 0)


def test_files_land_in_the_pvc_directory_as_the_pods_user(
    k8s: FakeKubernetes, core: client.CoreV1Api, sandbox: str
) -> None:
    code = "import os; open('/workspace/note.txt', 'w').write('kept'); print(os.getuid(), os.getgid(), os.getgroups())"
    out, _, rc = run(core, sandbox, ["python3", "-I", "-c", code])
    assert (out.decode().strip(), rc) == (f"{UID} {GID} []", 0)
    note = k8s.pvc_dir("work-a") / "note.txt"
    assert note.read_text() == "kept"
    assert (note.stat().st_uid, note.stat().st_gid) == (UID, GID)
    # readOnlyRootFilesystem: only the volumes are writable.
    flags = (
        "import os; print([bool(os.statvfs(p).f_flag & os.ST_RDONLY) for p in ('/', '/workspace', '/tmp')])"
    )
    assert run(core, sandbox, ["python3", "-I", "-c", flags])[0] == b"[True, False, False]\n"
    # A second exec is a fresh sandbox over the same pod volumes.
    assert run(core, sandbox, ["cat", "/workspace/note.txt"])[0] == b"kept"


def test_the_host_is_not_visible_inside(k8s: FakeKubernetes, core: client.CoreV1Api, sandbox: str) -> None:
    probe = (
        "import os, sys; print(json.dumps([os.path.exists(p) for p in sys.argv[1:]] + [sorted(os.environ)]))"
    )
    paths = ["/root", "/work", str(k8s.root), str(Path(__file__).parent), "/etc/shadow"]
    out, _, rc = run(core, sandbox, ["python3", "-I", "-c", "import json; " + probe, *paths])
    assert rc == 0
    *exists, env = json.loads(out)
    assert exists == [False] * len(paths)
    assert set(env) - {"LC_CTYPE", "PWD"} == {"GREETING", "HOME", "HOSTNAME", "PATH"}  # bwrap sets PWD
    # A private pid namespace: the exec sees only its own processes.
    out, _, _ = run(core, sandbox, ["python3", "-I", "-c", "import os; print(os.getpid(), os.getppid())"])
    assert out.split() == [b"2", b"1"]  # bwrap's init is 1, the command 2 (setpriv execs it)


def test_rest_objects_labels_patch_and_status_errors(
    k8s: FakeKubernetes, core: client.CoreV1Api, sandbox: str, tmp_path: Path
) -> None:
    core.create_namespaced_persistent_volume_claim(NS, pvc("work-b", {"chital/thread": "b"}))
    core.create_namespaced_pod(NS, pod("sb-b", "work-b", {"app": "chital-sandbox", "chital/thread": "b"}))
    generated = core.create_namespaced_pod(NS, {**pod("x", None), "metadata": {"generateName": "gen-"}})
    assert generated.metadata.name.startswith("gen-") and len(generated.metadata.name) == 9

    names = lambda items: sorted(i.metadata.name for i in items)  # noqa: E731
    assert names(core.list_namespaced_pod(NS, label_selector="chital/thread=b").items) == ["sb-b"]
    assert names(core.list_namespaced_pod(NS, label_selector="chital/thread").items) == ["sb-a", "sb-b"]
    assert names(
        core.list_namespaced_pod(NS, label_selector="app=chital-sandbox,chital/thread!=a").items
    ) == ["sb-b"]
    assert names(
        core.list_namespaced_persistent_volume_claim(NS, label_selector="chital/thread in (a,b)").items
    ) == ["work-a", "work-b"]
    core.create_namespaced_pod(NS, pod("sb-p", "no-such-claim"))  # stays Pending
    running(core, "sb-b")
    running(core, generated.metadata.name)
    up = sorted(["sb-a", "sb-b", generated.metadata.name])
    assert names(core.list_namespaced_pod(NS, field_selector="status.phase=Running").items) == up
    assert names(
        core.list_namespaced_pod(NS, field_selector="status.phase!=Running,metadata.name!=x").items
    ) == ["sb-p"]
    assert names(core.list_namespaced_pod(NS, field_selector="metadata.name==sb-b").items) == ["sb-b"]
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod(NS, field_selector="spec.hostname=x")
    assert exc.value.status == 400
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod(NS, watch=True)
    assert exc.value.status == 400

    assert core.read_namespaced_pod_status("sb-a", NS).status.phase == "Running"
    # The spec comes back as submitted.
    got = core.read_namespaced_pod("sb-a", NS)
    assert got.spec.automount_service_account_token is False
    assert got.spec.containers[0].security_context.read_only_root_filesystem is True
    assert got.spec.containers[0].resources.limits == {"memory": "256Mi", "cpu": "500m"}

    core.patch_namespaced_pod("sb-a", NS, {"metadata": {"annotations": {"chital/last-used": "1"}}})
    patched = core.patch_namespaced_pod(
        "sb-a",
        NS,
        {"metadata": {"annotations": {"chital/last-used": "2"}}},
        _content_type="application/merge-patch+json",
    )
    assert patched.metadata.annotations == {"chital/last-used": "2"}
    assert [r.content_type for r in k8s.requests if r.method == "PATCH"] == [
        "application/strategic-merge-patch+json",
        "application/merge-patch+json",
    ]

    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod("sb-a", "work-a"))
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_persistent_volume_claim(NS, pvc("work-a"))
    assert exc.value.status == 409
    for call in (
        lambda: core.read_namespaced_pod("nope", NS),
        lambda: core.delete_namespaced_pod("nope", NS),
        lambda: core.read_namespaced_persistent_volume_claim("nope", NS),
    ):
        with pytest.raises(ApiException) as exc:
            call()
        assert exc.value.status == 404 and json.loads(exc.value.body)["reason"] == "NotFound"

    with api_client(k8s, tmp_path, token="wrong") as bad:
        with pytest.raises(ApiException) as exc:
            client.CoreV1Api(bad).list_namespaced_pod(NS)
    assert exc.value.status == 401 and json.loads(exc.value.body)["reason"] == "Unauthorized"
    with pytest.raises(ApiException) as exc:  # exec is refused at the upgrade
        with api_client(k8s, tmp_path, token="wrong") as bad:
            run(client.CoreV1Api(bad), "sb-a", ["true"])
    assert "401" in str(exc.value)
    assert all(k8s.token not in json.dumps(r.__dict__, default=str) for r in k8s.requests)


def test_deny_all_egress_policy_cuts_the_network(
    k8s: FakeKubernetes, core: client.CoreV1Api, sandbox: str, tmp_path: Path
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[bool] = []

    def accept() -> None:
        listener.settimeout(60)
        with listener, contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                accepted.append(True)
                conn.close()

    threading.Thread(target=accept, daemon=True).start()
    with api_client(k8s, tmp_path) as api:
        net = client.NetworkingV1Api(api)
        net.create_namespaced_network_policy(
            NS,
            {
                "metadata": {"name": "sandbox-deny-egress"},
                "spec": {"podSelector": {"matchLabels": {"chital/net": "off"}}, "policyTypes": ["Egress"]},
            },
        )
        assert [p.metadata.name for p in net.list_namespaced_network_policy(NS).items] == [
            "sandbox-deny-egress"
        ]
        core.create_namespaced_pod(NS, pod("sb-off", None, {"chital/net": "off"}))
        running(core, "sb-off")
        connect = (
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=10); print('connected')"
        )
        out, err, rc = run(core, "sb-off", ["python3", "-I", "-c", connect])
        assert rc == 1 and b"Connection refused" in err and not accepted
        out, err, rc = run(core, sandbox, ["python3", "-I", "-c", connect])
        assert (out, rc) == (b"connected\n", 0), err
        wait(lambda: accepted, "the connection from the pod without a policy")
        # Deleting the policy gives the next exec the network back.
        net.delete_namespaced_network_policy("sandbox-deny-egress", NS)
        assert run(core, "sb-off", ["python3", "-I", "-c", connect])[0] == b"connected\n"


def test_pending_pods_missing_pvcs_kill_and_faults(k8s: FakeKubernetes, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("sb-c", "work-c"))

    def unschedulable() -> Any:
        conds = core.read_namespaced_pod("sb-c", NS).status.conditions or []
        return [c for c in conds if c.reason == "Unschedulable" and "work-c" in c.message]

    wait(unschedulable, "the Unschedulable condition")
    assert core.read_namespaced_pod("sb-c", NS).status.phase == "Pending"
    with pytest.raises(ApiException) as exc:
        run(core, "sb-c", ["true"])
    assert "400" in str(exc.value) and "container not found" in str(exc.value)
    core.create_namespaced_persistent_volume_claim(NS, pvc("work-c"))
    running(core, "sb-c")

    # Deleting a PVC in use leaves it Terminating until its pod goes, then its data goes too.
    core.delete_namespaced_persistent_volume_claim("work-c", NS)
    assert core.read_namespaced_persistent_volume_claim("work-c", NS).metadata.deletion_timestamp is not None
    assert k8s.pvc_dir("work-c").is_dir()

    k8s.kill_pod("sb-c")
    assert core.read_namespaced_pod("sb-c", NS).status.phase == "Failed"
    with pytest.raises(ApiException) as exc:
        run(core, "sb-c", ["true"])
    assert "completed pod" in str(exc.value)
    core.delete_namespaced_pod("sb-c", NS)
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_persistent_volume_claim("work-c", NS)
    assert exc.value.status == 404 and not k8s.pvc_dir("work-c").exists()

    # hold_pending: pods stay Pending until released; deletecollection by label.
    k8s.hold_pending = True
    core.create_namespaced_pod(NS, pod("held", None, {"batch": "x"}))
    core.create_namespaced_pod(NS, pod("held2", None, {"batch": "x"}))
    time.sleep(0.3)  # not a threshold: Pending must hold however long this takes
    assert core.read_namespaced_pod("held", NS).status.phase == "Pending"
    k8s.hold_pending = False
    running(core, "held")
    core.delete_collection_namespaced_pod(NS, label_selector="batch=x")  # answers the deleted list
    assert core.list_namespaced_pod(NS, label_selector="batch").items == []

    k8s.fail("create", "pods", 503, times=1)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_pod(NS, pod("sb-d", None))
    assert exc.value.status == 503
    core.create_namespaced_pod(NS, pod("sb-d", None))
    assert [r.status for r in k8s.requests if r.method == "POST" and r.path.endswith("/pods")][-2:] == [
        503,
        201,
    ]


def test_deleting_the_pod_or_leaving_ends_the_exec(
    k8s: FakeKubernetes, core: client.CoreV1Api, sandbox: str
) -> None:
    resp = stream(
        core.connect_get_namespaced_pod_exec, sandbox, NS, command=["sh", "-c", "echo up; exec sleep 600"],
        stdin=False, stdout=True, stderr=True, tty=False, _preload_content=False,
    )  # fmt: skip
    assert resp.readline_stdout(timeout=30) == "up"
    resp.close()  # the client goes away: the process must not outlive it
    wait(lambda: k8s.exec_abandoned == 1, "the abandoned exec to be killed")
    wait(lambda: not k8s.objects["pods"][(NS, sandbox)].procs, "the process to be gone")

    # The same while output is pouring out and the client has stopped reading.
    resp = stream(
        core.connect_get_namespaced_pod_exec, sandbox, NS, command=["yes"],
        stdin=False, stdout=True, stderr=True, tty=False, _preload_content=False,
    )  # fmt: skip
    wait(lambda: resp.update(timeout=1) or resp.peek_stdout(), "some output")
    resp.close()
    wait(lambda: k8s.exec_abandoned == 2, "the pouring exec to be killed")
    wait(lambda: not k8s.objects["pods"][(NS, sandbox)].procs, "the process to be gone")

    resp = stream(
        core.connect_get_namespaced_pod_exec, sandbox, NS, command=["sh", "-c", "echo up; exec sleep 600"],
        stdin=False, stdout=True, stderr=True, tty=False, _preload_content=False,
    )  # fmt: skip
    assert resp.readline_stdout(timeout=30) == "up"
    core.delete_namespaced_pod(sandbox, NS)
    resp.run_forever(timeout=30)
    assert resp.returncode == 137


def test_exec_wire_protocol_v4_frames_and_status(k8s: FakeKubernetes, sandbox: str, tmp_path: Path) -> None:
    """A protocol detail the official client hides: a v4-only client gets v4, every frame is binary
    with its channel first, and the exit code comes as the kubelet's channel-3 Status."""
    import ssl
    import urllib.parse

    import websocket

    ca = tmp_path / "ca.pem"
    ca.write_bytes(k8s.ca_pem)
    query = urllib.parse.urlencode(
        [
            ("command", "sh"),
            ("command", "-c"),
            ("command", "echo hi; echo oops >&2; exit 2"),
            ("stdout", "true"),
            ("stderr", "true"),
        ]
    )
    url = f"wss://127.0.0.1:{k8s.port}/api/v1/namespaces/{NS}/pods/{sandbox}/exec?{query}"
    sslopt = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": str(ca)}
    auth = [f"Authorization: Bearer {k8s.token}"]
    ws = websocket.create_connection(
        url, header=auth, subprotocols=["v4.channel.k8s.io"], sslopt=sslopt, timeout=30
    )
    assert ws.subprotocol == "v4.channel.k8s.io"
    frames: list[tuple[int, bytes]] = []
    while True:
        opcode, data = ws.recv_data()
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            break
        assert opcode == websocket.ABNF.OPCODE_BINARY
        frames.append((data[0], data[1:]))
    streams = {ch: b"".join(d for c, d in frames if c == ch) for ch in (1, 2)}
    assert streams == {1: b"hi\n", 2: b"oops\n"}
    assert frames[-1][0] == 3
    status = json.loads(frames[-1][1])
    assert (status["status"], status["reason"]) == ("Failure", "NonZeroExitCode")
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "2"}]

    # No channel protocol offered (the pre-v4 "channel.k8s.io"): refused before the upgrade.
    with pytest.raises(websocket.WebSocketBadStatusException) as exc:
        websocket.create_connection(
            url, header=auth, subprotocols=["channel.k8s.io"], sslopt=sslopt, timeout=30
        )
    assert exc.value.status_code == 400


def test_admission_fs_group_graceful_delete_and_more_faults(tmp_path: Path) -> None:
    fake = FakeKubernetes(
        tmp_path / "k8s", namespace=NS, start_delay=0.05, runtime_classes={"runc"}, delete_grace=0.5
    )
    with fake.threaded(), api_client(fake, tmp_path) as api:
        core = client.CoreV1Api(api)
        with pytest.raises(ApiException) as exc:
            core.create_namespaced_pod(
                NS, {**pod("g", None), "spec": {**pod("g", None)["spec"], "runtimeClassName": "gvisor"}}
            )
        assert exc.value.status == 403 and "RuntimeClass" in json.loads(exc.value.body)["message"]

        # runAsNonRoot with no runAsUser: the kubelet refuses the container, the pod stays Pending.
        rootish = pod("rootish", None)
        rootish["spec"]["securityContext"] = {"runAsNonRoot": True}
        core.create_namespaced_pod(NS, rootish)

        def refused() -> bool:
            statuses = core.read_namespaced_pod("rootish", NS).status.container_statuses or []
            return bool(statuses) and statuses[0].state.waiting.reason == "CreateContainerConfigError"

        wait(refused, "CreateContainerConfigError")
        assert core.read_namespaced_pod("rootish", NS).status.phase == "Pending"

        # fsGroup: the volume gets the group (setgid), the process has it as a supplementary group.
        core.create_namespaced_persistent_volume_claim(NS, pvc("shared"))
        grouped = pod("grouped", "shared")
        grouped["spec"]["securityContext"]["fsGroup"] = 5000
        core.create_namespaced_pod(NS, grouped)
        running(core, "grouped")
        out, _, rc = run(
            core, "grouped", ["python3", "-I", "-c", "import os; open('f', 'w'); print(os.getgroups())"]
        )
        assert (out, rc) == (b"[5000]\n", 0)
        st = (fake.pvc_dir("shared") / "f").stat()
        assert (st.st_uid, st.st_gid) == (UID, 5000)

        # JSON patch (a list body) is sent and applied as such.
        core.patch_namespaced_pod(
            "grouped", NS, [{"op": "add", "path": "/metadata/annotations", "value": {"k": "v"}}]
        )
        assert core.read_namespaced_pod("grouped", NS).metadata.annotations == {"k": "v"}
        assert fake.requests[-2].content_type == "application/json-patch+json"

        # Graceful deletion: the name stays taken until the grace period ends.
        gone = core.delete_namespaced_pod("grouped", NS)
        assert gone.metadata.deletion_timestamp is not None
        with pytest.raises(ApiException) as exc:
            core.create_namespaced_pod(NS, grouped)
        assert exc.value.status == 409

        def absent() -> bool:
            try:
                core.read_namespaced_pod("grouped", NS)
            except ApiException as e:
                return e.status == 404
            return False

        wait(absent, "the deleted pod to go")
        core.create_namespaced_pod(NS, grouped)
        core.delete_namespaced_pod("grouped", NS, body=client.V1DeleteOptions(grace_period_seconds=0))
        assert absent()

        # A NetworkPolicy selecting by expression denies egress too; exec faults reach the client.
        net = client.NetworkingV1Api(api)
        expr = {"matchExpressions": [{"key": "app", "operator": "Exists"}]}
        net.create_namespaced_network_policy(
            NS, {"metadata": {"name": "deny"}, "spec": {"podSelector": expr, "policyTypes": ["Egress"]}}
        )
        core.create_namespaced_pod(NS, pod("quiet", None))
        running(core, "quiet")
        out, _, _ = run(core, "quiet", ["python3", "-I", "-c", "import socket; print(socket.if_nameindex())"])
        assert out == b"[(1, 'lo')]\n"
        fake.fail("exec", "pods", 500)
        with pytest.raises(ApiException) as exc:
            run(core, "quiet", ["true"])
        assert "500" in str(exc.value)
        assert run(core, "quiet", ["true"]) == (b"", b"", 0)


async def test_the_asyncio_client_speaks_to_it_too(tmp_path: Path) -> None:
    """kubernetes.aio (aiohttp underneath) on the fake's own loop: REST, and exec over v4, the only
    protocol its WsApiClient offers (so stdin cannot be closed: the command reads a known length)."""
    from kubernetes.aio import client as aclient
    from kubernetes.aio import config as aconfig
    from kubernetes.aio.stream import WsApiClient

    from tests.fakes.polling import poll

    async with FakeKubernetes(tmp_path / "k8s", namespace=NS, start_delay=0.05) as fake:
        cfg = aclient.Configuration()
        await aconfig.load_kube_config(
            config_file=str(fake.write_kubeconfig(tmp_path / "kc")), client_configuration=cfg
        )
        async with aclient.ApiClient(cfg) as api:
            core = aclient.CoreV1Api(api)
            await core.create_namespaced_pod(NS, pod("aio", None))

            async def is_running() -> bool:
                return (await core.read_namespaced_pod("aio", NS)).status.phase == "Running"

            await poll(is_running, 30, "the pod to run")
            with pytest.raises(aclient.ApiException) as exc:
                await core.read_namespaced_pod("nope", NS)
            assert exc.value.status == 404
        async with WsApiClient(cfg) as ws_api:
            wcore = aclient.CoreV1Api(api_client=ws_api)
            connect = await wcore.connect_get_namespaced_pod_exec_without_preload_content(
                "aio",
                NS,
                command=["sh", "-c", "head -c 5; exit 7"],
                stdin=True,
                stdout=True,
                stderr=True,
                tty=False,
            )
            frames: dict[int, bytes] = {}
            async with connect as ws:
                await ws.send_bytes(b"\x00hello, and more")
                async for msg in ws:
                    frames[msg.data[0]] = frames.get(msg.data[0], b"") + msg.data[1:]
            assert frames[1] == b"hello"
            assert WsApiClient.parse_error_data(frames[3]) == 7


def test_sub_path_is_bound_without_following_the_sandboxs_symlinks(
    k8s: FakeKubernetes, core: client.CoreV1Api, sandbox: str
) -> None:
    """The sandbox writes the claim, so a subPath component may be a symlink it planted to reach
    the host (CVE-2017-1002101): the fake refuses the exec rather than bind what it points at."""
    plant = "import os; os.makedirs('/workspace/sub/dir'); open('/workspace/sub/dir/f', 'w').write('in'); os.symlink('/root', '/workspace/evil')"
    assert run(core, sandbox, ["python3", "-I", "-c", plant])[2] == 0
    for name, sub in (("sp-ok", "sub/dir"), ("sp-evil", "evil"), ("sp-deep", "evil/chital-fake-k8s-probe")):
        spec = pod(name, "work-a")
        spec["spec"]["containers"][0]["volumeMounts"].append(
            {"name": "work", "mountPath": "/mnt", "subPath": sub}
        )
        core.create_namespaced_pod(NS, spec)
        running(core, name)
    assert run(core, "sp-ok", ["cat", "/mnt/f"]) == (b"in", b"", 0)
    for name in ("sp-evil", "sp-deep"):
        with pytest.raises(ApiException) as exc:
            run(core, name, ["ls", "/mnt"])
        assert "failed to prepare subPath" in str(exc.value)
    assert not Path("/root/chital-fake-k8s-probe").exists()  # the walk created nothing through the link
