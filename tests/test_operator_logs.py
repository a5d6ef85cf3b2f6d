"""The operator's first start, read as a log: one line per event, at the level it deserves. A first
start with no model yet and a Telegram channel that cannot connect must say each thing once, with
no ERROR for what is expected, and the URLs and commands the log points at must answer cleanly."""

from __future__ import annotations

import asyncio
import itertools
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.daemon import REPO, DaemonProcess, base_config, free_port

LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): (.*)$")


def parsed(log: str) -> list[tuple[str, str, str]]:
    """(level, logger, message) of each log line; the CLI's own lines are left out."""
    return [m.groups() for m in map(LINE.match, log.splitlines()) if m]  # type: ignore[misc]


@pytest.fixture
async def first_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[DaemonProcess]:
    """A daemon on a new data directory, no model key anywhere, Telegram on against a closed port."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CHITAL_MODEL"):
        monkeypatch.delenv(name, raising=False)
    cfg = base_config(tmp_path / "data", "http://127.0.0.1:9/v1", free_port())
    del cfg["models"][0]["api_key"]
    del cfg["models"][0]["base_url"]  # api.openai.com: a key is needed (a local server needs none)
    cfg["channels"]["telegram"] = {
        "enabled": True,
        "token": "123456:ABCdefGHIjklMNOpqrSTUvwxYZ0123456789",
        "base_url": f"http://127.0.0.1:{free_port()}/bot",  # nothing listens there
    }
    daemon = DaemonProcess(tmp_path, cfg)
    await daemon.start(wait_ready=False)
    yield daemon
    await daemon.close()


async def wait_for(daemon: DaemonProcess, needle: str, count: int = 1, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = daemon.logs()
        if log.count(needle) >= count:
            return log
        await asyncio.sleep(0.2)
    raise AssertionError(f"{needle!r} x{count} never logged:\n{daemon.logs()[-3000:]}")


async def test_a_first_start_says_each_thing_once(first_start: DaemonProcess) -> None:
    # Four reconnect attempts: enough to see whether each attempt is one line or several.
    log = await wait_for(first_start, "restarting in", count=4)
    lines = parsed(log)
    assert not [m for lvl, _, m in lines if lvl in ("ERROR", "CRITICAL")], log
    schema = [m for _, name, m in lines if name == "gateway.store.schema"]
    assert schema == [f"database schema created (version {_schema_version()})"], schema
    # Each channel that is off is named once (in the start-up summary), not three times.
    for name in ("slack", "discord", "lark"):
        mentions = [m for _, _, m in lines if re.search(rf"\b{name}\b.*\boff\b", m)]
        assert len(mentions) == 1, (name, mentions)
    assert not any("telegram" in m and " off" in m for _, _, m in lines)
    # The model is not configured: one warning that says how to fix it; the sandbox is not blamed.
    model = [(lvl, m) for lvl, _, m in lines if "NOT CONFIGURED" in m or "not configured" in m]
    assert model == [(lvl, m) for lvl, m in model if lvl == "WARNING"] and len(model) == 1, model
    assert "OPENAI_API_KEY" in model[0][1]
    sandbox = [(lvl, m) for lvl, _, m in lines if m.lstrip().startswith("sandbox")]
    assert sandbox and all(lvl == "INFO" for lvl, _ in sandbox), sandbox
    # A reconnecting channel: one line per change of state (a repeat of the same state, with a new
    # reason, is not an event), and one line per attempt with its delay (was four per attempt).
    states = [
        m.split(":", 1)[1].split()[0]
        for _, name, m in lines
        if name == "gateway.daemon.app" and m.startswith("channel telegram:")
    ]
    assert states and all(a != b for a, b in itertools.pairwise(states)), states
    others = [
        m
        for lvl, name, m in lines
        if "telegram" in m
        and lvl == "WARNING"
        and name not in ("gateway.daemon.app", "gateway.daemon.summary")
    ]
    assert others and all("restarting in" in m for m in others), others


async def test_the_url_the_summary_prints_answers(first_start: DaemonProcess) -> None:
    log = await wait_for(first_start, "(healthz, readyz, metrics)")
    url = re.search(r"http\s+(http://\S+/)", log)
    assert url, log
    async with aiohttp.ClientSession() as s, s.get(url.group(1)) as r:
        body = await r.text()
    assert r.status == 200 and "/healthz" in body and "/readyz" in body and "/metrics" in body


async def test_status_into_a_closed_pipe_ends_quietly(first_start: DaemonProcess) -> None:
    """`chital status --json | true`: the reader is gone before chital writes. No traceback."""
    await wait_for(first_start, "chital is running")
    cmd = f"{sys.executable} -m gateway.cli -c {first_start.config_path} status --json | true"
    done = await asyncio.to_thread(
        subprocess.run, ["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def _schema_version() -> int:
    from gateway.store.schema import SCHEMA_VERSION

    return SCHEMA_VERSION
