"""The ``kubernetes`` sandbox provider against our fake API server (tests/fakes/kubernetes_server.py),
driven through the official client: REST for pods, claims and NetworkPolicies, exec over the
websocket channel protocol, each pod's exec a real bubblewrap sandbox built from the pod spec.

Two providers are two daemons: they share a thread's pod and claim; file tools go through execs
and keep the rules of the host file tools; idle pods are reaped, claims kept. No real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.sandbox import SandboxLimits, SandboxUnavailable
from agent.sandbox import kube_spec as ks
from agent.sandbox.config import KubernetesSettings
from agent.sandbox.kubernetes_provider import KubernetesProvider
from agent.sandbox.paths import PathRefused, SandboxError
from agent.sandbox.quota import QuotaExceeded
from tests.fakes.kubernetes_server import FakeKubernetes
from tests.kubernetes_support import NS, WS, Make, thread_id

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="the fake API server runs each pod as a bubblewrap sandbox, started as root",
)


async def test_a_file_written_on_one_daemon_is_read_on_another(make: Make, k8s: FakeKubernetes) -> None:
    a, b = make(), make()
    tid = thread_id()
    sa = await a.acquire(tid)
    res = await sa.exec("echo from-a > made-by-shell.txt && id -u && pwd")
    assert res.exit_code == 0 and res.output.split() == ["1000", WS], res
    await sa.write_file(f"{WS}/notes/tool.txt", "written by the file tool\n")
    await a.release(tid)
    await a.close()  # the first daemon goes away; the pod and the claim stay

    sb = await b.acquire(tid)
    assert (await sb.read_file("made-by-shell.txt")).text == "from-a\n"
    assert (await sb.read_file(f"{WS}/notes/tool.txt")).text == "written by the file tool\n"
    assert (await sb.exec("cat notes/tool.txt")).output == "written by the file tool\n"
    assert [e.path for e in await sb.ls(WS)] == [f"{WS}/made-by-shell.txt", f"{WS}/notes"]
    assert await sb.glob("*.txt", WS) == [f"{WS}/made-by-shell.txt", f"{WS}/notes/tool.txt"]
    hits = await sb.grep("file tool", "/mnt/user-data")
    assert [(h.path, h.line) for h in hits] == [(f"{WS}/notes/tool.txt", 1)], hits
    assert await sb.edit("notes/tool.txt", "written", "edited") == 1
    assert await sb.read_bytes("notes/tool.txt") == b"edited by the file tool\n"
    # The gateway's side: uploads on either daemon, without a turn; a big one goes in pieces.
    big = os.urandom(5 * 1024 * 1024 + 7)
    up = await asyncio.to_thread(b.files_for(tid).create_unique, "/mnt/user-data/uploads", "r.bin", big)
    up2 = await asyncio.to_thread(b.files_for(tid).create_unique, "/mnt/user-data/uploads", "r.bin", b"v")
    assert (up, up2) == ("/mnt/user-data/uploads/r.bin", "/mnt/user-data/uploads/r-2.bin")
    assert (await sb.exec("wc -c < ../uploads/r.bin")).output.strip() == str(len(big))
    assert await asyncio.to_thread(b.files_for(tid).read_bytes, up) == big
    await sb.delete("notes")
    assert await sb.stat("notes") is None
    # One pod, one claim, found by name; nothing of the thread on either daemon's host.
    assert len(k8s.objects["pods"]) == 1 and len(k8s.objects["persistentvolumeclaims"]) == 1
    assert not any(p.is_file() for r in (a.root, b.root) if r.exists() for p in r.rglob("*"))


async def test_two_daemons_starting_one_thread_at_once_get_one_pod_and_one_claim(
    make: Make, k8s: FakeKubernetes
) -> None:
    a, b = make(), make()
    tid = thread_id()
    sa, sb = await asyncio.gather(a.acquire(tid), b.acquire(tid))
    ra, rb = await asyncio.gather(sa.exec("echo a >> both"), sb.exec("echo b >> both"))
    assert ra.exit_code == rb.exit_code == 0
    assert sorted((await sa.read_file("both")).text.split()) == ["a", "b"]
    assert list(k8s.objects["pods"]) == [(NS, ks.pod_name(tid))]
    assert list(k8s.objects["persistentvolumeclaims"]) == [(NS, ks.claim_name(tid))]


async def test_the_pod_sent_holds_the_sandbox_guarantees(make: Make, k8s: FakeKubernetes) -> None:
    p = make(uid=1000, gid=1000)
    tid = thread_id()
    await p.acquire(tid)
    pod = k8s.pod(ks.pod_name(tid))
    assert pod is not None
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"] == {ks.SANDBOX: "1", ks.THREAD_HASH: ks.thread_key(tid), ks.NETWORK: "off"}
    assert meta["annotations"][ks.THREAD] == tid and tid not in str(meta["labels"])
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert not spec["hostNetwork"] and not spec["hostPID"] and not spec["hostIPC"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (c,) = spec["containers"]
    assert c["command"] == ["sleep", "infinity"]
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["privileged"] is False
    assert c["resources"]["limits"] == {"cpu": "1.0", "memory": "256Mi", "ephemeral-storage": "256Mi"}
    assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]} == {
        "/mnt/user-data": "user-data",
        "/tmp": "tmp",
    }
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["user-data"]["persistentVolumeClaim"] == {"claimName": ks.claim_name(tid)}
    assert vols["tmp"]["emptyDir"] == {"sizeLimit": "256Mi"}
    assert {e["name"] for e in c["env"]} == {"PATH", "HOME", "LANG", "CHITAL_EXEC"}
    # The policies: no ingress and no egress for pods without network.
    deny = k8s.objects["networkpolicies"][(NS, ks.DENY_POLICY)]["spec"]
    assert deny["podSelector"]["matchLabels"] == {ks.SANDBOX: "1", ks.NETWORK: "off"}
    assert deny["policyTypes"] == ["Ingress", "Egress"] and not deny["ingress"] and not deny["egress"]
    # What the sandbox sees: no token, a read-only root.
    sb = await p.acquire(tid)
    res = await sb.exec("ls /var/run/secrets 2>&1; touch /etc/x 2>&1; env | sort | grep -c KUBERNETES")
    assert "No such file" in res.output and "cannot touch '/etc/x'" in res.output
    assert res.output.strip().endswith("0"), res


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 that accepts and closes."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                srv.accept()[0].close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)
    srv.close()


async def test_network_is_denied_by_default_and_allowed_when_configured(
    make: Make, k8s: FakeKubernetes, listener: int
) -> None:
    probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {listener}), 5); print('connected')\""
    closed = await make().acquire(thread_id("closed"))
    res = await closed.exec(probe)
    assert res.exit_code != 0 and "connected" not in res.output, res
    opened = await make(network=True).acquire(thread_id("open"))
    res = await opened.exec(probe)
    assert res.exit_code == 0 and res.output.strip() == "connected", res
    ingress = k8s.objects["networkpolicies"][(NS, ks.INGRESS_POLICY)]["spec"]
    assert ingress["podSelector"]["matchLabels"] == {ks.SANDBOX: "1", ks.NETWORK: "on"}
    assert ingress["policyTypes"] == ["Ingress"] and not ingress["ingress"]


async def test_links_out_of_the_workspace_are_not_followed(make: Make) -> None:
    sb = await make().acquire(thread_id())
    res = await sb.exec("ln -s /etc/passwd pw && ln -s / root && mkdir d && ln -s /etc d/etc")
    assert res.exit_code == 0, res
    for call in (
        sb.read_file("pw"),
        sb.read_bytes("pw"),
        sb.write_file("pw", "x"),
        sb.ls("root"),
        sb.ls("d/etc"),
        sb.read_file("root/etc/passwd"),
    ):
        with pytest.raises(PathRefused):
            await call
    assert await sb.glob("**/passwd", WS) == []
    assert await sb.grep("root:", "/mnt/user-data") == []
    with pytest.raises(PathRefused):
        await sb.read_file("/etc/passwd")


async def test_a_timeout_kills_the_command_and_what_it_started(make: Make, k8s: FakeKubernetes) -> None:
    sb = await make().acquire(thread_id())
    res = await sb.exec("(while true; do echo t >> tick; sleep 0.1; done) & sleep 100", timeout=2)
    assert res.timed_out and res.exit_code is None, res
    size = (await sb.stat("tick")).size  # type: ignore[union-attr]
    await asyncio.sleep(1)
    assert (await sb.stat("tick")).size == size  # type: ignore[union-attr]
    assert (await sb.exec("echo next")).output == "next\n"


async def test_output_is_capped_head_and_tail(make: Make) -> None:
    sb = await make().acquire(thread_id())
    res = await sb.exec("echo START; head -c 3000000 /dev/zero | tr '\\0' a; echo; echo END", max_output=4096)
    assert res.exit_code == 0 and res.truncated, res
    assert res.output.startswith("START\n") and res.output.rstrip().endswith("END")
    assert "output truncated" in res.output and len(res.output) < 5000


async def test_the_disk_quota_holds(make: Make) -> None:
    sb = await make(limits=SandboxLimits(memory_mb=256, disk_mb=2)).acquire(thread_id())
    with pytest.raises(QuotaExceeded):
        await sb.write_file("big.bin", b"x" * (3 * 1024 * 1024))
    res = await sb.exec("head -c 3000000 /dev/urandom > fill.bin; echo done")
    assert "quota" in res.output, res
    with pytest.raises(QuotaExceeded):
        await sb.exec("true")
    await sb.delete("fill.bin")
    assert (await sb.exec("echo ok")).output.startswith("ok")


def _age(k8s: FakeKubernetes, name: str, value: str) -> None:
    """Set a pod's last-use stamp, as if it was last used then."""

    def set_() -> None:
        k8s.objects["pods"][(NS, name)].obj["metadata"]["annotations"][ks.LAST_USED] = value

    k8s._on_loop(set_)


