"""The ``docker`` provider against a real Docker engine: the same escape attempts as the local
provider, plus the container lifecycle (reuse, idle reaping, start-up reconcile).

Skipped only when no Docker engine answers. The image must exist (scripts/setup-sandbox.sh).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.sandbox import SandboxLimits
from agent.sandbox.backend import TIMEOUT_EXIT_CODE, SandboxBackend
from agent.sandbox.docker_provider import LABEL_INSTANCE, DockerProvider, DockerSandbox, container_name
from agent.sandbox.quota import free_bytes
from tests.docker_support import DOCKER_MISSING as _WHY_NOT
from tests.docker_support import IMAGE
from tests.sandbox_checks import (
    assert_daemon_restart_keeps_sandbox,
    assert_disk_quota,
    assert_fork_bomb_isolated,
    assert_fork_limited,
    assert_free_space_floor,
    assert_no_network,
)

WS = "/mnt/user-data/workspace"
pytestmark = [pytest.mark.docker, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]


def make(root: Path, demo_skills: Path | None, **kw: object) -> DockerProvider:
    kw.setdefault("limits", SandboxLimits(pids=64, memory_mb=256))
    return DockerProvider(root / "sbx", demo_skills, image=IMAGE, **kw)  # type: ignore[arg-type]


def cleanup(root: Path, name: str = "sbx") -> None:
    """Remove every container of providers rooted here, whatever a test left behind."""
    import docker

    client = docker.from_env()
    instance = DockerProvider(root / name).instance
    for c in client.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}):
        c.remove(force=True)
    client.close()


@pytest.fixture
async def docker_provider(root: Path, demo_skills: Path) -> AsyncIterator[DockerProvider]:
    p = make(root, demo_skills)
    await p.ping()
    await p.reconcile()
    yield p
    await p.close()
    await asyncio.to_thread(cleanup, root)


@pytest.fixture
async def docker_sb(docker_provider: DockerProvider) -> DockerSandbox:
    return await docker_provider.acquire("slack:T1/C1")


def inspect(cid: str) -> dict:
    import docker

    client = docker.from_env()
    try:
        return client.api.inspect_container(cid)
    finally:
        client.close()


async def test_container_is_locked_down(docker_sb: DockerSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    info = await asyncio.to_thread(inspect, docker_sb.container_id)
    host = info["HostConfig"]
    assert info["Name"] == "/" + container_name("slack:T1/C1")
    assert info["Config"]["Labels"]["chital.sandbox"] == "1"
    assert info["Config"]["Labels"]["chital.thread"] == "slack:T1/C1"
    assert info["Config"]["User"] == "1000:1000"
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["ReadonlyRootfs"] is True
    assert host["PidsLimit"] == 64 and host["Memory"] == 256 * 1024 * 1024
    assert "/tmp" in host["Tmpfs"]
    mounts = {m["Destination"]: m["RW"] for m in info["Mounts"]}
    assert mounts == {
        f"{WS}": True,
        "/mnt/user-data/uploads": True,
        "/mnt/user-data/outputs": True,
        "/mnt/skills": False,
    }
    env_keys = {e.split("=", 1)[0] for e in info["Config"]["Env"]}
    assert env_keys <= {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "CHITAL_EXEC"}


async def test_echo_user_and_secret_env(
    docker_provider: DockerProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHITAL_TEST_SECRET", "hunter2-docker")
    docker_sb = await docker_provider.acquire("secret-thread")
    res = await docker_sb.exec("echo hello; pwd; id -u; grep CapEff /proc/self/status; env; exit 3")
    lines = res.output.splitlines()
    assert res.exit_code == 3 and lines[:3] == ["hello", WS, "1000"]
    assert lines[3].split() == ["CapEff:", "0000000000000000"]
    assert "hunter2" not in res.output


async def test_host_files_invisible(docker_sb: DockerSandbox, root: Path) -> None:
    (root / "host-secret.txt").write_text("do not leak")
    res = await docker_sb.exec(
        "for p in /work /root/.pyenv /home/cloudsdk " + str(root) + "; do "
        'if [ -e "$p" ]; then echo "VISIBLE $p"; fi; done; cat /etc/shadow 2>&1 | head -c 200'
    )
    assert "VISIBLE" not in res.output and "do not leak" not in res.output
    assert "Permission denied" in res.output  # the image's own shadow, unreadable for uid 1000


async def test_no_network(docker_sb: DockerSandbox) -> None:
    await assert_no_network(docker_sb)


async def test_pids_limit_contains_fork_bomb(docker_sb: DockerSandbox) -> None:
    await assert_fork_limited(docker_sb)
    started = time.monotonic()
    await docker_sb.exec("bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", timeout=6)
    assert time.monotonic() - started < 30
    left = await docker_sb.exec("ps -eo args | grep -c '[b]omb' || true")
    assert left.output.strip() == "0"


async def test_timeout_kills_process_tree(docker_sb: DockerSandbox) -> None:
    started = time.monotonic()
    res = await docker_sb.exec("sleep 101 & (setsid sleep 102 &); echo started; sleep 103", timeout=1.5)
    assert res.timed_out and res.exit_code is None and res.output == "started\n"
    assert time.monotonic() - started < 15
    ps = await docker_sb.exec("ps -eo args")
    assert "sleep 10" not in ps.output
    # Background children of a command that finished normally die with it too.
    await docker_sb.exec("sleep 104 & setsid sleep 105 & echo bg")
    assert "sleep 10" not in (await docker_sb.exec("ps -eo args")).output


async def test_straggler_without_marker_is_killed(docker_provider: DockerProvider) -> None:
    """A process that sheds its environment escapes the marker sweep; the timeout path still
    kills it (and the container restarts on the next acquire)."""
    docker_sb = await docker_provider.acquire("straggler")
    res = await docker_sb.exec("env -i /bin/sleep 106", timeout=1)
    assert res.timed_out
    sb2 = await docker_provider.acquire("straggler")
    assert "sleep 106" not in (await sb2.exec("ps -eo args")).output


async def test_cancel_kills_command(docker_sb: DockerSandbox) -> None:
    """A cancelled turn (/stop) kills its command; a concurrent command in the same sandbox lives."""
    task = asyncio.create_task(docker_sb.exec("sleep 107", timeout=60))
    other = asyncio.create_task(docker_sb.exec("sleep 1.5; echo other-done", timeout=60))
    deadline = time.monotonic() + 10
    while "sleep 107" not in (await docker_sb.exec("ps -eo args")).output and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "sleep 107" not in (await docker_sb.exec("ps -eo args")).output
    assert (await other).output == "other-done\n"


async def test_huge_output_truncated(docker_sb: DockerSandbox) -> None:
    res = await docker_sb.exec("head -c 3000000 /dev/zero | tr '\\0' a; echo; echo END", max_output=10_000)
    assert res.truncated and res.exit_code == 0
    assert "[... output truncated: 2990005 more bytes ...]" in res.output
    assert res.output.endswith("END\n")


async def test_writes_only_inside_mounts(docker_sb: DockerSandbox) -> None:
    res = await docker_sb.exec(
        "for p in /usr/x /x /etc/x /mnt/skills/x /mnt/user-data/x; do "
        '(echo pwned > "$p") 2>/dev/null && echo "WROTE $p"; done; '
        "echo tmp > /tmp/t && cat /tmp/t; echo ws > ws.txt; echo out > /mnt/user-data/outputs/o.txt; "
        "cat /mnt/skills/demo/SKILL.md"
    )
    assert "WROTE" not in res.output
    assert "tmp\n" in res.output and "# Demo" in res.output
    assert (docker_sb.dirs.workspace / "ws.txt").read_text() == "ws\n"
    assert (docker_sb.dirs.outputs / "o.txt").read_text() == "out\n"
    # Files the daemon writes are usable by the sandbox user, and vice versa.
    await docker_sb.write_file("from-host/note.txt", "n")
    res = await docker_sb.exec("echo more >> from-host/note.txt && cat from-host/note.txt")
    assert res.output == "nmore\n"


async def test_container_reused_across_acquires(docker_provider: DockerProvider) -> None:
    a = await docker_provider.acquire("reuse")
    await a.exec("echo 1 > /tmp/state")
    await docker_provider.release("reuse")
    b = await docker_provider.acquire("reuse")
    assert b is a and b.container_id == a.container_id
    assert (await b.exec("cat /tmp/state")).output == "1\n"  # same container, same tmpfs


async def test_reaped_when_idle(root: Path, demo_skills: Path) -> None:
    p = make(root, demo_skills, idle_timeout=0.3)
    try:
        docker_sb = await p.acquire("idle")
        await p.release("idle")
        deadline = time.monotonic() + 10
        reaped: list[str] = []
        while "idle" not in reaped and time.monotonic() < deadline:
            reaped += await p.reap_idle()
            await asyncio.sleep(0.1)
        assert reaped == ["idle"]
        import docker

        client = docker.from_env()
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(docker_sb.container_id)
        client.close()
        again = await p.acquire("idle")  # a fresh container on demand; files survive
        assert again.container_id != docker_sb.container_id
    finally:
        await p.close()
        await asyncio.to_thread(cleanup, root)


async def test_busy_sandbox_not_reaped(root: Path, demo_skills: Path) -> None:
    p = make(root, demo_skills, idle_timeout=0.2)
    try:
        docker_sb = await p.acquire("busy")
        task = asyncio.create_task(docker_sb.exec("sleep 1.5; echo finished", timeout=10))
        deadline = time.monotonic() + 5
        while not docker_sb.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        docker_sb.last_used -= 10  # looks idle by the clock, but a command is running
        assert await p.reap_idle() == []
        assert (await task).output == "finished\n"
    finally:
        await p.close()
        await asyncio.to_thread(cleanup, root)


async def test_reconcile_at_start(root: Path, demo_skills: Path) -> None:
    import docker

    first = make(root, demo_skills)
    try:
        keep = await first.acquire("keep")
        stopped = await first.acquire("stopped")
        gone = await first.acquire("gone")
        client = docker.from_env()
        client.containers.get(stopped.container_id).stop(timeout=0)
        shutil.rmtree(gone.dirs.base)  # the thread was deleted while the daemon was down
        # An older config (different limits) left running: must be replaced, not adopted.
        old = make(root, demo_skills, limits=SandboxLimits(pids=99))
        stale = await old.acquire("stale")
        # A different daemon (other root) on the same engine: must be left alone.
        other_root = root / "other"
        other = DockerProvider(other_root / "sbx", None, image=IMAGE)
        foreign = await other.acquire("foreign")

        # "Crash": a new provider on the same root starts without the old one's memory.
        second = make(root, demo_skills)
        await second.reconcile()
        assert set(second._sandboxes) == {"keep"}
        adopted = await second.acquire("keep")
        assert adopted.container_id == keep.container_id
        for cid in (stopped.container_id, stale.container_id):
            with pytest.raises(docker.errors.NotFound):
                client.containers.get(cid)
        assert client.containers.get(foreign.container_id).status == "running"
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(gone.container_id)
        await second.close()
        await other.close()
        client.close()
    finally:
        await asyncio.to_thread(cleanup, root)
        await asyncio.to_thread(cleanup, root / "other")


async def test_backend_execute_on_docker(docker_sb: DockerSandbox) -> None:
    be = SandboxBackend(docker_sb, max_output=2000)
    ok = await be.aexecute("echo hi; exit 2")
    assert (ok.output, ok.exit_code) == ("hi\n", 2)
    slow = await be.aexecute("sleep 30", timeout=1)
    assert slow.exit_code == TIMEOUT_EXIT_CODE
    assert be.write(f"{WS}/x.py", "print(6*7)\n").error is None
    assert (await be.aexecute("python3 x.py")).output == "42\n"


# --- process limits are per container ------------------------------------------------------------


async def test_fork_bomb_does_not_starve_other_sandboxes(docker_provider: DockerProvider) -> None:
    """Every container runs as host uid 1000; the pids cgroup (per container) is the limit, never
    an nproc ulimit (per host uid, shared by all containers)."""
    a = await docker_provider.acquire("bomber")
    b = await docker_provider.acquire("bystander")
    info = await asyncio.to_thread(inspect, a.container_id)
    assert info["HostConfig"]["PidsLimit"] == 64
    assert "nproc" not in {u["Name"] for u in info["HostConfig"]["Ulimits"] or []}
    limits = (await a.exec("grep 'Max processes' /proc/self/limits")).output.split()
    assert limits[2] == "unlimited" or int(limits[2]) >= 10_000  # the engine's own, not a tight one
    await assert_fork_bomb_isolated(a, b, pids=64)


# --- disk quota and free-space floor (measured on the bound host dirs) ----------------------------


async def test_disk_quota(root: Path) -> None:
    p = make(root, None, limits=SandboxLimits(pids=64, memory_mb=256, disk_mb=5))
    try:
        docker_sb = await p.acquire("filler")
        info = await asyncio.to_thread(inspect, docker_sb.container_id)
        fsize = {u["Name"]: u["Hard"] for u in info["HostConfig"]["Ulimits"]}["fsize"]
        assert fsize == 5 * 1024 * 1024  # no single file beyond the quota
        await assert_disk_quota(docker_sb, quota_mb=5)
    finally:
        await p.close()
        await asyncio.to_thread(cleanup, root)


async def test_free_space_floor(root: Path) -> None:
    providers: list[DockerProvider] = []

    async def make_sb(name: str, floor: Any) -> DockerSandbox:
        p = DockerProvider(root / name, None, image=IMAGE, min_free_mb=floor(free_bytes(root)))
        providers.append(p)
        return await p.acquire(name)

    try:
        await assert_free_space_floor(make_sb)
    finally:
        for p in providers:
            await p.close()
        for p in providers:
            await asyncio.to_thread(cleanup, p.root.parent, p.root.name)


# --- restarts: a new provider on the same root -----------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the sandbox uid differs from the daemon's)")
async def test_second_start_on_same_root(root: Path, demo_skills: Path) -> None:
    """Clean stop then start, and crash then start (containers left running are adopted by
    reconcile): both times commands work, and the root keeps the mode the first start gave it."""
    try:
        first = make(root, demo_skills)
        await first.reconcile()
        docker_sb = await first.acquire("t")
        assert (await docker_sb.exec("echo one > f; cat f")).output == "one\n"
        await first.close()
        assert (root / "sbx").stat().st_mode & 0o777 == 0o711

        second = make(root, demo_skills)
        await second.reconcile()
        docker_sb = await second.acquire("t")
        assert (await docker_sb.exec("cat f; echo two")).output == "one\ntwo\n"
        left_running = docker_sb.container_id  # "crash": no close(), the container stays

        third = make(root, demo_skills)
        await third.reconcile()
        assert set(third._sandboxes) == {"t"}
        docker_sb = await third.acquire("t")
        assert docker_sb.container_id == left_running
        res = await docker_sb.exec("cat f; echo three; cat /mnt/skills/demo/SKILL.md")
        assert res.output == "one\nthree\n# Demo\n"
        await third.close()
    finally:
        await asyncio.to_thread(cleanup, root)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown to the per-thread uids)")
async def test_uid_per_thread(root: Path) -> None:
    first = 1_900_000_000
    p = make(root, None, uid_range=(first, 8))
    try:
        a, b = await p.acquire("a"), await p.acquire("b")
        assert {a.owner, b.owner} == {(first, first), (first + 1, first + 1)}
        res = await a.exec("id -u; echo x > made.txt")
        assert res.output == f"{a.owner[0]}\n"  # Docker has no uid mapping: inside is the host uid
        assert (a.dirs.workspace / "made.txt").stat().st_uid == a.owner[0]
        await assert_fork_bomb_isolated(a, b, pids=64)
        again = make(root, None, uid_range=(first, 8))
        await again.reconcile()  # adopts both: same users as their dirs' owners
        assert set(again._sandboxes) == {"a", "b"}
        assert again._sandboxes["b"].owner == b.owner
        await again.close()
    finally:
        await p.close()
        await asyncio.to_thread(cleanup, root)


async def test_daemon_restart_after_crash_keeps_sandbox(tg: Any, model: Any) -> None:
    """kill -9 leaves the thread's container running; the next start reconciles (adopts) it."""
    await assert_daemon_restart_keeps_sandbox(tg, model, "docker", crash=True)
