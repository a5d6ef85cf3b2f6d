"""The ``local`` provider: commands in bubblewrap must not see or reach anything of the host.

Each test asserts what sandboxed code can observe. Process checks scan /proc for a unique marker in
command lines and poll with a bounded deadline (no sleep-and-hope).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.sandbox import QuotaExceeded, SandboxError, SandboxLimits, SandboxUnavailable, check_room
from agent.sandbox.backend import TIMEOUT_EXIT_CODE, SandboxBackend
from agent.sandbox.local import LocalProvider, LocalSandbox
from agent.sandbox.quota import free_bytes, measure
from tests.sandbox_checks import (
    assert_daemon_restart_keeps_sandbox,
    assert_disk_quota,
    assert_fork_bomb_isolated,
    assert_fork_limited,
    assert_free_space_floor,
    assert_no_network,
)

HAVE_BWRAP = shutil.which("bwrap") is not None
bwrap = pytest.mark.bwrap
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap (bwrap) is not installed")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (uid drop, chown)")
MB = 1024 * 1024
WS = "/mnt/user-data/workspace"


@pytest.fixture
async def local_provider(root: Path, demo_skills: Path) -> AsyncIterator[LocalProvider]:
    p = LocalProvider(root / "sbx", demo_skills, limits=SandboxLimits(pids=64))
    await p.reconcile()
    yield p
    await p.close()


@pytest.fixture
async def local_sb(local_provider: LocalProvider) -> LocalSandbox:
    return await local_provider.acquire("telegram:42")


def procs_with(marker: str) -> list[str]:
    """Host processes whose command line contains ``marker``, as "pid: cmdline"."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if marker.encode() in cmdline:
            text = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{d}: {text}")
    return found


async def wait_gone(marker: str, deadline: float = 10.0) -> list[str]:
    end = time.monotonic() + deadline
    while (left := procs_with(marker)) and time.monotonic() < end:
        await asyncio.sleep(0.05)
    return left


def unique_seconds(base: int) -> str:
    """A sleep duration no other process on the machine will have in its command line."""
    return f"{base}.{uuid.uuid4().int % 10**9:09d}"


# --- without bubblewrap: refusal unless explicitly allowed ---------------------------------------


async def test_exec_refused_without_bwrap(root: Path) -> None:
    p = LocalProvider(root / "sbx", None, bwrap=None)
    local_sb = await p.acquire("t1")
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        await local_sb.exec("echo hi")
    res = await SandboxBackend(local_sb).aexecute("echo hi")
    assert "bubblewrap" in res.output and res.exit_code is None