async def test_reaping_removes_an_idle_pod_keeps_its_claim_and_spares_busy_and_recent_ones(
    make: Make, k8s: FakeKubernetes
) -> None:
    p = make(idle_timeout=6.0)
    idle, busy, recent = thread_id("idle"), thread_id("busy"), thread_id("recent")
    for tid in (idle, busy, recent):
        await (await p.acquire(tid)).exec(f"echo {tid.split('/')[1]} > mine")
        await p.release(tid)
    _age(k8s, ks.pod_name(idle), "1000")
    # A command runs in `busy`: its stamp, made old, is refreshed while it runs.
    running = asyncio.ensure_future((await p.acquire(busy)).exec("sleep 20", timeout=60))
    await asyncio.sleep(0.5)
    _age(k8s, ks.pod_name(busy), "1000")
    for _ in range(200):
        pod = k8s.pod(ks.pod_name(busy))
        if pod is not None and pod["metadata"]["annotations"][ks.LAST_USED] != "1000":
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the running command's pod was never stamped")
    p.reap_gate = lambda: False
    assert await p.reap_idle() == []  # not the timers' owner: another daemon reaps
    p.reap_gate = lambda: True
    assert await p.reap_idle() == [idle]
    assert set(k8s.objects["pods"]) == {(NS, ks.pod_name(busy)), (NS, ks.pod_name(recent))}
    assert len(k8s.objects["persistentvolumeclaims"]) == 3
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    # The next turn of the reaped thread, on another daemon: a new pod, the same files.
    sb = await make().acquire(idle)
    assert (await sb.read_file("mine")).text == "idle\n"


