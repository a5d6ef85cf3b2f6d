"""The operator's first hour (issue 20): every status tells the truth, every default works.

Each test drives the real ``chital`` command (a subprocess, as the operator types it) in temp
directories and asserts what the operator reads: stdout/stderr, exit codes, file modes, the
status socket's and ``/readyz``'s documents, and what the bot tells a stranger.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.daemon import MODEL_SETTINGS, REPO, DaemonProcess, base_config, env_without, free_port, run_chital
from tests.fakes.gateway_rig import skip_on_postgres
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="the sandbox drops to uid 1000 only when run as root")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def env(**extra: str) -> dict[str, str]:
    return env_without(*MODEL_SETTINGS, **{"PYTHONPATH": str(REPO), **extra})


async def chital(
    *args: str, cwd: Path, environ: dict[str, str] | None = None, stdin: bytes = b""
) -> tuple[int, str, str]:
    """``chital ARGS`` from ``cwd``: (exit code, stdout, stderr)."""
    done = await run_chital(*args, cwd=cwd, env=environ or env(), stdin=stdin, timeout=120, stderr_apart=True)
    return done.code, done.out, done.err


def write(path: Path, cfg: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


@pytest.fixture
def reachable(root: Path) -> Path:
    """A directory the sandbox uid can pass through (conftest's ``root``; pytest's tmp dirs are
    0700 and, as root, sandboxed commands run as uid 1000)."""
    return root


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- 1. the sandbox: a real command, and its state everywhere ----------------------------------------
@needs_root
@needs_bwrap
async def test_check_fails_when_the_sandbox_uid_cannot_reach_the_data(
    tmp_path: Path, model: FakeOpenAI
) -> None:
    """The README's layout as root: the data under a 0700 directory. `check` runs a command in the
    sandbox, says it failed and why, exits 1, and leaves no data directory behind."""
    home = tmp_path / "root-home"  # like /root: 0700, owned by root
    home.mkdir(mode=0o700)
    cfg = base_config(home / "chital" / "data", model.base_url, free_port())
    del cfg["agent"]["sandbox"]  # the default root: data/sandboxes
    path = write(home / "chital" / "config.yaml", cfg)
    rc, out, err = await chital("check", "-c", str(path), cwd=tmp_path)
    assert rc == 1, out + err
    line = next(ln for ln in out.splitlines() if ln.startswith("sandbox:"))
    assert line.startswith("sandbox: FAILED") and "sandbox uid 1000 cannot reach" in line, out
    assert str(home) in line
    assert "fix: set agent.sandbox.root" in out
    assert "check failed: 1 problem" in err
    assert not (home / "chital" / "data").exists(), "check must leave the disk as it found it"


@needs_bwrap
async def test_check_fails_when_bubblewrap_cannot_create_namespaces(
    tmp_path: Path, reachable: Path, model: FakeOpenAI
) -> None:
    """A container without the unconfined options: bwrap is there but cannot create namespaces.
    Stood in for by a `bwrap` first on PATH that fails as the real one does there."""
    bindir = reachable / "bin"
    bindir.mkdir()
    fake = bindir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    cfg = base_config(reachable / "data", model.base_url, free_port())
    cfg["agent"]["sandbox"]["root"] = str(reachable / "sbx")
    path = write(tmp_path / "config.yaml", cfg)
    rc, out, err = await chital(
        "check", "-c", str(path), cwd=tmp_path, environ=env(PATH=f"{bindir}:{os.environ['PATH']}")
    )
    assert rc == 1, out + err
    assert "sandbox: FAILED local: a test command failed" in out
    assert "bwrap: No permissions to create new namespace" in out, out
    assert "cannot create namespaces" in out  # the fix names the cause

    # The real bubblewrap on the same config: the check passes and says a command ran isolated.
    rc, out, err = await chital("check", "-c", str(path), cwd=tmp_path)
    assert rc == 0, out + err
    assert "a test command ran isolated" in out


@needs_root
@needs_bwrap
async def test_init_as_root_chooses_a_sandbox_root_that_works(tmp_path: Path) -> None:
    """`chital init -c ~/chital/config.yaml` as root, with a 0700 home: init puts the sandboxes
    where the sandbox uid can reach them, and its check runs a command there."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    config = home / "chital" / "config.yaml"
    rc, out, err = await chital(
        "init", "-y", "-c", str(config), cwd=tmp_path, environ=env(OPENAI_API_KEY="sk-test-init-key")
    )
    written = yaml.safe_load(config.read_text())
    root = Path(written["agent"]["sandbox"]["root"])
    try:
        assert not root.is_relative_to(home), root
        assert "sandbox: local, bubblewrap" in out and "a test command ran isolated" in out, out + err
        assert rc == 0, out + err
    finally:
        if root.is_relative_to("/var/lib/chital") and not any(root.iterdir() if root.exists() else ()):
            shutil.rmtree(root, ignore_errors=True)


