"""What an operator sees without reading code: the start-up summary and ``chital status``.

Through ``chital run`` as a subprocess, the fake Telegram Bot API and the fake model: the summary's
lines in the log, and ``chital status`` (another subprocess, over the daemon's Unix socket) as the
Telegram connection goes down, a turn is held, the daemon is killed and restarted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
import sys
import time
from pathlib import Path

import pytest

from gateway.daemon.status import RecentErrors
from gateway.daemon.summary import channel_lines, endpoint
from gateway.ops.logs import RedactingFilter
from tests.daemon import REPO, DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, answered, telegram_config

API_KEY = "sk-test-key-never-logged"


def sock_of(d: DaemonProcess) -> Path:
    return Path(d.config["storage"]["path"]) / "status.sock"


async def summary_of(d: DaemonProcess, timeout: float = 20.0) -> str:
    """The log from the summary's first line to its last (the ``status`` line), once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = d.log_path.read_text(errors="replace") if d.log_path.exists() else ""
        if "chital is up" in text and "  status    " in text[text.index("chital is up") :]:
            start = text.index("chital is up")
            end = text.index("\n", text.index("  status    ", start))
            return text[start:end]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no start-up summary in {timeout}s:\n{d.logs()}")


async def status_until(d: DaemonProcess, needle: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        code, out = await d.cli("status")
        if code == 0 and needle in out:
            return out
        await asyncio.sleep(0.3)
    raise AssertionError(f"`chital status` never showed {needle!r}; last:\n{out}\n{d.logs()}")


async def test_summary_then_status_as_telegram_goes_down(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    text = await summary_of(telegram_daemon)
    data = Path(telegram_daemon.config["storage"]["path"])
    model_port = model.base_url.split("://", 1)[1].split("/", 1)[0]
    assert "channel telegram  connected" in text
    assert "channel slack     off: " in text and "channel discord   off: " in text
    assert f"model     default: fake-model at {model_port} (langchain_openai:ChatOpenAI)" in text
    bwrap = shutil.which("bwrap")
    if bwrap:  # isolating, or said loudly that it cannot (a container without user namespaces)
        assert f"sandbox   local, bubblewrap {bwrap}: isolating (commands run as" in text or (
            f"sandbox   local, bubblewrap {bwrap} CANNOT ISOLATE here" in text
        ), text
    else:
        assert "sandbox   local, bubblewrap NOT INSTALLED: the agent's commands are refused" in text
    url = telegram_daemon.config["storage"].get(
        "url"
    )  # the PostgreSQL pass: its server and database, no user
    database = f"postgres at {url.split('@')[-1]}" if url else data / "gateway.sqlite"
    assert f"data      {data}; database {database}; sandboxes {telegram_daemon.sandbox_root}" in text
    assert "logs      stderr" in text
    assert f"http      http://127.0.0.1:{telegram_daemon.port}/ (healthz, readyz, metrics)" in text
    assert f"status    `chital status` (socket {data / 'status.sock'})" in text
    assert API_KEY not in telegram_daemon.logs() and tg.token not in telegram_daemon.logs()

    mode = stat.S_IMODE(os.stat(sock_of(telegram_daemon)).st_mode)
    assert stat.S_ISSOCK(os.stat(sock_of(telegram_daemon)).st_mode) and mode == 0o600, oct(mode)

    code, out = await telegram_daemon.cli("status")
    assert code == 0, out
    assert "daemon: running, ready" in out
    assert "agent: ready, model fake-model" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("telegram"))
    assert line.split()[1] == "connected" and "since " in line
    assert next(ln for ln in out.splitlines() if ln.strip().startswith("slack")).split()[1] == "off"
    assert "queue: 0 pending, 0 running, 0 parked" in out
    # Alone, the daemon runs the timers (on PostgreSQL once it holds the leader lock: moments after start).
    await status_until(telegram_daemon, "timers: owned here (approval timeouts, schedules, retention)")

    await tg.stop()  # the Bot API goes away under a running daemon
    try:
        out = await status_until(telegram_daemon, "reconnecting")
        line = next(ln for ln in out.splitlines() if ln.strip().startswith("telegram"))
        assert "reconnecting" in line and "Telegram" in line, line
        assert "daemon: running, NOT ready" in out
        warnings = out[out.index("recent warnings") :]
        assert "telegram" in warnings and "reconnecting" in warnings, out
        code, raw = await telegram_daemon.cli("status", "--json")
        body = json.loads(raw)
        assert body["channels"]["telegram"]["state"] == "reconnecting"
        assert body["channels"]["telegram"]["reason"]
        assert any(e["channel"] == "telegram" and e["level"] == "WARNING" for e in body["warnings"])
        for shown in (out, raw):
            assert tg.token not in shown and tg.token.split(":")[1] not in shown and API_KEY not in shown
    finally:
        await tg.start()
    await status_until(telegram_daemon, "connected")


async def test_status_counts_a_held_turn_and_the_one_queued_behind_it(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    # Held for 15 s (under the model timeout of 20 s): long enough for a few `chital status` runs
    # on a loaded machine.
    model.add_rule(lambda t: "hold on" in t, Reply(text="held answer", first_byte_delay=15))
    first = tg.inject_message(OWNER, OWNER, "hold on please")
    await tg.wait_for(lambda: model.requests or None, timeout=15, what="the held turn reached the model")
    second = tg.inject_message(OWNER, OWNER, "and then this")
    out = await status_until(telegram_daemon, "queue: 1 pending, 1 running")
    assert "turns in flight: 1 running, 1 waiting" in out
    body = json.loads((await telegram_daemon.cli("status", "--json"))[1])
    assert body["queue"]["running"] == 1 and body["queue"]["pending"] == 1, body["queue"]
    assert body["queue"]["turns_running"] == 1 and body["queue"]["turns_waiting"] == 1
    await answered(tg, OWNER, first, "held answer", timeout=40)
    await answered(tg, OWNER, second, "echo: and then this")
    out = await status_until(telegram_daemon, "queue: 0 pending, 0 running")
    assert "turns in flight: 0 running, 0 waiting" in out


async def test_no_daemon_stale_socket_and_a_second_daemon(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    d = DaemonProcess(tmp_path, telegram_config(tmp_path, tg, model))
    d.write_config()
    sock = sock_of(d)
    code, out = await d.cli("status")
    assert code == 1 and f"chital: no daemon is running on {sock}" in out, out
    try:
        await d.start()
        assert (await d.cli("status"))[0] == 0
        # A second daemon on the same data directory is refused (it would answer everything twice).
        other = dict(d.config, http={"host": "127.0.0.1", "port": free_port()})
        second = DaemonProcess(tmp_path / "second", other)
        second.workdir.mkdir()
        second.write_config()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli.main", "run", "-c", str(second.config_path), cwd=str(REPO),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        err, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 1, err.decode()
        assert f"another chital daemon is running on {sock.parent}" in err.decode()
        assert (await d.cli("status"))[0] == 0, "the first daemon keeps its socket"

        d.kill9()
        await d.wait_exit()
        assert sock.exists(), "kill -9 leaves the socket file behind"
        code, out = await d.cli("status")
        assert code == 1 and f"no daemon is running on {sock}" in out, out
        await d.start()  # the stale socket is replaced
        await status_until(d, "telegram  connected")
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert await d.terminate() == 0
        assert not sock.exists(), "a clean stop removes the socket"
    finally:
        await d.close()


async def test_no_bubblewrap_is_said_loudly(
    tmp_path: Path, model: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without bubblewrap and with allow_unsandboxed the summary says NOT ISOLATING at WARNING, and
    `chital status` lists it among the recent warnings."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # shutil.which("bwrap") finds nothing in the daemon
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["agent"]["sandbox"]["allow_unsandboxed"] = True
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        text = await summary_of(d)
        assert (
            "WARNING gateway.daemon.summary:   sandbox   local WITHOUT bubblewrap: NOT ISOLATING" in text
        ), text
        assert "channels: none is on" in text
        out = await status_until(d, "NOT ISOLATING")
        assert "recent warnings" in out
    finally:
        await d.close()


def test_recent_errors_are_redacted_one_line_and_attributed() -> None:
    secret = "xoxb-1234567890-secret-value"
    errors = RecentErrors(RedactingFilter([secret]), ["telegram", "slack"], kept=3)
    logger = logging.getLogger("test.status.redaction")
    logger.propagate = False
    logger.addHandler(errors)
    logger.setLevel(logging.DEBUG)
    try:
        logger.info("not an error")
        logger.warning(
            "channel telegram: reconnecting (GET https://api.telegram.org/bot?token=abc123 failed)"
        )
        try:
            raise RuntimeError(f"refused with {secret}\nsecond line")
        except RuntimeError:
            logger.exception("slack: send failed with %s", secret)
        rec = logging.LogRecord("channels.slack.channel", logging.ERROR, __file__, 1, "x" * 500, None, None)
        errors.handle(rec)
    finally:
        logger.removeHandler(errors)
    entries = errors.entries()
    assert [e["channel"] for e in entries] == ["telegram", "slack", "slack"]
    assert (
        entries[0]["message"]
        == "channel telegram: reconnecting (GET https://api.telegram.org/bot?token=*** failed)"
    )
    assert secret not in json.dumps(entries)
    assert entries[1]["message"] == "slack: send failed with *** (RuntimeError: refused with ***)"
    assert "\n" not in entries[1]["message"]
    assert len(entries[2]["message"]) <= 240 and entries[2]["level"] == "ERROR"
    assert errors.entries(1) == entries[-1:]


def test_a_burst_of_warnings_never_pushes_an_error_out() -> None:
    """A reconnecting channel logs a warning per attempt: the one ERROR stays in `errors`."""
    errors = RecentErrors(RedactingFilter([]), ["telegram"], kept=5)
    logger = logging.getLogger("test.status.burst")
    logger.propagate = False
    logger.addHandler(errors)
    try:
        logger.error("sandbox provider local is not usable: sandbox uid 1000 cannot reach /root")
        for i in range(60):
            logger.warning("channel telegram: reconnecting (attempt %d)", i)
    finally:
        logger.removeHandler(errors)
    assert [e["message"] for e in errors.errors()] == [
        "sandbox provider local is not usable: sandbox uid 1000 cannot reach /root"
    ]
    assert [e["message"] for e in errors.warnings()][-1] == "channel telegram: reconnecting (attempt 59)"
    assert len(errors.warnings()) == 5


def test_summary_lines_hide_url_credentials_and_warn_only_on_trouble() -> None:
    assert endpoint("https://bob:s3cret@llm.example.com:8443/v1?api_key=sk-abc") == "llm.example.com:8443"
    assert endpoint("http://10.0.0.5/v1") == "10.0.0.5"
    assert endpoint(None) == "the provider's default endpoint"
    lines = dict(
        (text.split()[1], level)
        for level, text in channel_lines(
            {
                "telegram": {"state": "connected"},
                "slack": {"state": "reconnecting", "reason": "ConnectionError: refused"},
                "discord": {"state": "standby", "reason": "another daemon is the leader"},
                "lark": {"state": "disabled", "reason": "disabled in config"},
            }
        )
    )
    assert lines == {
        "telegram": logging.INFO,
        "slack": logging.WARNING,
        "discord": logging.INFO,
        "lark": logging.INFO,
    }