async def test_unsandboxed_only_when_allowed(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHITAL_TEST_SECRET", "hunter2-unsandboxed")
    p = LocalProvider(root / "sbx", None, bwrap=None, allow_unsandboxed=True)
    local_sb = await p.acquire("t1")
    res = await local_sb.exec("echo hi > f.txt; cat f.txt; env")
    assert res.exit_code == 0 and res.output.startswith("hi\n")
    assert "hunter2" not in res.output  # even unsandboxed, the daemon's env stays out
    assert (local_sb.dirs.workspace / "f.txt").read_text() == "hi\n"


# --- bubblewrap ------------------------------------------------------------------------------------


@bwrap
@needs_bwrap
async def test_echo_and_environment(local_sb: LocalSandbox) -> None:
    res = await local_sb.exec("echo hello; pwd; echo $HOME; id -u; grep CapEff /proc/self/status; exit 3")
    lines = res.output.splitlines()
    assert res.exit_code == 3 and not res.timed_out and not res.truncated
    assert lines[:3] == ["hello", WS, WS]
    assert lines[4].split() == ["CapEff:", "0000000000000000"]


@bwrap
@needs_bwrap
async def test_parent_secret_env_invisible(
    local_provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHITAL_TEST_SECRET", "hunter2-local")
    local_sb = await local_provider.acquire("secret-thread")
    res = await local_sb.exec(
        "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; cat /proc/1/cmdline"
    )
    assert res.exit_code == 0
    assert "hunter2" not in res.output
    assert "PATH=" in res.output and f"HOME={WS}" in res.output
    assert str(local_provider.root) not in res.output  # bwrap's options (host paths) are not exposed


@bwrap
@needs_bwrap
async def test_host_files_invisible(local_sb: LocalSandbox, root: Path) -> None:
    (root / "host-secret.txt").write_text("do not leak")
    res = await local_sb.exec(
        "for p in /etc/shadow /root /work /home /var " + str(root) + "; do "
        'if [ -e "$p" ]; then echo "VISIBLE $p"; fi; done; '
        "cat /etc/passwd; ls /etc"
    )
    assert "VISIBLE" not in res.output
    assert "do not leak" not in res.output
    passwd_users = {line.split(":")[0] for line in res.output.splitlines() if line.count(":") >= 6}
    assert passwd_users == {"root", "sandbox", "nobody"}  # synthetic, not the host's
    assert "shadow" not in res.output


@bwrap
@needs_bwrap
async def test_no_network(local_sb: LocalSandbox) -> None:
    await assert_no_network(local_sb)


@bwrap
@needs_bwrap
async def test_pids_limit_contains_fork_bomb(local_sb: LocalSandbox) -> None:
    """Forking stops at the process limit (64 here), and a real bomb ends with the command."""
    await assert_fork_limited(local_sb)
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    res = await local_sb.exec(
        f"{marker}() {{ {marker} | {marker} & }}; {marker}; sleep 2; echo survived", timeout=6
    )
    assert time.monotonic() - started < 15
    assert "survived" in res.output or res.timed_out
    assert await wait_gone(marker) == []
    assert (await local_sb.exec("echo alive")).output == "alive\n"


@bwrap
@needs_bwrap
async def test_timeout_kills_process_tree(local_sb: LocalSandbox) -> None:
    tag = unique_seconds(100)
    started = time.monotonic()
    res = await local_sb.exec(
        f"sleep {tag}1 & (setsid sleep {tag}2 &); echo started; sleep {tag}3", timeout=1.5
    )
    elapsed = time.monotonic() - started
    assert res.timed_out and res.exit_code is None
    assert res.output == "started\n"
    assert elapsed < 10
    assert await wait_gone(tag) == []


@bwrap
@needs_bwrap
async def test_cancel_kills_command(local_sb: LocalSandbox) -> None:
    tag = unique_seconds(200)
    task = asyncio.create_task(local_sb.exec(f"sleep {tag}", timeout=60))
    end = time.monotonic() + 10
    while not any("bwrap" not in p for p in procs_with(tag)) and time.monotonic() < end:
        await asyncio.sleep(0.02)
    assert procs_with(tag)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_gone(tag) == []


@bwrap
@needs_bwrap
async def test_huge_output_truncated(local_sb: LocalSandbox) -> None:
    res = await local_sb.exec("head -c 3000000 /dev/zero | tr '\\0' a; echo; echo END", max_output=10_000)
    assert res.truncated and res.exit_code == 0
    assert "[... output truncated: 2990005 more bytes ...]" in res.output
    assert res.output.startswith("a" * 5000) and res.output.endswith("END\n")
    assert len(res.output) < 10_100


@bwrap
@needs_bwrap
async def test_writes_only_inside_mounts(local_sb: LocalSandbox) -> None:
    res = await local_sb.exec(
        "for p in /usr/x /x /etc/x /mnt/skills/x /mnt/user-data/x /proc/x; do "
        '(echo pwned > "$p") 2>/dev/null && echo "WROTE $p"; done; '
        "echo tmp > /tmp/t && cat /tmp/t; echo ws > ws.txt; echo out > /mnt/user-data/outputs/o.txt; "
        "cat /mnt/skills/demo/SKILL.md"
    )
    assert "WROTE" not in res.output
    assert "tmp\n" in res.output and "# Demo" in res.output
    assert (local_sb.dirs.workspace / "ws.txt").read_text() == "ws\n"
    assert (local_sb.dirs.outputs / "o.txt").read_text() == "out\n"
    assert (await local_sb.read_file("/mnt/user-data/outputs/o.txt")).text == "out\n"
    # /tmp is private to each command.
    assert "No such file" in (await local_sb.exec("cat /tmp/t")).output


@bwrap
@needs_bwrap
async def test_file_size_limit(root: Path) -> None:
    p = LocalProvider(root / "sbx2", None, limits=SandboxLimits(file_size_mb=1))
    local_sb = await p.acquire("t")
    res = await local_sb.exec("head -c 2000000 /dev/zero > big.bin; echo rc=$?")
    assert "rc=0" not in res.output
    assert (local_sb.dirs.workspace / "big.bin").stat().st_size <= 1024 * 1024


@bwrap
@needs_bwrap
async def test_sandboxes_are_per_thread(local_provider: LocalProvider) -> None:
    a = await local_provider.acquire("thread-a")
    b = await local_provider.acquire("thread-b")
    assert a is await local_provider.acquire("thread-a")
    await a.exec("echo a > mine.txt")
    assert "No such file" in (await b.exec("cat mine.txt")).output
    assert a.dirs.base != b.dirs.base


@bwrap
@needs_bwrap
async def test_long_command_refused(local_sb: LocalSandbox) -> None:
    with pytest.raises(SandboxError, match="longer than"):
        await local_sb.exec("echo " + "x" * 200_000)


# --- deepagents adapter: execute, and the real middleware tools end to end ------------------------


@bwrap
@needs_bwrap
async def test_backend_execute(local_sb: LocalSandbox) -> None:
    be = SandboxBackend(local_sb, max_output=2000)
    ok = await be.aexecute("echo hi; exit 2")
    assert (ok.output, ok.exit_code, ok.truncated) == ("hi\n", 2, False)
    slow = await be.aexecute("sleep 30", timeout=1)
    assert slow.exit_code == TIMEOUT_EXIT_CODE and "timed out after 1s" in slow.output
    big = await be.aexecute("seq 1 100000")
    assert big.truncated and "output truncated" in big.output
    # deepagents' sync tool path runs in a worker thread; execute() hops onto our loop.
    sync = await asyncio.to_thread(be.execute, "echo from-thread")
    assert sync.output == "from-thread\n"


@bwrap
@needs_bwrap
async def test_filesystem_middleware_tools_on_sandbox(
    local_sb: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real langchain agent + deepagents' FilesystemMiddleware, the model faked over HTTP."""
    from deepagents.middleware.filesystem import FilesystemMiddleware
    from langchain.agents import create_agent
    from langchain_core.messages import ToolMessage
    from langchain_openai import ChatOpenAI

    from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(var, "")
    out = "/mnt/user-data/outputs/report.md"
    async with FakeOpenAI() as fake:
        fake.script(
            Reply(
                tool_calls=[ToolCall("write_file", {"file_path": out, "content": "# Report\nvalue: 41\n"})]
            ),
            Reply(
                tool_calls=[ToolCall("edit_file", {"file_path": out, "old_string": "41", "new_string": "42"})]
            ),
            Reply(tool_calls=[ToolCall("execute", {"command": f"grep -c value {out}; wc -l < {out}"})]),
            Reply(tool_calls=[ToolCall("read_file", {"file_path": "/etc/passwd"})]),
            Reply(tool_calls=[ToolCall("glob", {"pattern": "**/*.md", "path": "/mnt/user-data"})]),
            Reply(tool_calls=[ToolCall("ls", {"path": "/mnt/user-data/outputs"})]),
            Reply(text="done"),
        )
        model = ChatOpenAI(base_url=fake.base_url, api_key="k", model="m", max_retries=0)
        agent = create_agent(model, middleware=[FilesystemMiddleware(backend=SandboxBackend(local_sb))])
        result = await agent.ainvoke({"messages": [{"role": "user", "content": "make a report"}]})
    tools = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    by_name = {m.name: str(m.content) for m in tools}
    assert (local_sb.dirs.outputs / "report.md").read_text() == "# Report\nvalue: 42\n"
    assert "1\n2" in by_name["execute"] and "exit code 0" in by_name["execute"]
    assert "outside the sandbox" in by_name["read_file"] and "root:" not in by_name["read_file"]
    assert out in by_name["glob"] and out in by_name["ls"]
    assert result["messages"][-1].content == "done"


@bwrap
@needs_bwrap
async def test_dev_is_read_only_and_shm_capped(local_sb: LocalSandbox) -> None:
    """bwrap's /dev is a tmpfs of half the RAM owned by the sandbox user: it must not be a place
    to park data. Device nodes still work."""
    res = await local_sb.exec(
        "echo x > /dev/null && echo null-ok; (echo x > /dev/parked) 2>&1; "
        "df -k --output=size /dev/shm | tail -1; head -c 300M /dev/zero > /dev/shm/big; echo rc=$?"
    )
    lines = res.output.splitlines()
    assert lines[0] == "null-ok" and "Read-only file system" in lines[1]
    assert int(lines[2]) == 256 * 1024  # tmp_size_mb
    assert "rc=0" not in res.output


# --- process limits are per sandbox --------------------------------------------------------------


@bwrap
@needs_bwrap
async def test_fork_bomb_does_not_starve_other_sandboxes(local_provider: LocalProvider) -> None:
    """All local sandboxes run as one host uid; RLIMIT_NPROC is set inside each one's own user
    namespace, so a full sandbox cannot make another one's bwrap fail to start or fork."""
    a = await local_provider.acquire("bomber")
    b = await local_provider.acquire("bystander")
    await assert_fork_bomb_isolated(a, b, pids=64)


@bwrap
@needs_bwrap
async def test_process_limit_set_inside_the_sandbox(local_sb: LocalSandbox) -> None:
    res = await local_sb.exec("grep -E 'Max processes|Max pending signals' /proc/self/limits")
    limits = {" ".join(line.split()[:-3]): line.split()[-3:-1] for line in res.output.splitlines()}
    assert limits["Max processes"] == ["64", "64"]
    assert limits["Max pending signals"] == ["4096", "4096"]
    # Raising it back is refused (no CAP_SYS_RESOURCE in the host's user namespace).
    res = await local_sb.exec("prlimit --pid $$ --nproc=100000:100000 2>&1; echo rc=$?")
    assert "rc=0" not in res.output


# --- disk quota and free-space floor -------------------------------------------------------------


@pytest.fixture
async def small(root: Path) -> AsyncIterator[LocalProvider]:
    p = LocalProvider(root / "small", None, limits=SandboxLimits(disk_mb=5))
    yield p
    await p.close()


@bwrap
@needs_bwrap
async def test_disk_quota(small: LocalProvider) -> None:
    await assert_disk_quota(await small.acquire("filler"), quota_mb=5)


@bwrap
@needs_bwrap
async def test_free_space_floor(root: Path) -> None:
    providers: list[LocalProvider] = []

    async def make(name: str, floor: Any) -> LocalSandbox:
        p = LocalProvider(root / name, None, min_free_mb=floor(free_bytes(root)))
        providers.append(p)
        return await p.acquire(name)

    try:
        await assert_free_space_floor(make)
    finally:
        for p in providers:
            await p.close()


@bwrap
@needs_bwrap
async def test_quota_counts_what_hides_and_not_what_is_elsewhere(small: LocalProvider) -> None:
    """Data in a dir its owner made unreadable still counts (the daemon measures as root); a
    symlink to a big host dir counts as a link, not as the dir; a sparse file counts its blocks;
    a tree too deep to measure is refused rather than ignored."""
    local_sb = await small.acquire("hider")
    await local_sb.exec("ln -s /usr usr-link; truncate -s 10G sparse.bin; mkdir hide")
    assert measure(local_sb.dirs).bytes < MB
    res = await local_sb.exec(
        "head -c 6M /dev/urandom > hide/a; head -c 1M /dev/zero > hide/b; chmod 000 hide"
    )
    assert "disk quota exceeded" in res.output
    with pytest.raises(QuotaExceeded):
        await local_sb.exec("true")
    # Its owner locked even the file tools out (they act with its rights): the operator cleans up.
    shutil.rmtree(local_sb.dirs.workspace / "hide")
    await local_sb.exec("true")
    res = await local_sb.exec("d=.; for i in $(seq 140); do d=$d/d; done; mkdir -p $d; echo made")
    assert "nested more than 128 levels" in res.output
    with pytest.raises(QuotaExceeded, match="nested more than 128 levels"):
        await local_sb.exec("true")
    await local_sb.delete("d")
    assert (await local_sb.exec("echo fine")).output == "fine\n"


async def test_check_room_for_uploads(root: Path) -> None:
    """What the gateway calls before saving a user's upload: a path inside the thread's dir is
    enough; the message is safe to show (virtual paths only)."""
    p = LocalProvider(root / "up", None, limits=SandboxLimits(disk_mb=5), bwrap=None)
    local_sb = await p.acquire("uploader")
    check_room(local_sb.dirs.uploads, 4 * MB)
    (local_sb.dirs.uploads / "a.bin").write_bytes(b"x" * 4 * MB)
    with pytest.raises(QuotaExceeded) as err:
        check_room(local_sb.dirs.uploads, 2 * MB)
    assert isinstance(err.value, SandboxError)
    text = str(err.value)
    assert "disk quota exceeded: 4 MB used of 5 MB, and 2 MB more do not fit" in text
    assert "/mnt/user-data/uploads" in text and str(root) not in text
    check_room(local_sb.dirs, 512 * 1024)  # still fits
    check_room(local_sb.dirs, -MB)  # shrinking is never refused
    # A thread the gateway saves a first upload for, before any sandbox exists (nor the root).
    check_room(root / "not-yet" / "threads" / "t-0123" / "uploads", MB)


# --- restarts: the same root, a new provider -----------------------------------------------------


@bwrap
@needs_bwrap
@needs_root
async def test_second_start_on_same_root(root: Path) -> None:
    """The field bug: the first start left the root at 0711 and every later start refused it."""
    data = root / "data"
    first = LocalProvider(data / "sandboxes", None)
    assert (await (await first.acquire("t")).exec("echo one > f; cat f")).output == "one\n"
    await first.close()
    assert (data / "sandboxes").stat().st_mode & 0o777 == 0o711
    assert (data / "sandboxes" / "threads").stat().st_mode & 0o777 == 0o711
    second = LocalProvider(data / "sandboxes", None)
    await second.reconcile()
    assert (await (await second.acquire("t")).exec("cat f; echo two")).output == "one\ntwo\n"
    await second.close()


@needs_root
async def test_unreachable_root_names_the_blocking_dir(root: Path) -> None:
    private = root / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    with pytest.raises(SandboxUnavailable) as err:
        LocalProvider(private / "data" / "sandboxes", None)
    text = str(err.value)
    assert f"{private} (mode 0700, owner 0:0) does not grant it search (x)" in text
    assert f"chmod o+x {private}" in text
    os.chmod(private, 0o711)  # doing what the message says is enough
    LocalProvider(private / "data" / "sandboxes", None)


def test_one_default_sandbox_root(tmp_path: Path) -> None:
    """Setting any sandbox key must not move the root: it is ``sandboxes`` under the storage path."""
    from agent.config import AgentSettings, ModelSpec
    from agent.runtime import AgentRuntime
    from gateway.config.schema import parse_config

    data = tmp_path / "data"
    plain = parse_config({}).agent
    tuned = parse_config({"agent": {"sandbox": {"exec_timeout": 30, "provider": "docker"}}}).agent
    for settings in (plain, tuned, AgentSettings()):
        assert AgentRuntime(settings, ModelSpec(), data).sandbox_root == data / "sandboxes"


# --- a host uid per thread (uid_range) -----------------------------------------------------------

RANGE = (1_900_000_000, 3)


@bwrap
@needs_bwrap
@needs_root
async def test_uid_per_thread(root: Path) -> None:
    p = LocalProvider(root / "uids", None, limits=SandboxLimits(pids=64), uid_range=RANGE)
    a, b = await p.acquire("a"), await p.acquire("b")
    assert a.owner == (RANGE[0], RANGE[0]) and b.owner == (RANGE[0] + 1, RANGE[0] + 1)
    res = await a.exec("id -u; echo x > made.txt")
    assert res.output == "1000\n"  # inside, always the sandbox user
    assert (a.dirs.workspace / "made.txt").stat().st_uid == RANGE[0]
    assert a.dirs.base.stat().st_uid == RANGE[0]
    await a.write_file("tool.txt", "t")
    assert (a.dirs.workspace / "tool.txt").stat().st_uid == RANGE[0]
    await assert_fork_bomb_isolated(a, b, pids=64)
    # Persistent: a new provider finds each thread's uid as the owner of its dir.
    again = LocalProvider(root / "uids", None, uid_range=RANGE)
    assert (await again.acquire("b")).owner == b.owner
    assert (await again.acquire("c")).owner == (RANGE[0] + 2, RANGE[0] + 2)
    with pytest.raises(SandboxError, match="uid_range are in use"):
        await again.acquire("d")


@bwrap
@needs_bwrap
@needs_root
async def test_uid_range_takes_over_existing_thread(root: Path) -> None:
    old = LocalProvider(root / "mig", None)
    local_sb = await old.acquire("t")
    await local_sb.exec("mkdir -p deep/er && echo old > deep/er/f && ln -s /etc/shadow link")
    new = LocalProvider(root / "mig", None, uid_range=RANGE)
    local_sb = await new.acquire("t")
    uid = RANGE[0]
    for path in (local_sb.dirs.base, local_sb.dirs.workspace / "deep", local_sb.dirs.workspace / "deep/er/f"):
        assert path.lstat().st_uid == uid
    assert os.stat("/etc/shadow").st_uid == 0  # the link was not followed
    assert (await local_sb.exec("echo more >> deep/er/f && cat deep/er/f")).output == "old\nmore\n"


# --- through the daemon ----------------------------------------------------------------------------


@bwrap
@needs_bwrap
async def test_daemon_restart_keeps_sandbox(tg: Any, model: Any) -> None:
    await assert_daemon_restart_keeps_sandbox(tg, model, "local", crash=False)
