"""The shared Docker mode against a real engine: two providers (two daemons' worth) on one engine
share a thread's container and volume; file tools go through the engine and keep the rules of the
host file tools (no link followed out of a mount, reads capped); idle containers are reaped and
their volume kept.

Skipped only when no Docker engine answers. The image must exist (scripts/setup-sandbox.sh).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.sandbox import SandboxLimits
from agent.sandbox.backend import SandboxBackend
from agent.sandbox.docker_shared import SharedDockerProvider, container_name, volume_name
from agent.sandbox.paths import PathRefused, SandboxError
from agent.sandbox.quota import QuotaExceeded
from tests.docker_support import DOCKER_MISSING as _WHY_NOT
from tests.docker_support import IMAGE

pytestmark = [pytest.mark.docker, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]

WS = "/mnt/user-data/workspace"


def _remove(thread_ids: list[str]) -> None:
    import docker
    from docker.errors import NotFound

    client = docker.from_env()
    for tid in thread_ids:
        for c in client.containers.list(all=True, filters={"name": container_name(tid)}):
            c.remove(force=True)
        try:
            client.volumes.get(volume_name(tid)).remove(force=True)
        except NotFound:
            pass
    client.close()


@pytest.fixture
def threads() -> Iterator[list[str]]:
    """Thread ids a test uses (odd characters included); their containers and volumes go after."""
    used: list[str] = []
    yield used
    _remove(used)


def _thread(threads: list[str], name: str = "") -> str:
    tid = f"slack:T1/{name or 'x'}/../ü {uuid.uuid4().hex[:8]}\n;$(id)"
    threads.append(tid)
    return tid


def _remove_skills(digest: str) -> None:
    import docker
    from docker.errors import NotFound

    client = docker.from_env()
    name = f"chital-skills-{digest}"
    for c in client.containers.list(all=True, filters={"name": name}):
        c.remove(force=True)
    try:
        client.volumes.get(name).remove(force=True)
    except NotFound:
        pass
    client.close()


@pytest.fixture
async def pair(
    root: Path, demo_skills: Path
) -> AsyncIterator[tuple[SharedDockerProvider, SharedDockerProvider]]:
    """Two providers with different roots and their own copies of the same skills, as two daemons
    on one engine would be."""
    limits = SandboxLimits(pids=64, memory_mb=256, disk_mb=20)
    copy = root / "skills-b"
    shutil.copytree(demo_skills, copy)
    a = SharedDockerProvider(root / "a", demo_skills, image=IMAGE, limits=limits)
    b = SharedDockerProvider(root / "b", copy, image=IMAGE, limits=limits)
    for p in (a, b):
        await p.reconcile()
    yield a, b
    await asyncio.gather(a.close(), b.close())
    for p in (a, b):
        if p._skills is not None:
            await asyncio.to_thread(_remove_skills, p._skills[2])


async def test_a_file_written_on_one_daemon_is_read_on_another(
    pair: tuple[SharedDockerProvider, SharedDockerProvider], threads: list[str]
) -> None:
    a, b = pair
    tid = _thread(threads)
    sa = await a.acquire(tid)
    res = await sa.exec("echo from-a > made-by-shell.txt && id -u")
    assert res.exit_code == 0 and res.output.strip() == "1000", res
    await sa.write_file(f"{WS}/notes/tool.txt", "written by the file tool\n")
    await a.release(tid)
    await a.close()  # the first daemon goes away; the container and volume stay

    sb = await b.acquire(tid)
    assert sb.container_id and container_name(tid).startswith("chital-sbx-")
    assert (await sb.read_file("made-by-shell.txt")).text == "from-a\n"
    assert (await sb.read_file(f"{WS}/notes/tool.txt")).text == "written by the file tool\n"
    res = await sb.exec("cat notes/tool.txt")
    assert res.output == "written by the file tool\n", res
    names = [e.path for e in await sb.ls(WS)]
    assert names == [f"{WS}/made-by-shell.txt", f"{WS}/notes"], names
    assert await sb.glob("*.txt", WS) == [f"{WS}/made-by-shell.txt", f"{WS}/notes/tool.txt"]
    hits = await sb.grep("file tool", "/mnt/user-data")
    assert [(h.path, h.line) for h in hits] == [(f"{WS}/notes/tool.txt", 1)], hits
    assert await sb.edit("notes/tool.txt", "written", "edited") == 1
    assert (await sb.read_bytes("notes/tool.txt")) == b"edited by the file tool\n"
    # The gateway's side: an upload and a file to send, on either daemon, without a turn.
    up = await asyncio.to_thread(
        b.files_for(tid).create_unique, "/mnt/user-data/uploads", "r.txt", b"u" * 300_000
    )
    up2 = await asyncio.to_thread(b.files_for(tid).create_unique, "/mnt/user-data/uploads", "r.txt", b"v")
    assert (up, up2) == ("/mnt/user-data/uploads/r.txt", "/mnt/user-data/uploads/r-2.txt")
    assert (await sb.exec("wc -c < ../uploads/r.txt")).output.strip() == "300000"
    await sb.delete("notes")
    assert await sb.stat("notes/tool.txt") is None


async def test_skills_come_from_a_volume_both_daemons_share(
    pair: tuple[SharedDockerProvider, SharedDockerProvider], threads: list[str]
) -> None:
    """Each daemon has its own copy of the skills; the container is not made anew when the next
    turn runs on the other daemon, and the skills are readable, never writable."""
    a, b = pair
    tid = _thread(threads)
    first = (await a.acquire(tid)).container_id
    sb = await b.acquire(tid)
    assert sb.container_id == first
    assert (await sb.read_file("/mnt/skills/demo/SKILL.md")).text == "# Demo\n"
    assert (await sb.exec("cat /mnt/skills/demo/SKILL.md")).output == "# Demo\n"
    assert (await sb.exec("touch /mnt/skills/x")).exit_code != 0
    with pytest.raises(PathRefused):
        await sb.write_file("/mnt/skills/demo/SKILL.md", "changed")


async def test_two_daemons_starting_one_thread_at_once_share_one_container(
    pair: tuple[SharedDockerProvider, SharedDockerProvider], threads: list[str]
) -> None:
    a, b = pair
    tid = _thread(threads)
    sa, sb = await asyncio.gather(a.acquire(tid), b.acquire(tid))
    assert sa.container_id == sb.container_id
    await sa.exec("echo one > f")
    assert (await sb.exec("cat f")).output == "one\n"


async def test_links_out_of_the_workspace_are_not_followed_through_the_engine(
    pair: tuple[SharedDockerProvider, SharedDockerProvider], threads: list[str]
) -> None:
    a, _ = pair
    tid = _thread(threads)
    sb = await a.acquire(tid)
    res = await sb.exec(
        "ln -s /etc/passwd pw && ln -s / rootfs && ln -s ../uploads up && mkdir d && "
        "ln -s /etc d/etc && echo inside > ok.txt && ln -s ok.txt alias"
    )
    assert res.exit_code == 0, res
    for path in ("pw", "rootfs/etc/passwd", "d/etc/passwd", f"{WS}/../../../etc/passwd"):
        with pytest.raises(SandboxError) as e:
            await sb.read_file(path)
        assert "root:" not in str(e.value)
        with pytest.raises(SandboxError):
            await sb.read_bytes(path)
    with pytest.raises(PathRefused):
        await sb.write_file("pw", "x")
    assert (await sb.read_file("alias")).text == "inside\n"  # a link that stays inside is fine
    listed = [e.path for e in await sb.ls(WS)]
    assert f"{WS}/pw" not in listed and f"{WS}/rootfs" not in listed and f"{WS}/alias" in listed
    assert not [h for h in await sb.grep("root:", "/mnt/user-data") if "root:" in h.text]
    assert await sb.glob("passwd", "/mnt/user-data") == []
    backend = SandboxBackend(sb)
    got = await asyncio.to_thread(backend.download_files, [f"{WS}/pw"])
    assert got[0].content is None and got[0].error, got


async def test_a_mount_dir_swapped_for_a_link_is_not_followed(
    pair: tuple[SharedDockerProvider, SharedDockerProvider], threads: list[str]
) -> None:
    """In the volume the mount dirs are plain dirs the sandbox user owns (not mount points, as
    with host binds), so sandboxed code can swap one for a link to ``/``."""
    a, _ = pair
    tid = _thread(threads)
    sb = await a.acquire(tid)
    res = await sb.exec("cd /mnt/user-data && mv uploads up.old && ln -s /etc uploads && echo swapped")
    assert res.output.strip() == "swapped", res
    for path in ("/mnt/user-data/uploads/passwd", "/mnt/user-data/uploads"):
        with pytest.raises(PathRefused):
            await sb.read_file(path)
    with pytest.raises(PathRefused):
        await sb.ls("/mnt/user-data/uploads")
    with pytest.raises(PathRefused):
        await asyncio.to_thread(a.files_for(tid).create_unique, "/mnt/user-data/uploads", "p.txt", b"x")
    assert not [h for h in await sb.grep("root:", "/mnt/user-data") if "root:" in h.text]
    assert (await sb.exec("true")).exit_code == 0  # the quota's walk skips the link


async def test_huge_files_are_capped_and_the_quota_holds(
    pair: tuple[SharedDockerProvider, SharedDockerProvider], threads: list[str]
) -> None:
    a, _ = pair
    tid = _thread(threads)
    sb = await a.acquire(tid)
    # Sparse: 15 MB of nothing (the file size limit is the 20 MB quota), one line that never ends, costs no disk.
    assert (
        await sb.exec("truncate -s 15M big && head -c 3000000 /dev/zero | tr '\\0' a > wide")
    ).exit_code == 0
    with pytest.raises(SandboxError, match="larger than 1048576 bytes"):
        await sb.read_bytes("big", 1024 * 1024)
    window = await sb.read_file("wide")
    assert len(window.text) < 10_000 and "line cut" in window.text
    with pytest.raises(SandboxError, match="binary"):
        await sb.read_file("big")
    # A FIFO (whose reader would wait for ever) and a device are refused, not read.
    assert (await sb.exec("mkfifo pipe")).exit_code == 0
    for path in ("pipe", "/mnt/user-data/workspace/pipe"):
        with pytest.raises(SandboxError, match="not a regular file"):
            await sb.read_file(path)
        with pytest.raises(SandboxError, match="not a regular file|No such device"):  # no reader: ENXIO
            await sb.write_file(path, "x")
    await sb.delete("pipe")
    # The quota (20 MB here) is measured in the volume. An edit counts only its growth: 15 MB
    # used, a 7 MB file edited.
    made = await sb.exec(
        "(echo UNIQUE; yes hello | head -c 7000000) > edit.txt && head -c 8000000 /dev/urandom > pad && rm wide big"
    )
    assert made.exit_code == 0, made
    assert await sb.edit("edit.txt", "UNIQUE", "CHANGED") == 1
    assert (await sb.read_file("edit.txt", 0, 2)).text == "CHANGED\nhello\n"
    await sb.delete("pad")
    await sb.delete("edit.txt")
    # A write past the quota is refused.
    with pytest.raises(QuotaExceeded):
        await sb.write_file("fill.bin", b"x" * (21 * 1024 * 1024))
    res = await sb.exec("head -c 25000000 /dev/zero > fill.bin; echo done")
    assert "disk quota exceeded" in res.output, res
    with pytest.raises(QuotaExceeded):
        await sb.exec("true")
    await sb.delete("fill.bin")
    assert (await sb.exec("true")).exit_code == 0


async def test_an_idle_container_is_reaped_and_its_volume_kept(root: Path, threads: list[str]) -> None:
    """Daemon ``p`` reaps; daemon ``other`` still holds the thread's sandbox from an earlier turn,
    and its next command gets a new container with the same files."""
    limits = SandboxLimits(pids=64, memory_mb=256)
    p = SharedDockerProvider(root / "r", image=IMAGE, limits=limits, idle_timeout=1)
    other = SharedDockerProvider(root / "o", image=IMAGE, limits=limits)
    try:
        tid = _thread(threads)
        held = await other.acquire(tid)
        await held.exec("echo kept > k")
        await other.release(tid)
        gone: list[str] = []
        for _ in range(100):
            gone = await p.reap_idle()
            if tid in gone:
                break
            await asyncio.sleep(0.2)
        assert tid in gone

        import docker

        client = docker.from_env()
        try:
            assert not client.containers.list(all=True, filters={"name": container_name(tid)})
            assert client.volumes.get(volume_name(tid))
        finally:
            client.close()
        assert (await held.exec("cat k")).output == "kept\n"
        assert (await held.read_file("k")).text == "kept\n"
    finally:
        await asyncio.gather(p.close(), other.close())


async def test_a_recently_used_container_is_not_reaped(root: Path, threads: list[str]) -> None:
    """The last-use stamp is written (a container without one would look idle for ever), and only
    a daemon that owns the timers reaps."""
    p = SharedDockerProvider(root / "r", image=IMAGE, limits=SandboxLimits(pids=64, memory_mb=256))
    try:
        tid = _thread(threads)
        await p.acquire(tid)
        await p.release(tid)
        p.idle_timeout = 60
        assert tid not in await p.reap_idle()
        p.idle_timeout = 0
        p.reap_gate = lambda: False  # not the timers' owner: another daemon reaps
        assert await p.reap_idle() == []
        p.reap_gate = lambda: True
        assert tid in await p.reap_idle()
    finally:
        await p.close()


async def test_a_busy_container_is_not_reaped(root: Path, threads: list[str]) -> None:
    p = SharedDockerProvider(
        root / "r", image=IMAGE, limits=SandboxLimits(pids=64, memory_mb=256), idle_timeout=1
    )
    try:
        tid = _thread(threads)
        sb = await p.acquire(tid)
        run = asyncio.ensure_future(sb.exec("touch started; sleep 60; echo survived"))
        await _started(sb)
        await asyncio.sleep(1.2)  # past idle_timeout since the stamp
        assert tid not in await p.reap_idle()
        assert not run.done()  # still running: the container was left alone
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    finally:
        await p.close()


async def test_a_tree_hidden_from_the_quota_counts_as_over_it(
    pair: tuple[SharedDockerProvider, SharedDockerProvider], threads: list[str]
) -> None:
    """A directory made unreadable cannot hide what it holds from the measurement."""
    a, _ = pair
    tid = _thread(threads)
    sb = await a.acquire(tid)
    assert (
        await sb.exec("mkdir -p hide/deep && head -c 1000 /dev/zero > hide/deep/f && chmod 000 hide")
    ).exit_code == 0
    with pytest.raises(QuotaExceeded, match="not readable"):
        await sb.exec("true")
    with pytest.raises(QuotaExceeded):
        await sb.write_file("x.txt", "x")


async def test_a_link_to_an_unreadable_directory_does_not_block_the_thread(
    pair: tuple[SharedDockerProvider, SharedDockerProvider], threads: list[str]
) -> None:
    """The measurement never follows a link: one to a directory the sandbox user cannot read
    (``ln -s /root``) is a link, not a hidden tree that blocks the thread's commands and writes."""
    a, _ = pair
    sb = await a.acquire(_thread(threads))
    res = await sb.exec("mkdir /tmp/locked && chmod 000 /tmp/locked && ln -s /tmp/locked locked && echo made")
    assert res.output.strip() == "made", res
    assert (await sb.exec("echo still")).output.startswith("still")
    await sb.write_file("after.txt", "written\n")


async def test_a_container_removed_under_a_running_command_is_an_answer_not_a_crash(
    pair: tuple[SharedDockerProvider, SharedDockerProvider], threads: list[str]
) -> None:
    """The reaper's window: removed between its check and another daemon's command. The command
    ends as killed, and the next one runs in a new container with the same files."""
    a, _ = pair
    tid = _thread(threads)
    sb = await a.acquire(tid)
    await sb.exec("echo still > here")
    run = asyncio.ensure_future(sb.exec("touch started; sleep 30; echo never"))
    await _started(sb)
    await asyncio.to_thread(_remove_container, tid)
    res = await asyncio.wait_for(run, 30)
    assert "never" not in res.output and res.exit_code != 0, res
    assert (await sb.exec("cat here")).output == "still\n"


def _remove_container(tid: str) -> None:
    import docker

    client = docker.from_env()
    try:
        client.containers.get(container_name(tid)).remove(force=True)
    finally:
        client.close()


async def _started(sb: Any) -> None:
    """Wait (generously) until the command has written ``started``: it runs now."""
    for _ in range(600):
        if await sb.stat("started") is not None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the command never started")