async def test_a_pod_killed_under_a_command_ends_it_and_the_next_turn_gets_a_new_pod(
    make: Make, k8s: FakeKubernetes
) -> None:
    p = make()
    tid = thread_id()
    sb = await p.acquire(tid)
    await sb.write_file("kept.txt", "still here\n")
    first = k8s.pod(ks.pod_name(tid))["metadata"]["uid"]  # type: ignore[index]
    running = asyncio.ensure_future(sb.exec("echo started; sleep 60", timeout=120))
    for _ in range(200):
        if k8s.exec_argvs and any("sleep 60" in " ".join(a) for a in k8s.exec_argvs):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    k8s.kill_pod(ks.pod_name(tid))
    res = await asyncio.wait_for(running, 60)
    assert res.exit_code in (None, 137) and not res.timed_out and "went away" in res.output, res
    sb = await p.acquire(tid)
    assert k8s.pod(ks.pod_name(tid))["metadata"]["uid"] != first  # type: ignore[index]
    assert (await sb.exec("cat kept.txt")).output == "still here\n"


async def test_a_refused_token_gives_a_specific_error_without_the_token(
    make: Make, k8s: FakeKubernetes, tmp_path: Path
) -> None:
    secret = "sekrit-" + uuid.uuid4().hex
    bad = k8s.write_kubeconfig(tmp_path / "bad-kubeconfig", token=secret)
    p = make(kubeconfig=bad)
    with pytest.raises(SandboxUnavailable) as err:
        await p.acquire(thread_id())
    assert "401" in str(err.value) and "credentials" in str(err.value), err.value
    assert secret not in str(err.value) and secret not in repr(err.value.__context__)
    with pytest.raises(SandboxError) as err2:
        await asyncio.to_thread(p.files_for(thread_id()).ls, WS)
    assert "401" in str(err2.value) and secret not in str(err2.value)