async def _status_json(d: DaemonProcess) -> dict[str, Any]:
    code, raw = await d.cli("status", "--json")
    assert code == 0, raw
    body: dict[str, Any] = json.loads(raw)
    return body


@needs_root
@needs_bwrap
async def test_a_broken_sandbox_shows_in_status_readyz_and_chat(tmp_path: Path, model: FakeOpenAI) -> None:
    """The daemon's own start-up probe fails (root unreachable by the sandbox uid): `chital
    status`, its JSON, `/readyz` and `chital chat`'s banner and /status all say so, and the
    ERROR stays in the recent errors however many warnings follow."""
    home = tmp_path / "private"
    home.mkdir(mode=0o700)
    cfg = base_config(home / "data", model.base_url, free_port())
    cfg["agent"]["sandbox"]["root"] = str(home / "sandboxes")
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        _, ready = await d.get("/readyz")
        assert ready["sandbox"]["state"] == "failed", ready
        assert "cannot reach" in ready["sandbox"]["detail"]
        body = await _status_json(d)
        assert body["sandbox"]["state"] == "failed"
        assert any("sandbox" in e["message"] and e["level"] == "ERROR" for e in body["errors"]), body
        assert all(e["level"] in ("ERROR", "CRITICAL") for e in body["errors"])
        code, out = await d.cli("status")
        assert code == 0
        assert "sandbox: FAILED, local: sandbox uid 1000 cannot reach" in out, out
        errors = out[out.index("recent errors") : out.index("recent warnings")]
        assert "sandbox provider local is not usable" in errors, out
    finally:
        await d.close()
    rc, out, err = await chital("chat", "-c", str(d.config_path), cwd=tmp_path, stdin=b"/status\n/quit\n")
    assert rc == 0, out + err
    banner = next(ln for ln in out.splitlines() if ln.strip().startswith("sandbox:"))
    assert "⚠ FAILED" in banner and "cannot reach" in banner, out
    assert "Sandbox: FAILED" in out.split("/help lists")[1], out


@needs_bwrap
async def test_a_working_sandbox_is_reported_as_probed(tmp_path: Path, model: FakeOpenAI) -> None:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        _, ready = await d.get("/readyz")
        assert ready["sandbox"]["state"] == "ready", ready
        _, out = await d.cli("status")
        assert "sandbox: ready, local, bubblewrap" in out, out
    finally:
        await d.close()


# -- 3. read-only commands never make a database -----------------------------------------------------
async def test_pairing_list_without_a_config_fails_and_creates_nothing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args in (("pairing", "list"), ("status",), ("pairing", "approve", "ABCD1234")):
        rc, out, err = await chital(*args, cwd=elsewhere)
        assert rc == 2, (args, out, err)
        assert "no config file found" in err and "-c" in err, err
        assert "pending: none" not in out
    assert list(elsewhere.iterdir()) == [], "a read-only command created files"


@skip_on_postgres("a SQLite file is what a never-run daemon lacks; PostgreSQL's tables live in the server")
async def test_pairing_list_on_a_daemon_that_never_ran_says_so(tmp_path: Path) -> None:
    cfg = base_config(tmp_path / "data", "http://127.0.0.1:9/v1", free_port())
    path = write(tmp_path / "conf" / "config.yaml", cfg)
    rc, out, err = await chital("pairing", "list", "-c", str(path), cwd=tmp_path)
    assert rc == 1, out + err
    assert f"no database at {tmp_path / 'data' / 'gateway.sqlite'}" in err
    assert "pending: none" not in out
    assert not (tmp_path / "data").exists(), "neither a data directory nor a reserve file"


