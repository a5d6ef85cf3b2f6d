"""Start-up fails cleanly and health tells the truth: what an operator sees on stderr, in the exit
code and on /readyz when the port is taken, the data directory cannot be written or the agent cannot
be built; and that a failed start releases what it opened, newest first."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.schema import parse_config
from gateway.daemon import app as app_module
from gateway.daemon.app import Daemon
from gateway.daemon.lifecycle import Resources, StartupError
from tests.daemon import DaemonProcess, base_config, free_port, start_chital
from tests.disks import fill
from tests.fakes.openai_server import FakeOpenAI


async def run_daemon_expecting_exit(
    config: dict[str, Any], tmp_path: Path, timeout: float = 20
) -> tuple[int, str, str, float]:
    """``chital run`` that must end by itself: (exit code, stdout, stderr, seconds it took)."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    proc = await start_chital("run", "-c", str(path), stderr_apart=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"chital run did not exit within {timeout}s (it hangs)") from None
    return int(proc.returncode or 0), out.decode(), err.decode(), time.monotonic() - started


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("chital:")]


def assert_one_clear_line(stderr: str, *needles: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def offline_config(tmp_path: Path, port: int, data: Path | None = None) -> dict[str, Any]:
    """No model endpoint is contacted at start-up, so any URL will do."""
    return base_config(data or tmp_path / "data", "http://127.0.0.1:9/v1", port)


# -- start-up failures -----------------------------------------------------------------------------
async def test_port_in_use_exits_at_once_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, _, err, took = await run_daemon_expecting_exit(offline_config(tmp_path, port), tmp_path)
    assert rc != 0
    assert took < 15, f"took {took:.1f}s"
    line = assert_one_clear_line(err, f"127.0.0.1:{port}", "address already in use", "http.port")
    assert line == f"chital: cannot listen on 127.0.0.1:{port}: address already in use (set http.port)"


async def test_data_dir_that_is_a_file_exits_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.write_text("not a directory")
    rc, _, err, _ = await run_daemon_expecting_exit(offline_config(tmp_path, free_port(), data), tmp_path)
    assert rc != 0
    assert_one_clear_line(err, str(data), "not a directory", "storage.path")


@pytest.fixture
def immutable_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory even root cannot write into (``chattr +i``), or a skip where that is not possible."""
    path = tmp_path / "frozen"
    path.mkdir()
    if (
        not shutil.which("chattr")
        or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode
    ):
        pytest.skip("chattr +i is not available here")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


async def test_read_only_data_dir_exits_with_one_line(tmp_path: Path, immutable_dir: Path) -> None:
    probe = immutable_dir / "probe"
    with pytest.raises(OSError):
        probe.write_text("x")  # really read-only, for root too
    rc, _, err, _ = await run_daemon_expecting_exit(
        offline_config(tmp_path, free_port(), immutable_dir), tmp_path
    )
    assert rc != 0
    assert_one_clear_line(err, str(immutable_dir), "not writable")
    assert not (immutable_dir / "gateway.sqlite").exists()


async def test_full_disk_exits_with_one_line(tmp_path: Path, tmpfs: Callable[[str], Path]) -> None:
    small_disk = tmpfs("2m")
    # Room for the database, none for the journal's reserve (4 MB of 2).
    cfg = offline_config(tmp_path, free_port(), small_disk / "data")
    cfg["storage"]["reserve_mb"] = 4
    rc, _, err, _ = await run_daemon_expecting_exit(cfg, tmp_path)
    assert rc != 0
    assert_one_clear_line(err, str(small_disk / "data"), "full", "storage.reserve_mb")
    # And a disk without even room for a small file.
    fill(small_disk)
    cfg["storage"]["reserve_mb"] = 0
    rc, _, err, _ = await run_daemon_expecting_exit(cfg, tmp_path)
    assert rc != 0
    assert_one_clear_line(err, "not writable", "the disk is full")


# -- the release discipline ------------------------------------------------------------------------
async def test_resources_release_newest_first_and_gather_errors() -> None:
    res = Resources()
    order: list[str] = []

    async def release(name: str, fail: bool = False) -> None:
        order.append(name)
        if fail:
            raise RuntimeError(f"{name} broke")

    async def background() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            order.append("task")

    res.push("store", lambda: release("store"))
    res.push("agent", lambda: release("agent", fail=True))
    res.push("channel", lambda: release("channel"))
    res.spawn(background(), "bg")
    await asyncio.sleep(0)
    errors = await res.release_all()
    assert order == ["task", "channel", "agent", "store"], "tasks first, then newest resource first"
    assert [name for name, _ in errors] == ["agent"] and "agent broke" in str(errors[0][1])
    assert not res.tasks
    with pytest.raises(RuntimeError, match="already closed"):
        res.push("late", lambda: release("late"))


def _gateway_threads() -> set[threading.Thread]:
    """Non-daemon threads besides the loop's executor (which asyncio.run shuts down itself)."""
    return {
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and not t.name.startswith("asyncio_")
    }


async def test_failed_start_releases_what_it_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure after the store, the agent and the HTTP port are open: all released, the port is
    free again, no thread is left to keep the process alive, one StartupError line."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    port = free_port()
    cfg = parse_config({"storage": {"path": str(tmp_path / "data")}, "http": {"port": port}})
    before = _gateway_threads()
    closed: list[str] = []
    real_close = app_module.UnconfiguredHarness.close

    async def close_harness(self: Any) -> None:
        closed.append("agent")
        await real_close(self)

    def broken_channels(*_: Any) -> Any:
        raise RuntimeError("adapter import failed")

    monkeypatch.setattr(app_module.UnconfiguredHarness, "close", close_harness)
    monkeypatch.setattr(app_module, "build_channels", broken_channels)
    daemon = Daemon(cfg)
    with pytest.raises(StartupError, match="start-up failed: RuntimeError: adapter import failed"):
        await daemon.start()
    assert daemon.state == "stopped"
    assert daemon.store is None and closed == ["agent"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the HTTP port was released
    await asyncio.sleep(0.1)
    assert _gateway_threads() <= before, "the database thread is gone"
    with pytest.raises(RuntimeError, match="called while the daemon is stopped"):
        await daemon.start()


# -- health ----------------------------------------------------------------------------------------
async def test_readiness_includes_the_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No API key: the daemon runs (every message gets a clear answer) but is not ready, and says why."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cfg = parse_config({"storage": {"path": str(tmp_path / "data")}, "http": {"enabled": False}})
    daemon = Daemon(cfg)
    await daemon.start()
    try:
        body = daemon.readiness()
        assert body["ready"] is False and daemon.ready() is False
        assert body["agent"]["state"] == "failed"  # type: ignore[index]
        assert any("agent:" in why and "OPENAI_API_KEY" in why for why in body["why"])  # type: ignore[union-attr]
        assert body["storage"]["open"] is True  # type: ignore[index]
    finally:
        await daemon.stop()
    assert daemon.state == "stopped"


async def test_readyz_says_the_agent_failed_to_build(tmp_path: Path) -> None:
    cfg = offline_config(tmp_path, free_port())
    cfg["models"][0]["use"] = "no_such_package_here:ChatNothing"
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start(wait_ready=False)
        # /healthz answers before the agent is built (the port is taken first): wait for its verdict.
        for _ in range(200):
            status, body = await d.get("/readyz")
            if body["agent"]["state"] != "starting":
                break
            await asyncio.sleep(0.05)
        assert status == 503
        assert body["ready"] is False and body["agent"]["state"] == "failed"
        assert "cannot import" in body["agent"]["reason"]
        assert any(why.startswith("agent:") for why in body["why"])
        assert "sk-test-key-never-logged" not in str(body)
        assert "chital_ready 0.0" in await d.metrics()
        assert await d.terminate() == 0
    finally:
        await d.close()


async def test_readyz_ready_names_the_model(tmp_path: Path, model: FakeOpenAI) -> None:
    d = DaemonProcess(tmp_path, base_config(tmp_path / "data", model.base_url, free_port()))
    try:
        await d.start()
        status, body = await d.get("/readyz")
        assert status == 200 and body["why"] == []
        assert body["agent"] == {"state": "ready", "model": "fake-model"}
        assert "chital_ready 1.0" in await d.metrics()
        assert await d.terminate() == 0
        assert "stopped cleanly" in d.logs()
    finally:
        await d.close()


async def test_sigterm_during_start_up_releases_what_was_opened_and_exits(tmp_path: Path) -> None:
    """SIGTERM as soon as /healthz answers (the HTTP listener opens first, the agent stack is
    still being built): the start is cancelled, what it opened is released, the process exits 0,
    and no task is left behind."""
    d = DaemonProcess(tmp_path, offline_config(tmp_path, free_port()))
    try:
        await d.start(wait_ready=False)
        code = await d.terminate(timeout=30)
        log = d.log_path.read_text()
        assert code == 0, log
        assert "stop requested during start-up: releasing what was opened" in log, log
        assert "Traceback" not in log and "still waiting" not in log, log
    finally:
        await d.close()
