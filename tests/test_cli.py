"""The command line as a user meets it: check, run without tokens, chat in the terminal, bad config."""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path

import pytest
import yaml

from tests.daemon import REPO, DaemonProcess, base_config, clean_env, free_port, run_chital
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram


async def run_cli(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None, cwd: Path = REPO
) -> tuple[int, str]:
    done = await run_chital(*args, stdin=stdin, env=env or clean_env(), cwd=cwd)
    return done.code, done.out


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
        for _ in range(100):  # the start-up summary says it once the channels were tried
            if "channels: none is on" in d.logs():
                break
            await asyncio.sleep(0.1)
        assert "channels: none is on (only `chital chat` talks to the agent)" in d.logs()
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
    cfg["channels"]["telegram"] = tg.channel_settings()
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
        good["channels"] |= {fake.platform: fake.channel_settings() for fake in (slack, discord, lark)}
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


# -- no config file: the built-in defaults, said plainly ------------------------------------------
def env_without_config(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A shell outside the repository: no config file in reach, the checkout on PYTHONPATH."""
    return clean_env() | {"PYTHONPATH": str(REPO), "CHITAL_DATA": str(tmp_path / "data")} | extra


async def test_no_config_file_turns_on_channels_whose_tokens_are_set(root: Path) -> None:
    # In /tmp (conftest's `root`): check runs a command in the sandbox, whose uid cannot pass
    # through pytest's 0700 tmp dirs when the tests run as root.
    tmp_path = root
    env = env_without_config(
        tmp_path, TELEGRAM_BOT_TOKEN="123:abc", SLACK_BOT_TOKEN="xoxb-1", OPENAI_API_KEY="sk-1"
    )
    rc, out = await run_cli("check", cwd=tmp_path, env=env)
    assert rc == 0, out
    notice = [line for line in out.splitlines() if line.startswith("chital: no config file found")]
    assert len(notice) == 1, out
    assert "(here: telegram)" in notice[0] and str(tmp_path / "data") in notice[0]
    assert "config: no file; the built-in defaults are valid" in out
    assert "telegram  ready  credentials present" in out
    # Half a Slack set-up says which variable is missing instead of staying silently off.
    assert "slack     off    missing app_token (set SLACK_APP_TOKEN)" in out
    assert "discord   off    missing token (set DISCORD_BOT_TOKEN)" in out
    assert "123:abc" not in out

    # The .env of the directory counts too (the environment wins over it).
    (tmp_path / ".env").write_text("DISCORD_BOT_TOKEN=from-dotenv\nTELEGRAM_BOT_TOKEN=\n")
    (tmp_path / ".env").chmod(0o600)
    rc, out = await run_cli("check", cwd=tmp_path, env=env)
    assert rc == 0, out
    assert "discord   ready  credentials present" in out and "telegram  ready" in out
    assert "env: DISCORD_BOT_TOKEN from .env" in out and "(here: telegram, discord)" in out
    (tmp_path / ".env").chmod(0o644)
    rc, out = await run_cli("check", cwd=tmp_path, env=env)
    assert "chital: warning: .env holds secrets but other users may read it (chmod 600 .env)" in out


async def test_run_without_config_file_says_what_it_uses(tmp_path: Path) -> None:
    # The data directory is a file, so start-up stops at its first step: what `run` says before
    # that is what an operator reads, and nothing binds a port or dials Telegram.
    (tmp_path / "data").write_text("")
    rc, out = await run_cli(
        "run", cwd=tmp_path, env=env_without_config(tmp_path, TELEGRAM_BOT_TOKEN="123:abc")
    )
    assert rc == 1, out
    assert "chital: no config file found" in out and "(here: telegram)" in out
    # Which channels are on and why others are off comes once, in the start-up summary of a daemon
    # that started; a start that failed at once says why it failed, nothing else.
    assert "missing bot_token" not in out
    assert out.rstrip().endswith("is a file, not a directory (set storage.path)")


async def test_builtin_defaults_keep_strangers_out(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A channel turned on by its token alone is deny-by-default: a stranger gets a pairing code,
    the model never sees the message. The model comes from the environment as well."""
    from gateway.config.schema import load_config
    from gateway.daemon.app import Daemon

    for name, value in {
        "TELEGRAM_BOT_TOKEN": tg.token,
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": model.base_url,
        "CHITAL_MODEL": "fake-model",
        "CHITAL_DATA": str(tmp_path / "data"),
    }.items():
        monkeypatch.setenv(name, value)
    cfg = load_config(None)
    assert cfg.model_spec().kwargs() == {
        "model": "fake-model",
        "base_url": model.base_url,
        "api_key": "sk-test",
    }
    telegram = cfg.channels.telegram
    assert telegram.enabled and telegram.plain("token") == tg.token
    # Only where the fake Telegram is, and no HTTP port: everything else is the built-in defaults.
    telegram.base_url, telegram.base_file_url, telegram.poll_timeout = tg.base_url, tg.base_file_url, 1
    cfg.http.enabled = False
    daemon = Daemon(cfg)
    await daemon.start()
    try:
        stranger = 5151
        tg.inject_message(stranger, stranger, "let me in, secret plan")
        await tg.wait_for(
            lambda: any("pairing code" in m.text for m in tg.bot_messages(stranger)),
            timeout=15,
            what="pairing",
        )
        assert not any("secret plan" in str(r) for r in model.requests)
    finally:
        await daemon.stop()


# -- the command line itself -----------------------------------------------------------------------
def commands() -> list[list[str]]:
    """Every command and subcommand, from the parser itself (a new one is covered as it is added)."""
    from gateway.cli.main import build_parser

    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._get_subactions()}
                for name, child in action.choices.items():
                    assert helps.get(name), f"`chital {' '.join([*path, name])}` has no one-line help"
                    found.append([*path, name])
                    walk(child, [*path, name])

    walk(build_parser(), [])
    return found


async def test_every_command_has_its_own_help() -> None:
    rc, top = await run_cli("--help")
    assert rc == 0 and top.startswith("usage: chital [-h] [-c PATH] [--version] COMMAND ...")
    listed = commands()
    assert ["pairing", "approve"] in listed and ["init"] in listed
    for path in listed:
        if len(path) == 1:  # one line each in `chital --help`
            assert re.search(rf"^  {path[0]} +\S", top, re.M), top
        rc, out = await run_cli(*path, "--help")
        assert rc == 0, out
        assert out.startswith(f"usage: chital {' '.join(path)} "), out
        description = out.split("\n\n")[1]
        assert description[:1].isupper() and description.rstrip().endswith("."), out
        assert "config_top" not in out and "{" not in out.splitlines()[0], out
    rc, out = await run_cli("pairing", "approve", "--help")
    assert "CODE" in out.splitlines()[0] and "the pairing code the user was given" in out


async def test_usage_errors_are_one_line() -> None:
    rc, out = await run_cli("pairing", "approve")
    assert rc == 2
    assert out == (
        "chital: pairing approve: the following arguments are required: CODE"
        " (see `chital pairing approve --help`)\n"
    )
    rc, out = await run_cli("frobnicate")
    assert rc == 2 and out.startswith("chital: argument COMMAND: invalid choice: 'frobnicate'")
    assert len(out.splitlines()) == 1
    rc, out = await run_cli()
    assert rc == 2 and "commands:" in out and "pairing" in out
    rc, out = await run_cli("check", "--bogus")
    assert rc == 2 and "unrecognized arguments: --bogus" in out and len(out.splitlines()) == 1