async def test_the_bots_pairing_message_names_the_config(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The stranger's code and the admin's announcement come with a command that works from any
    directory: `chital -c /abs/config.yaml pairing approve CODE`."""
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"]["telegram"] = tg.channel_settings()
    cfg["access"] = {"admins": ["1001"], "pairing": True}
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        tg.inject_command(1001, 1001, "start", "", chat_type="private", at=None)  # the admin's chat
        await asyncio.sleep(0)
        tg.inject_message(6666, 6666, "hello?")
        expected = f"chital -c {d.config_path.resolve()} pairing approve "

        def told(chat: int) -> str | None:
            return next((m.text for m in tg.bot_messages(chat) if expected in m.text), None)

        stranger = await tg.wait_for(lambda: told(6666), timeout=20, what="pairing code")
        code = stranger.split(expected)[1].split()[0]
        admin = await tg.wait_for(lambda: told(1001), timeout=20, what="announcement")
        assert f"{expected}{code}" in admin
        # ... and the command as given works, from another directory.
        rc, out, err = await chital(*expected.split()[1:], code, cwd=tmp_path / "data")
        assert rc == 0 and "approved telegram:6666" in out, out + err
        # The chat's /status says what the start-up probe found, without host paths.
        tg.inject_command(6666, 6666, "status", "", chat_type="private", at=None)
        status = await tg.wait_for(
            lambda: next((m.text for m in tg.bot_messages(6666) if "Sandbox:" in m.text), None),
            timeout=20,
            what="/status",
        )
        state = "ready (commands run isolated)" if shutil.which("bwrap") else "NOT WORKING"
        assert f"Sandbox: {state}" in status, status
        assert str(tmp_path) not in status
    finally:
        await d.close()


# -- 4. model settings are checked against the class -------------------------------------------------
@pytest.mark.parametrize(("typo", "meant"), [("modle", "model"), ("base_ulr", "base_url")])
async def test_check_names_a_misspelt_model_setting(
    tmp_path: Path, reachable: Path, typo: str, meant: str
) -> None:
    cfg = base_config(reachable / "data", "http://127.0.0.1:9/v1", free_port())
    spec = cfg["models"][0]
    spec[typo] = spec.pop(meant)
    path = write(tmp_path / "config.yaml", cfg)
    rc, out, err = await chital("check", "-c", str(path), cwd=tmp_path)
    assert rc == 1, out + err
    assert (
        f"FAILED models[0].{typo}: not a setting of langchain_openai:ChatOpenAI; did you mean '{meant}'?"
        in out
    ), out
    assert "sk-test-key-never-logged" not in out + err


async def test_run_refuses_a_misspelt_model_setting(tmp_path: Path, model: FakeOpenAI) -> None:
    """`run` treats it as the invalid configuration it is (exit 2, the field and the fix), as it
    does a misspelt key anywhere else, instead of starting an agent whose every answer fails."""
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["models"][0]["modle"] = cfg["models"][0].pop("model")
    path = write(tmp_path / "config.yaml", cfg)
    rc, out, err = await chital("run", "-c", str(path), cwd=tmp_path)
    assert rc == 2, out + err
    assert "invalid configuration" in err
    assert "models[0].modle: not a setting of langchain_openai:ChatOpenAI; did you mean 'model'?" in err
    assert not (tmp_path / "data").exists()


async def test_a_keyless_local_server_needs_only_its_url(
    tmp_path: Path, reachable: Path, model: FakeOpenAI
) -> None:
    """OPENAI_BASE_URL alone (no key anywhere), as for llama.cpp or Ollama: check passes and the
    agent answers, with no config file at all."""
    environ = env(
        OPENAI_BASE_URL=model.base_url, CHITAL_MODEL="fake-model", CHITAL_DATA=str(reachable / "data")
    )
    rc, out, err = await chital("check", cwd=tmp_path, environ=environ)
    assert "api_key=none needed" in out, out + err
    assert "FAILED models" not in out, out
    rc, out, err = await chital("chat", cwd=tmp_path, environ=environ, stdin=b"hello keyless\n/quit\n")
    assert rc == 0, out + err
    assert "echo: hello keyless" in out, out + err


# -- 5. the shipped skills wherever the config lives -------------------------------------------------
async def test_check_lists_the_shipped_skills_for_a_config_anywhere(tmp_path: Path, reachable: Path) -> None:
    cfg = base_config(reachable / "data", "http://127.0.0.1:9/v1", free_port())
    path = write(tmp_path / "somewhere" / "config.yaml", cfg)
    rc, out, err = await chital("check", "-c", str(path), cwd=tmp_path)
    shipped = sorted(p.name for p in (REPO / "skills" / "public").iterdir() if (p / "SKILL.md").is_file())
    assert f"skills: {len(shipped)} offered: {', '.join(shipped)}" in out, out
    assert "WARNING skills" not in out
    assert rc == 0, out + err


async def test_a_configured_skills_folder_that_is_missing_is_a_warning(
    tmp_path: Path, reachable: Path, model: FakeOpenAI
) -> None:
    cfg = base_config(reachable / "data", model.base_url, free_port())
    cfg["agent"]["skills"] = {"public_dir": "my-skills"}
    path = write(tmp_path / "config.yaml", cfg)
    _, out, _ = await chital("check", "-c", str(path), cwd=tmp_path)
    assert f"WARNING skills.public_dir: {tmp_path / 'my-skills'} does not exist" in out, out
    assert "skills: 0 offered" in out
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        assert (
            f"WARNING agent.skills: skills: the public skills folder {tmp_path / 'my-skills'} does not exist"
            in d.logs()
        )
    finally:
        await d.close()


# -- 6. the data directory is private ----------------------------------------------------------------
@skip_on_postgres("the databases whose modes it checks are SQLite files; on PostgreSQL they are not here")
async def test_data_directory_is_private_whatever_the_umask(tmp_path: Path, model: FakeOpenAI) -> None:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    data = tmp_path / "data"
    old = os.umask(0o022)  # the usual umask, inherited by the daemon
    try:
        d = DaemonProcess(tmp_path, cfg)
        await d.start()
        await d.terminate()
        # An older version's leftovers: world-readable files and directory.
        data.chmod(0o755)
        (data / "gateway.sqlite").chmod(0o644)
        (data / "stray.txt").write_text("x")
        (data / "stray.txt").chmod(0o644)
        await d.start()
    finally:
        os.umask(old)
    try:
        assert mode(data) == 0o700, oct(mode(data))
        entries = sorted(p.name for p in data.iterdir())
        assert "gateway.sqlite" in entries and "checkpoints.sqlite" in entries, entries
        for p in data.iterdir():
            if p.is_dir():
                assert mode(p) == 0o700, (p, oct(mode(p)))
            else:
                assert mode(p) == 0o600, (p, oct(mode(p)))
        assert any(name.endswith("-wal") for name in entries), entries
        lines = [ln for ln in d.logs().split("--- run 2 ---")[1].splitlines() if "made private" in ln]
        assert len(lines) == 1 and "WARNING" in lines[0], d.logs()
        assert "0755 → 0700" in lines[0] and "gateway.sqlite" in lines[0] and "stray.txt" in lines[0]
    finally:
        await d.close()


@needs_root
async def test_first_start_as_root_with_the_default_sandbox_root_warns_of_nothing(
    tmp_path: Path, reachable: Path, model: FakeOpenAI
) -> None:
    """The README's layout as root: the sandbox root is ``data/sandboxes``, so the daemon opens the
    data directory to 0711 for the sandbox uid. On a first start that is the expected mode, not a
    privacy fix: no "made private" WARNING (it used to say "0700 → 0711", a widening, as a fix).
    A directory an older version left 0755 is still narrowed to 0711, with the one WARNING."""
    data = reachable / "data"
    cfg = base_config(data, model.base_url, free_port())
    del cfg["agent"]["sandbox"]["root"]  # the default: inside the data directory
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        await d.terminate()
        assert mode(data) == 0o711, oct(mode(data))
        assert "made private" not in d.logs(), d.logs()
        data.chmod(0o755)
        await d.start()
        lines = [ln for ln in d.logs().split("--- run 2 ---")[1].splitlines() if "made private" in ln]
        assert len(lines) == 1 and "WARNING" in lines[0] and "0755 → 0711" in lines[0], d.logs()
        assert mode(data) == 0o711, oct(mode(data))
    finally:
        await d.close()


@skip_on_postgres("on PostgreSQL any daemon sharing the database may deliver it: no note")
async def test_send_with_no_daemon_running_says_it_is_only_queued(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """`chital send` from cron exits 0 and prints a key either way; with no daemon on its SQLite
    file the message only waits in the journal, and the operator is told so on stderr. The next
    start delivers it; with the daemon up there is no such note."""
    user = 4242
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"]["telegram"] = tg.channel_settings(poll_timeout=1)
    cfg["access"] = {"allow_users": [user]}
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        tg.inject_message(user, user, "hello")  # the chat exists on the fake Telegram
        await tg.wait_for(lambda: "echo: hello" in tg.bot_texts(user), what="the first answer")
        await d.terminate()
        rc, out, err = await chital(
            "-c", str(d.config_path), "send", f"telegram:{user}", "while down", cwd=tmp_path
        )
        assert rc == 0 and out.strip().startswith(f"telegram:{user}:push-"), (out, err)
        assert "queued; no daemon is running on" in err and "next start" in err, err
        await d.start()
        await tg.wait_for(lambda: "while down" in tg.bot_texts(user), what="the queued push")
        rc, out, err = await chital(
            "-c", str(d.config_path), "send", f"telegram:{user}", "while up", cwd=tmp_path
        )
        assert rc == 0 and "no daemon" not in err, (out, err)
        await tg.wait_for(lambda: "while up" in tg.bot_texts(user), what="the second push")
    finally:
        await d.close()


# -- 8. no Pydantic deprecation from our own code ----------------------------------------------------
def test_secrets_of_walks_the_config_without_deprecated_pydantic_access() -> None:
    from gateway.config.schema import parse_config
    from gateway.ops.logs import secrets_of

    cfg = parse_config(
        {"models": [{"name": "default", "api_key": "sk-walk-secret-123"}], "storage": {"path": "/tmp/x"}}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = secrets_of(cfg)
    assert "sk-walk-secret-123" in found
