"""The command line as a user meets it: check, run without tokens, chat in the terminal, bad config."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import yaml

from tests.daemon import REPO, DaemonProcess, base_config, free_port
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram


def clean_env() -> dict[str, str]:
    drop = (
        "TELEGRAM_BOT_TOKEN",
        "SLACK_BOT_TOKEN",
        "SLACK_APP_TOKEN",
        "DISCORD_BOT_TOKEN",
        "LARK_APP_ID",
        "LARK_APP_SECRET",
        "OPENAI_API_KEY",
        "CHITAL_CONFIG",
    )
    return {k: v for k, v in os.environ.items() if k not in drop and "proxy" not in k.lower()}


async def run_cli(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None, cwd: Path = REPO
) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        *args,
        cwd=str(cwd),
        env=env or clean_env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(stdin), 60)
    return int(proc.returncode or 0), out.decode()


async def test_check_reports_channels_off_and_why() -> None:
    rc, out = await run_cli("check", "-c", str(REPO / "config.yaml"))
    assert "telegram  off" in out and "TELEGRAM_BOT_TOKEN" in out
    assert "slack     off" in out and "SLACK_APP_TOKEN" in out
    assert "`chital chat`" in out
    # Channels without tokens are simply off; a model without its key would fail every message.
    assert rc == 1, out
    assert "FAILED models[0].api_key: missing (set OPENAI_API_KEY" in out


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


# -- chital check: the model and, online, every credential ----------------------------------------
def write_config(tmp_path: Path, cfg: dict[str, object]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


async def test_check_fails_for_a_model_class_that_cannot_be_imported(tmp_path: Path) -> None:
    cfg = base_config(tmp_path / "data", "http://127.0.0.1:9/v1", free_port())
    cfg["models"][0]["use"] = "no_such_package_here:ChatNothing"
    rc, out = await run_cli("check", "-c", write_config(tmp_path, cfg))
    assert rc == 1, out
    assert "FAILED models[0].use: cannot import 'no_such_package_here'" in out
    assert "check failed: 1 problem" in out


async def test_check_fails_for_a_model_that_cannot_be_built(tmp_path: Path) -> None:
    cfg = base_config(tmp_path / "data", "http://127.0.0.1:9/v1", free_port())
    cfg["models"][0]["temperature"] = "very hot"
    cfg["models"].append({"name": "other", "use": "langchain_openai:NoSuchChat", "api_key": "sk-x"})
    rc, out = await run_cli("check", "-c", write_config(tmp_path, cfg))
    assert rc == 1, out
    assert "FAILED models[0]: cannot build langchain_openai:ChatOpenAI" in out
    assert "FAILED models[1].use: 'langchain_openai' has no 'NoSuchChat'" in out
    assert "very hot" not in out and "sk-test-key-never-logged" not in out


async def test_check_passes_for_a_good_model(tmp_path: Path) -> None:
    cfg = base_config(tmp_path / "data", "http://127.0.0.1:9/v1", free_port())
    rc, out = await run_cli("check", "-c", write_config(tmp_path, cfg))
    assert rc == 0, out
    assert "FAILED" not in out and "api_key=set" in out


async def test_check_online_telegram_and_model(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> None:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"]["telegram"] = {"enabled": True, "token": tg.token, "base_url": tg.base_url}
    path = write_config(tmp_path, cfg)
    rc, out = await run_cli("check", "--online", "-c", path)
    assert rc == 0, out
    assert probe_line(out, "telegram").startswith("OK getMe: @chital_bot")
    assert probe_line(out, "model default") == "OK GET /models: 1 model(s); 'fake-model' listed"

    # The token is refused; the model server answers neither /models nor completions.
    tg.revoke_token()
    cfg["models"][0]["base_url"] = model.base_url + "/wrong"
    rc, out = await run_cli("check", "--online", "-c", write_config(tmp_path, cfg))
    assert rc == 1, out
    assert probe_line(out, "telegram") == "FAILED: getMe: 401 Unauthorized"
    assert probe_line(out, "model default").startswith("FAILED: POST /chat/completions: HTTP 404")
    assert tg.token not in out and "sk-test-key-never-logged" not in out


async def test_check_online_model_unreachable(tmp_path: Path) -> None:
    cfg = base_config(tmp_path / "data", f"http://127.0.0.1:{free_port()}/v1", free_port())
    rc, out = await run_cli("check", "--online", "-c", write_config(tmp_path, cfg))
    assert rc == 1, out
    line = probe_line(out, "model default")
    assert line.startswith("FAILED: cannot connect to 127.0.0.1:") and line.endswith("(connection refused)")


async def test_check_online_slack_discord_lark(tmp_path: Path, model: FakeOpenAI) -> None:
    slack, discord, lark = FakeSlack(), FakeDiscord(), FakeLark()
    await slack.start()
    await discord.start()
    lark.start()
    try:
        good = base_config(tmp_path / "data", model.base_url, free_port())
        good["channels"] = {
            "telegram": {"enabled": False},
            "slack": {
                "enabled": True,
                "bot_token": slack.bot_token,
                "app_token": slack.app_token,
                "api_base_url": slack.api_base_url,
            },
            "discord": {"enabled": True, "token": discord.token, "api_base_url": discord.api_base_url},
            "lark": {
                "enabled": True,
                "app_id": lark.app_id,
                "app_secret": lark.app_secret,
                "domain": lark.base_url,
            },
        }
        rc, out = await run_cli("check", "--online", "-c", write_config(tmp_path, good))
        assert rc == 0, out
        assert probe_line(out, "slack") == (
            "OK auth.test: team Fake Team, bot chital; apps.connections.open: Socket Mode allowed"
        )
        assert probe_line(out, "discord").startswith("OK GET /users/@me: chital")
        assert probe_line(out, "lark") == "OK tenant_access_token: granted"

        bad = yaml.safe_load(yaml.safe_dump(good))
        bad["channels"]["slack"]["bot_token"] = "xoxb-revoked-token-123"
        bad["channels"]["discord"]["token"] = "revoked-discord-token"
        bad["channels"]["lark"]["app_secret"] = "wrong-lark-secret"
        rc, out = await run_cli("check", "--online", "-c", write_config(tmp_path, bad))
        assert rc == 1, out
        assert probe_line(out, "slack") == "FAILED: auth.test: invalid_auth"
        assert probe_line(out, "discord") == "FAILED: GET /users/@me: HTTP 401: Unauthorized"
        assert probe_line(out, "lark") == "FAILED: tenant_access_token: code 10014 app secret invalid"
        for secret in ("xoxb-revoked-token-123", "revoked-discord-token", "wrong-lark-secret"):
            assert secret not in out
        assert "check failed: 3 problem(s)" in out
    finally:
        lark.stop()
        await discord.stop()
        await slack.stop()


def probe_line(out: str, name: str) -> str:
    """What ``check --online`` says about ``name``: ``OK ...`` or ``FAILED: ...``."""
    for line in out.splitlines():
        if line.startswith(f"  {name:<16} "):
            return line[len(f"  {name:<16} ") :]
    raise AssertionError(f"no line for {name!r} in:\n{out}")
