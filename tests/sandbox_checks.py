"""Escape checks shared by the sandbox providers' tests: every provider must pass the same ones."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest


async def assert_no_network(sb: Any) -> None:
    """Neither the host's loopback (a live server on 127.0.0.1) nor the internet is reachable, and
    the only interface is the sandbox's own loopback."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"reached the host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        script = (
            "import socket\n"
            f"for host, port in (('127.0.0.1', {port}), ('1.1.1.1', 80)):\n"
            "    s = socket.socket(); s.settimeout(3)\n"
            "    print(host, s.connect_ex((host, port)))\n"
        )
        res = await sb.exec(f'python3 -c "{script}"; cat /proc/net/dev', timeout=20)
    finally:
        server.close()
        await server.wait_closed()
    assert "reached the host" not in res.output
    results = dict(line.split() for line in res.output.splitlines()[:2])
    assert results["127.0.0.1"] == "111"  # ECONNREFUSED: the sandbox's own empty loopback
    assert results["1.1.1.1"] in {"101", "113"}  # ENETUNREACH / EHOSTUNREACH: no route at all
    interfaces = [line.split(":")[0].strip() for line in res.output.splitlines() if ":" in line]
    assert interfaces == ["lo"]


_FORK_500 = (
    "import os, time\n"
    "n = 0\n"
    "try:\n"
    "    for _ in range(500):\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30); os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print('fork failed', e.errno)\n"
    "print('forked', n)\n"
)


async def assert_fork_limited(sb: Any, below: int = 64) -> None:
    """Forking 500 children stops with EAGAIN before ``below`` processes."""
    res = await sb.exec(f'python3 -c "{_FORK_500}"', timeout=30)
    assert "fork failed 11" in res.output  # EAGAIN
    assert int(res.output.split("forked")[1].split()[0]) < below


_FORK_AND_HOLD = (
    "import os, sys, time\n"
    "n = 0\n"
    "try:\n"
    "    while n < 5000:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(60); os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print('fork failed', e.errno)\n"
    "print('held', n, flush=True)\n"
    "open('/mnt/user-data/workspace/.held', 'w').close()\n"
    # Hold every slot until the test says so (a file in the workspace), at most HOLD seconds: B's
    # commands then surely ran while A was full, however slow this machine is today.
    "end = time.time() + HOLD\n"
    "while time.time() < end and not os.path.exists('/mnt/user-data/workspace/.release'):\n"
    "    time.sleep(0.1)\n"
)
_NEEDS_FORKS = "for i in 1 2 3 4 5 6 7 8; do (true) & done; wait; python3 -c 'print(6*7)'; echo ok-$1"


async def assert_fork_bomb_isolated(a: Any, b: Any, pids: int) -> None:
    """A sandbox holding every process slot it may have (and a classic shell fork bomb) does not
    stop another thread's sandbox from starting and forking: process limits are per sandbox, not
    per host uid. Both commands are bounded by their timeouts."""
    holder = asyncio.create_task(a.exec(f'python3 -c "{_FORK_AND_HOLD.replace("HOLD", "60")}"', timeout=90))
    # The bomb starts once the holder holds its slots: started together, the bomb could take them
    # all first and the holder's own process would never start (seen on a loaded CI machine).
    held_flag = a.dirs.workspace / ".held"
    for _ in range(600):
        if held_flag.exists() or holder.done():
            break
        await asyncio.sleep(0.05)
    assert held_flag.exists(), f"the holder never took its slots: {holder.result() if holder.done() else ''}"
    # `wait` (a builtin: it needs no fork) keeps the bomb alive until its timeout, well after B
    # has run: a bomb that ended early would be cleaned up mid-check (in Docker, with every slot
    # taken, that cleanup may take the holder down with it) and B would meet an empty sandbox.
    bomb = asyncio.create_task(a.exec("bomb() { bomb | bomb & }; bomb; wait", timeout=30))
    await asyncio.sleep(2.5)  # both hold their slots by now (forking stops within a second)
    started = time.monotonic()
    for i in range(3):
        res = await b.exec(f"set -- {i}; {_NEEDS_FORKS}", timeout=20)
        assert res.exit_code == 0, res.output
        assert res.output.splitlines()[-2:] == ["42", f"ok-{i}"], res.output
    assert time.monotonic() - started < 30
    assert not holder.done(), f"the holder must still hold its processes while B ran: {holder.result()}"
    (a.dirs.workspace / ".release").write_text("")
    held = await holder
    assert "fork failed 11" in held.output, held.output  # EAGAIN: A hit its own limit...
    assert int(held.output.split("held")[1].split()[0]) < pids  # ...at its own size
    await bomb
    assert (await a.exec("echo a-alive")).output == "a-alive\n"


