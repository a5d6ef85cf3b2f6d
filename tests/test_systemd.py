"""Running under systemd: the shipped unit is one systemd accepts, and the daemon speaks sd_notify
(READY once it serves, WATCHDOG from its loop, STOPPING at SIGTERM) to a real datagram socket, as
systemd's own NOTIFY_SOCKET is."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon import REPO, DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI

UNIT = REPO / "deploy" / "chital.service"


def test_the_shipped_unit_is_one_systemd_accepts(tmp_path: Path) -> None:
    """``systemd-analyze verify`` reads the unit as systemd would; it reports unknown keys and bad
    values on stderr (with exit 0), so any output is a failure. ExecStart must name an existing
    program: the copy points it at this interpreter's ``chital``."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    chital = Path(sys.executable).parent / "chital"
    if not chital.exists():
        pytest.skip(f"no chital entry point beside {sys.executable}")
    text = UNIT.read_text()
    assert "ExecStart=/opt/chital/.venv/bin/chital -c /etc/chital/config.yaml run" in text
    assert "Type=notify" in text and "WatchdogSec=" in text and "Restart=on-failure" in text
    copy = tmp_path / "chital.service"
    copy.write_text(text.replace("/opt/chital/.venv/bin/chital", str(chital)))
    done = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


async def test_the_daemon_notifies_systemd(
    tmp_path: Path, model: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(sock_path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # a ping every 0.1 s
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    loop = asyncio.get_running_loop()
    daemon = DaemonProcess(tmp_path, base_config(tmp_path / "data", model.base_url, free_port()))

    async def next_datagram() -> str:
        return (await asyncio.wait_for(loop.sock_recv(sock, 4096), 30)).decode()

    try:
        await daemon.start()
        first = await next_datagram()
        assert first.splitlines()[0] == "READY=1", first
        assert "STATUS=running" in first
        pings = [await next_datagram() for _ in range(3)]
        assert pings == ["WATCHDOG=1"] * 3
        assert await daemon.terminate() == 0
        rest = []
        while True:
            try:
                rest.append(sock.recv(4096).decode())
            except BlockingIOError:
                break
        assert any(d.startswith("STOPPING=1") for d in rest), rest
    finally:
        await daemon.close()
        sock.close()
