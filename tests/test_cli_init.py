"""`chital init` as an operator meets it: answers piped or from flags, config.yaml and a 0600 .env
written, then `chital check`, `chital run` and a stranger's pairing code work from those files."""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import pytest
import yaml

from tests.daemon import REPO, DaemonProcess, clean_env, free_port, run_chital
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram_server import FakeTelegram

TG_TOKEN = "123456:init-test-token"


async def chital(
    *args: str, cwd: Path, stdin: str = "", env: dict[str, str] | None = None, umask: int = 0o022
) -> tuple[int, str]:
    """``chital ARGS`` in ``cwd`` (PYTHONPATH points at the checkout), stdin piped: no terminal."""
    environ = {**(env if env is not None else clean_env()), "PYTHONPATH": str(REPO)}
    done = await run_chital(*args, cwd=cwd, env=environ, stdin=stdin.encode(), umask=umask)
    return done.code, done.out


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def answers(
    base_url: str, *, channels: str = "telegram", key: str = "sk-init-key", token: str = TG_TOKEN
) -> str:
    """The questions' answers, one a line, in the order init asks them."""
    lines = [channels, base_url, "fake-model", key]
    if "telegram" in channels:
        lines.append(token)
    return "\n".join(lines) + "\n"


async def test_init_from_stdin_writes_config_and_private_env_then_checks(
    tmp_path: Path, model: FakeOpenAI
) -> None:
    # umask 0: a file created with the default mode would be world-readable; .env must not be.
    rc, out = await chital("init", cwd=tmp_path, stdin=answers(model.base_url), umask=0)
    assert rc == 0, out
    env_file, config = tmp_path / ".env", tmp_path / "config.yaml"
    assert mode(env_file) == 0o600
    assert "wrote config.yaml and .env" in out and "config: config.yaml is valid" in out
    assert "env: OPENAI_API_KEY, TELEGRAM_BOT_TOKEN from .env" in out
    assert "telegram  ready  credentials present" in out
    assert "slack     off    disabled in config" in out
    # Secrets are in .env only, never in config.yaml nor in what was printed.
    text = config.read_text()
    assert TG_TOKEN not in text and "sk-init-key" not in text and TG_TOKEN not in out
    assert "sk-init-key" not in out
    # The comment on access names a command that works from any directory (a bare `chital
    # pairing approve` finds no config outside this one and refuses).
    assert f"# `chital -c {config.resolve()} pairing approve CODE`" in text, text
    cfg = yaml.safe_load(text)
    assert cfg["models"][0] == {
        "name": "default",
        "use": "langchain_openai:ChatOpenAI",
        "model": "fake-model",
        "base_url": model.base_url,
        "api_key": "$OPENAI_API_KEY",
    }
    assert cfg["channels"]["telegram"] == {"enabled": True, "token": "$TELEGRAM_BOT_TOKEN"}
    assert cfg["access"]["pairing"] is True and cfg["access"]["allow_users"] == []
    assert f"TELEGRAM_BOT_TOKEN='{TG_TOKEN}'" in env_file.read_text()

    # A later `chital check`, from another directory, with nothing in the environment: passes on
    # the written files alone (the .env beside the config is read).
    rc, out = await chital("check", "-c", str(config), cwd=REPO)
    assert rc == 0, out
    assert "env: OPENAI_API_KEY, TELEGRAM_BOT_TOKEN from" in out and "api_key=set" in out
    assert "telegram  ready  credentials present" in out


async def test_init_yes_takes_flags_and_environment(tmp_path: Path, model: FakeOpenAI) -> None:
    env = clean_env() | {"OPENAI_API_KEY": "sk-from-env"}
    rc, out = await chital(
        "init", "--yes", "--channel", "none", "--model", "fake-model", "--base-url", model.base_url,
        "--online", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert rc == 0, out
    assert "Channels" not in out  # nothing asked
    assert "model default    OK GET /models: 1 model(s); 'fake-model' listed" in out
    assert "no chat channel is ready" in out
    # No bot to write to: the next step is the terminal chat, not a pairing code.
    assert "next: `chital chat` talks to the agent" in out and "pairing code" not in out, out
    assert mode(tmp_path / ".env") == 0o600
    assert (tmp_path / ".env").read_text().count("OPENAI_API_KEY='sk-from-env'") == 1

    # --yes with a channel whose token is not in the environment: refused, nothing written.
    other = tmp_path / "other"
    rc, out = await chital(
        "init", "-y", "--channel", "discord", "-c", str(other / "c.yaml"), cwd=tmp_path, env=env
    )
    assert rc == 2, out
    assert "chital: init: DISCORD_BOT_TOKEN is needed for discord" in out and "nothing was written" in out
    assert not other.exists()


async def test_init_refuses_to_overwrite_without_force(tmp_path: Path, model: FakeOpenAI) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("# mine\n")
    rc, out = await chital("init", cwd=tmp_path, stdin=answers(model.base_url))
    assert rc == 1, out
    assert "config.yaml exists already; --force replaces" in out
    assert config.read_text() == "# mine\n" and not (tmp_path / ".env").exists()

    # An old .env others could read is replaced by a private one.
    (tmp_path / ".env").write_text("OLD=1\n")
    (tmp_path / ".env").chmod(0o644)
    rc, out = await chital("init", "--force", cwd=tmp_path, stdin=answers(model.base_url), umask=0)
    assert rc == 0, out
    assert mode(tmp_path / ".env") == 0o600 and "OLD" not in (tmp_path / ".env").read_text()
    assert "fake-model" in config.read_text()
    assert not [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".config") or p.name.startswith(".env.")
    ]