async def assert_disk_quota(sb: Any, quota_mb: int) -> None:
    """``sb`` has a ``quota_mb`` disk quota (small, e.g. 5): a command writing 10x that is stopped
    with a plain message, the next command and file writes are refused until files are deleted,
    then everything works again. Checked in both ways a command meets the limit: writing fast
    (caught when it ends) and writing on and on (killed by the watchdog)."""
    from agent.sandbox import QuotaExceeded

    big = quota_mb * 10
    res = await sb.exec(f"for i in $(seq {big}); do head -c 1M /dev/zero > f$i.bin; done; echo wrote-all")
    assert "disk quota exceeded" in res.output, res.output
    assert f"MB used of {quota_mb} MB" in res.output and "/mnt/user-data/workspace" in res.output
    with pytest.raises(QuotaExceeded, match=f"disk quota exceeded: .* MB used of {quota_mb} MB"):
        await sb.exec("echo refused")
    with pytest.raises(QuotaExceeded, match="disk quota exceeded"):
        await sb.write_file("/mnt/user-data/outputs/more.txt", "x" * 100_000)
    for name in await sb.glob("f*.bin", "/mnt/user-data/workspace"):
        await sb.delete(name)
    assert (await sb.exec("echo works-again")).output == "works-again\n"
    await sb.write_file("/mnt/user-data/outputs/small.txt", "fits")

    # A writer that never stops by itself: the watchdog kills it, well before its timeout.
    started = time.monotonic()
    res = await sb.exec(
        "i=0; while true; do i=$((i+1)); head -c 256K /dev/zero > slow$i.bin; sleep 0.01; done", timeout=60
    )
    assert time.monotonic() - started < 20
    assert not res.timed_out and res.stopped and "disk quota exceeded" in res.stopped
    assert res.output.rstrip().endswith("]") and "[command stopped: disk quota exceeded" in res.output
    with pytest.raises(QuotaExceeded):
        await sb.exec("true")
    for name in await sb.glob("slow*.bin", "/mnt/user-data/workspace"):
        await sb.delete(name)
    assert (await sb.exec("echo ok")).output == "ok\n"


async def assert_free_space_floor(make_sandbox: Any) -> None:
    """A floor above the disk's real free space refuses commands and writes with a message that
    names the floor; a floor crossed while a command writes kills that command."""
    from agent.sandbox import QuotaExceeded

    mb = 1024 * 1024
    sb = await make_sandbox("floor-refused", lambda free: free // mb + 1000)
    with pytest.raises(QuotaExceeded, match="host disk is nearly full: .* MB free, and .* MB are kept free"):
        await sb.exec("echo no")
    with pytest.raises(QuotaExceeded, match="host disk is nearly full"):
        await sb.write_file("note.txt", "x")
    assert not (sb.dirs.workspace / "note.txt").exists()

    # 150 MB above the floor (other processes on the machine write too: a narrower margin was
    # crossed before the command started); the command writes 400 MB: stopped at the floor.
    sb = await make_sandbox("floor-crossed", lambda free: free // mb - 150)
    res = await sb.exec("for i in $(seq 400); do head -c 1M /dev/zero > f$i.bin; done; echo done", timeout=60)
    assert res.stopped and "host disk is nearly full" in res.stopped, res.output
    written = sum(p.stat().st_size for p in sb.dirs.workspace.glob("f*.bin"))
    assert written < 300 * mb


async def assert_daemon_restart_keeps_sandbox(tg: Any, model: Any, provider: str, *, crash: bool) -> None:
    """Through ``chital run``: a sandboxed command works, the daemon stops (SIGTERM, or kill -9
    with ``crash``, which leaves Docker containers behind for reconcile), starts again on the same
    data dir, and a sandboxed command works again in the same thread dir.

    The sandbox root is the default one (``sandboxes`` under the storage path) although another
    sandbox key is set: that used to move it. The data dir is traversable by the sandbox uid, as
    the start-up check demands (pytest's own tmp dirs are private to root)."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from tests.daemon import DaemonProcess
    from tests.fakes.openai_server import Reply, ToolCall, last_user_text
    from tests.telegram_daemon import OWNER, answered, telegram_config

    work = Path(tempfile.mkdtemp(prefix="chital-restart-", dir="/tmp"))
    os.chmod(work, 0o711)
    cfg = telegram_config(work, tg, model)
    cfg["agent"]["sandbox"] = {"provider": provider, "exec_timeout": 60}
    cfg["agent"]["memory"] = {"enabled": False}  # its background model calls are not part of this
    daemon = DaemonProcess(work, cfg)
    root = work / "data" / "sandboxes"

    def reply(body: dict[str, Any]) -> Any:
        n = last_user_text(body).split()[-1]
        if body["messages"][-1].get("role") == "tool":
            return Reply(text=f"turn {n} done")
        return Reply(tool_calls=[ToolCall("execute", {"command": f"echo run-{n} >> log.txt; cat log.txt"})])

    model.add_rule(lambda text: text.startswith("run number "), reply)

    async def turn(n: int) -> str:
        await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, f"run number {n}"), f"turn {n} done", 60)
        request = next(r for r in reversed(model.requests) if r["messages"][-1].get("role") == "tool")
        return str(request["messages"][-1]["content"])

    try:
        await daemon.start()
        assert "run-1" in await turn(1), daemon.logs()
        if crash:
            daemon.kill9()
            await daemon.wait_exit()
        else:
            assert await daemon.terminate() == 0
        await daemon.start()
        try:
            out = await turn(2)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{daemon.logs()}") from None
        assert "run-1\nrun-2" in out, f"{out}\n{daemon.logs()}"
        logs = daemon.logs()
        assert "cannot reach" not in logs and "not usable" not in logs, logs
        (thread,) = list((root / "threads").iterdir())
        assert (thread / "workspace" / "log.txt").read_text() == "run-1\nrun-2\n"
        if os.geteuid() == 0:
            assert root.stat().st_mode & 0o777 == 0o711
    finally:
        await daemon.close()
        if provider == "docker":
            import docker

            from agent.sandbox.docker_provider import LABEL_INSTANCE, DockerProvider

            client = docker.from_env()
            instance = DockerProvider(root).instance
            for c in client.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}):
                c.remove(force=True)
            client.close()
        shutil.rmtree(work, ignore_errors=True)