async def test_a_pod_of_other_settings_is_replaced_and_the_files_kept(
    make: Make, k8s: FakeKubernetes
) -> None:
    tid = thread_id()
    sa = await make().acquire(tid)
    await sa.write_file("kept.txt", "kept\n")
    first = k8s.pod(ks.pod_name(tid))
    bigger = make(limits=SandboxLimits(memory_mb=512, disk_mb=20))
    sb = await bigger.acquire(tid)
    second = k8s.pod(ks.pod_name(tid))
    assert first is not None and second is not None
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert second["metadata"]["annotations"][ks.SPEC_HASH] != first["metadata"]["annotations"][ks.SPEC_HASH]
    assert second["spec"]["containers"][0]["resources"]["limits"]["memory"] == "512Mi"
    assert (await sb.exec("cat kept.txt")).output == "kept\n"
    assert len(k8s.objects["persistentvolumeclaims"]) == 1


async def test_a_pod_that_never_gets_ready_fails_naming_what_was_awaited(
    tmp_path: Path, k8s: FakeKubernetes
) -> None:
    k8s.start_delay = 600
    config = k8s.write_kubeconfig(tmp_path / "kubeconfig")
    settings = KubernetesSettings(kubeconfig=config, namespace=NS, start_timeout=1)
    p = KubernetesProvider(tmp_path / "root", settings)
    tid = thread_id()
    try:
        with pytest.raises(SandboxUnavailable) as err:
            await p.acquire(tid)
    finally:
        await p.close()
    text = str(err.value)
    assert ks.pod_name(tid) in text and "Running and ready within 1 s" in text and "Pending" in text, text


async def test_an_api_error_names_the_status_and_the_api_message(make: Make, k8s: FakeKubernetes) -> None:
    k8s.fail("create", "pods", 403, message='pods is forbidden: User "chital" cannot create resource')
    with pytest.raises(SandboxUnavailable) as err:
        await make().acquire(thread_id())
    assert "403 Forbidden" in str(err.value) and "cannot create resource" in str(err.value), err.value


async def test_kubeconfig_from_the_environment_and_a_broken_one_quoted_without_its_token(
    tmp_path: Path, k8s: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(k8s.write_kubeconfig(tmp_path / "env-kubeconfig")))
    p = KubernetesProvider(tmp_path / "root", KubernetesSettings(namespace=NS))
    try:
        await p.reconcile()  # lists pods: the credentials of $KUBECONFIG were used
        assert (NS, ks.DENY_POLICY) in k8s.objects["networkpolicies"]
    finally:
        await p.close()
    secret = "sekrit-" + uuid.uuid4().hex
    broken = tmp_path / "broken"
    broken.write_text(f"users:\n- name: u\n  user: {{token: {secret}\n  : [\n")
    q = KubernetesProvider(tmp_path / "root2", KubernetesSettings(kubeconfig=broken, namespace=NS))
    try:
        with pytest.raises(SandboxUnavailable) as err:
            await q.acquire(thread_id())
    finally:
        await q.close()
    assert "client configuration" in str(err.value) and secret not in str(err.value), err.value


async def test_outside_the_verified_client_versions_the_public_reader_works(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    import compat.kubernetes

    monkeypatch.setattr(compat.kubernetes, "usable", lambda _distribution: False)
    sb = await make().acquire(thread_id())
    res = await sb.exec("echo out; echo err >&2; exit 3")
    assert res.exit_code == 3 and sorted(res.output.split()) == ["err", "out"], res
    await sb.write_file("f.txt", "public path\n")
    assert (await sb.read_file("f.txt")).text == "public path\n"
    assert (await sb.exec("sleep 30", timeout=1)).timed_out


async def test_the_start_up_probe_runs_a_command_and_leaves_nothing(make: Make, k8s: FakeKubernetes) -> None:
    from agent.sandbox.probe import run_probe

    a, b = make(), make()
    assert await asyncio.gather(run_probe(a), run_probe(b)) == [None, None]  # each daemon its own
    assert k8s.objects["pods"] == {} and k8s.objects["persistentvolumeclaims"] == {}


async def test_the_in_pod_timeout_kills_a_command_the_daemon_did_not(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop for a daemon that died or lost the API mid-command: the pod's own ``timeout``
    (here made to fire 58 s before the daemon's deadline) kills the command's group."""
    from agent.sandbox import kube_exec

    monkeypatch.setattr(kube_exec, "KILL_GRACE", -58)
    sb = await make().acquire(thread_id())
    res = await sb.exec("echo started; sleep 100", timeout=60)
    assert res.exit_code == 137 and not res.timed_out and res.output == "started\n", res