async def test_init_refuses_bad_answers_and_never_echoes_them(tmp_path: Path, model: FakeOpenAI) -> None:
    # Slack's two tokens swapped: caught before anything is written.
    stdin = "slack\n" + model.base_url + "\nfake-model\nsk-k\nxapp-1-swapped\nxoxb-swapped\n"
    rc, out = await chital("init", cwd=tmp_path, stdin=stdin)
    assert rc == 2, out
    assert "SLACK_BOT_TOKEN: that is not a Slack bot token: it starts with xoxb-" in out
    assert "xapp-1-swapped" not in out and not (tmp_path / ".env").exists()

    rc, out = await chital("init", cwd=tmp_path, stdin="telegram, irc\n")  # matrix is a channel now
    assert rc == 2 and "unknown channel 'irc': choose from telegram, slack, discord, lark" in out

    # A value that would break the .env's quoting.
    rc, out = await chital("init", cwd=tmp_path, stdin=answers(model.base_url, key="sk-a b'c"))
    assert rc == 2 and "OPENAI_API_KEY: it has a space, quote" in out and "b'c" not in out

    rc, out = await chital("init", cwd=tmp_path, stdin="telegram\n")  # stdin ends early
    assert rc == 2 and "stdin ended; nothing was written" in out
    assert not (tmp_path / "config.yaml").exists()


async def test_the_daemon_runs_on_what_init_wrote(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`chital run` takes the token and the key from .env (the environment has neither), and the
    channel init turned on keeps deny-by-default: a stranger gets a pairing code."""
    for name in ("TELEGRAM_BOT_TOKEN", "OPENAI_API_KEY", "CHITAL_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    rc, out = await chital("init", cwd=tmp_path, stdin=answers(model.base_url, token=tg.token))
    assert rc == 0, out
    cfg = yaml.safe_load((tmp_path / "config.yaml").read_text())
    # Only what the test needs: the fake Telegram's address, a free port.
    cfg["channels"]["telegram"] |= {
        "base_url": tg.base_url,
        "base_file_url": tg.base_file_url,
        "poll_timeout": 1,
    }
    cfg["http"] = {"port": free_port()}
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        await d.wait_channel_state("telegram", "connected")
        stranger = 4242
        tg.inject_message(stranger, stranger, "hello, who are you?")
        text = await tg.wait_for(
            lambda: next((m.text for m in tg.bot_messages(stranger) if "pairing code" in m.text), None),
            what="pairing code",
        )
        assert not any("who are you" in last_user_text(r) for r in model.requests)
        code = re.search(r"pairing code is ([A-Z0-9]{8})", text).group(1)  # type: ignore[union-attr]
        rc, out = await d.cli("pairing", "approve", code)
        assert rc == 0 and f"approved telegram:{stranger}" in out, out
        tg.inject_message(stranger, stranger, "now?")
        await tg.wait_for(lambda: "echo: now?" in tg.bot_texts(stranger), what="the agent's answer")
        assert await d.terminate() == 0
    finally:
        await d.close()


def test_env_file_does_not_override_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.cli.common import load_env_file

    monkeypatch.setenv("CHITAL_T_SET", "from-env")
    monkeypatch.delenv("CHITAL_T_NEW", raising=False)
    env = tmp_path / ".env"
    env.write_text("CHITAL_T_SET=from-file\nexport CHITAL_T_NEW='quoted value'\n# comment\n")
    env.chmod(0o600)
    try:
        assert load_env_file(env) == ["CHITAL_T_NEW"]
        assert os.environ["CHITAL_T_SET"] == "from-env" and os.environ["CHITAL_T_NEW"] == "quoted value"
    finally:
        os.environ.pop("CHITAL_T_NEW", None)
    assert load_env_file(tmp_path / "missing") == []


def test_at_a_terminal_secrets_are_not_echoed(tmp_path: Path, model: FakeOpenAI) -> None:
    """A real pseudo-terminal: what is typed for the channel list shows, the key and the token do not."""
    import pty
    import select
    import subprocess
    import time

    master, slave = pty.openpty()
    env = clean_env() | {"PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "init", "--base-url", model.base_url, "--model", "fake-model"],
        stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=env, start_new_session=True,
    )  # fmt: skip
    os.close(slave)
    seen = b""

    def until(text: bytes, timeout: float = 30) -> None:
        nonlocal seen
        end = time.monotonic() + timeout
        while text not in seen:
            ready, _, _ = select.select([master], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {text!r} in {seen.decode(errors='replace')!r}")
            try:
                seen += os.read(master, 4096)
            except OSError:  # the child closed the terminal
                raise AssertionError(f"no {text!r} in {seen.decode(errors='replace')!r}") from None

    try:
        until(b"Channels")
        os.write(master, b"telegram\n")
        until(b"API key")
        os.write(master, b"sk-typed-secret\n")
        until(b"Telegram bot token")
        os.write(master, TG_TOKEN.encode() + b"\n")
        until(b"online now?")
        os.write(master, b"n\n")
        until(b"next:")
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        os.close(master)
    assert b"telegram\r\n" in seen  # typed answers are echoed by the terminal...
    assert b"sk-typed-secret" not in seen and TG_TOKEN.encode() not in seen  # ...secrets are not
    assert "OPENAI_API_KEY='sk-typed-secret'" in (tmp_path / ".env").read_text()
