"""The command line as a user meets it: check, run without tokens, chat in the terminal, bad config."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import yaml

from tests.daemon import REPO, DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI


def clean_env() -> dict[str, str]:
    drop = ("TELEGRAM_BOT_TOKEN", "SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "DISCORD_BOT_TOKEN", "LARK_APP_ID",
            "LARK_APP_SECRET", "OPENAI_API_KEY", "CHITAL_CONFIG")
    return {k: v for k, v in os.environ.items() if k not in drop and "proxy" not in k.lower()}


async def run_cli(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None,
                  cwd: Path = REPO) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args, cwd=str(cwd), env=env or clean_env(),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(stdin), 60)
    return int(proc.returncode or 0), out.decode()


async def test_check_reports_channels_off_and_why() -> None:
    rc, out = await run_cli("check", "-c", str(REPO / "config.yaml"))
    assert rc == 0, out
    assert "telegram  off" in out and "TELEGRAM_BOT_TOKEN" in out
    assert "slack     off" in out and "SLACK_APP_TOKEN" in out
    assert "`chital chat`" in out


async def test_check_names_the_broken_field(tmp_path: Path) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("channels:\n  telegram:\n    enabled: maybe\n  slak: {}\n")
    rc, out = await run_cli("check", "-c", str(bad))
    assert rc == 2
    assert "channels.telegram.enabled" in out and "channels.slak" in out


async def test_run_without_tokens_starts_and_says_why(tmp_path: Path, model: FakeOpenAI) -> None:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"] = {"telegram": {"enabled": True}, "slack": {"enabled": False}}
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        status, body = await d.get("/readyz")
        assert status == 200
        assert body["channels"]["telegram"]["state"] == "disabled"
        assert "TELEGRAM_BOT_TOKEN" in body["channels"]["telegram"]["reason"]
        assert "disabled in config" in body["channels"]["slack"]["reason"]
        assert "no chat channel is on" in d.logs()
        assert await d.terminate() == 0
    finally:
        await d.close()


async def test_chat_talks_to_the_agent(tmp_path: Path, model: FakeOpenAI) -> None:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rc, out = await run_cli("chat", "-c", str(path), stdin=b"hello there\n/new\nsecond\n/quit\n")
    assert rc == 0, out
    assert "echo: hello there" in out and "echo: second" in out and "fresh conversation" in out


async def test_chat_without_model_key_says_so(tmp_path: Path) -> None:
    cfg = {"storage": {"path": str(tmp_path / "data")}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rc, out = await run_cli("chat", "-c", str(path), stdin=b"hello\n")
    assert rc == 0, out
    assert "The model is not configured" in out
    assert "api_key" in out.lower() or "OPENAI_API_KEY" in out
