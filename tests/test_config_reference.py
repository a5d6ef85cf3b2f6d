"""config.yaml as an operator meets it: the generated reference is current, a typo names its line
and the key it meant, ids written as YAML numbers work, and CHITAL_HTTP_HOST moves the listener."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from gateway.config.schema import HTTP_HOST_ENV, ConfigError, load_config, parse_config
from tests.daemon import REPO


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs", REPO / "scripts" / "gen_config_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# -- the reference -------------------------------------------------------------------------------
def test_checked_in_reference_is_current() -> None:
    gen = _generator()
    checked_in = (REPO / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert gen.render() == checked_in, (
        "docs/config-reference.md is stale: run `python scripts/gen_config_docs.py` and commit it"
    )


def test_reference_carries_docstrings_types_and_defaults() -> None:
    text = _generator().render()
    # A field docstring, its type with bounds, and its default, in one row.
    assert "| `shutdown_grace` | number (≥ 0) | `20.0` | Seconds SIGTERM waits" in text
    # Inherited fields get their docstring (ChannelBase.access), and a repeated section links.
    assert "Overrides the top-level `access` for this channel. Same keys as [`access`](#access)." in text
    # A section left out differs from the section's own defaults: channels are off.
    assert "| `telegram` | section | `{enabled: false}` when absent |" in text
    assert "## `agent.sandbox.limits`" in text and "## `agent.mcp.servers.<name>`" in text
    assert "| `allow_users` | list[id] |" in text


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "ref.md"
    stale.write_text("old\n", encoding="utf-8")
    gen = _generator()
    assert gen.main(["--check", "--output", str(stale)]) == 1
    assert gen.main(["--output", str(stale)]) == 0
    assert gen.main(["--check", "--output", str(stale)]) == 0


# -- unknown keys --------------------------------------------------------------------------------
def test_unknown_key_names_its_line_and_the_key_it_meant(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text(
        "channels:\n"  # 1
        "  telegram:\n"  # 2
        "    tokn: 123:very-secret\n"  # 3
        "agent:\n"  # 4
        "  sandbox:\n"  # 5
        "    limits:\n"  # 6
        "      pidz: 64\n"  # 7
        "http:\n"  # 8
        "  port: eighty\n"  # 9
        "frobnicate: 1\n",  # 10
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as err:
        load_config(p)
    text = str(err.value)
    assert "channels.telegram.tokn (line 3): unknown key; did you mean 'token'?" in text
    assert "agent.sandbox.limits.pidz (line 7): unknown key; did you mean 'pids'?" in text
    assert "http.port (line 9):" in text
    # Nothing close: the known keys of that level are listed instead.
    assert "frobnicate (line 10): unknown key; known keys: access, agent, channels" in text
    assert "very-secret" not in text, "values (maybe secrets) are never echoed"


def test_unknown_key_in_a_list_item_and_without_a_file() -> None:
    # parse_config without the YAML node still names the key and suggests; just no line.
    with pytest.raises(ConfigError) as err:
        parse_config({"agent": {"mcp": {"servers": {"fs": {"command": "x", "argz": []}}}}})
    assert "agent.mcp.servers.fs.argz: unknown key; did you mean 'args'?" in str(err.value)


def test_cli_check_shows_the_line(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text("access:\n  alow_users: [1]\n", encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "check", "-c", str(p)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "access.alow_users (line 2): unknown key; did you mean 'allow_users'?" in proc.stderr


# -- ids as YAML numbers -------------------------------------------------------------------------
def test_numeric_ids_are_taken_as_strings(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text(
        "access:\n"
        "  allow_users: [123456, 'telegram:42']\n"
        "  admins: [7]\n"
        "  allow_chats: [-1001234567890]\n"
        "  admin_chats: [-100200]\n"
        "  free_response_chats: [-100300]\n"
        "channels:\n"
        "  discord:\n"
        "    access:\n"
        "      allow_users: [123456789012345678]\n",
        encoding="utf-8",
    )
    cfg = load_config(p)
    assert cfg.access.allow_users == ["123456", "telegram:42"]
    assert cfg.access.admins == ["7"]
    assert cfg.access.allow_chats == ["-1001234567890"]
    assert cfg.access.admin_chats == ["-100200"] and cfg.access.free_response_chats == ["-100300"]
    # A Discord snowflake is beyond 2^53: it must survive exactly (no float on the way).
    assert cfg.access_for("discord").allow_users == ["123456789012345678"]


def test_cli_check_accepts_numeric_ids(tmp_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text(
        f"access:\n  allow_users: [123456]\nstorage:\n  path: {tmp_path / 'data'}\n", encoding="utf-8"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "check", "-c", str(p)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # 1 = a readiness problem (no model key here), 2 = the file was refused.
    assert proc.returncode != 2, proc.stderr
    assert f"{p} is valid" in proc.stdout


def test_a_bool_is_not_an_id() -> None:
    with pytest.raises(ConfigError, match=r"access.allow_users\[0\]"):
        parse_config({"access": {"allow_users": [True]}})


# -- CHITAL_HTTP_HOST ----------------------------------------------------------------------------
def test_http_host_env_overrides_file_and_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HTTP_HOST_ENV, raising=False)
    assert parse_config({}).http.host == "127.0.0.1", "the host default stays loopback"
    p = tmp_path / "config.yaml"
    p.write_text("http:\n  host: 127.0.0.1\n  port: 9999\n", encoding="utf-8")
    monkeypatch.setenv(HTTP_HOST_ENV, "0.0.0.0")
    cfg = load_config(p)
    assert (cfg.http.host, cfg.http.port) == ("0.0.0.0", 9999)
    assert parse_config({}).http.host == "0.0.0.0"
    monkeypatch.setenv(HTTP_HOST_ENV, "  ")
    assert parse_config({}).http.host == "127.0.0.1", "a blank variable is no override"


# -- the setup guides stay true to the adapters -----------------------------------------------------
SLACK_SCOPES_BY_CALL: dict[str, set[str]] = {
    "auth_test": set(),
    "chat_postMessage": {"chat:write"},
    "chat_update": {"chat:write"},
    "chat_postEphemeral": {"chat:write"},
    "reactions_add": {"reactions:write"},
    "files_upload_v2": {"files:write"},
    "conversations_history": {"channels:history", "groups:history", "im:history", "mpim:history"},
    "conversations_replies": {"channels:history", "groups:history", "im:history", "mpim:history"},
}
"""Web API method (slack_sdk name) → the bot scopes docs/setup/slack.md gives for it."""
SLACK_EVENTS = {"app_mention", "message.channels", "message.groups", "message.im", "message.mpim"}
SLACK_EVENT_SCOPES = {"app_mentions:read", "channels:history", "groups:history", "im:history", "mpim:history"}


def test_slack_manifest_asks_for_what_the_adapter_calls() -> None:
    """A new Web API call in channels/slack must come with its scope in the manifest (and the
    guide); a scope nothing uses must not be asked for."""
    manifest = yaml.safe_load((REPO / "slack-app-manifest.yaml").read_text(encoding="utf-8"))
    assert manifest["settings"]["socket_mode_enabled"] is True
    assert manifest["features"]["app_home"]["messages_tab_enabled"] is True
    source = "".join(
        p.read_text(encoding="utf-8")
        for p in sorted((REPO / "channels").rglob("*.py"))
        if "slack" in p.as_posix()
    )
    calls = set(re.findall(r"_client\.([a-z][A-Za-z0-9_]*)\(", source))
    assert "chat_postMessage" in calls, "the adapter moved: update this test's search"
    unknown = calls - SLACK_SCOPES_BY_CALL.keys()
    assert not unknown, (
        f"channels/slack calls {sorted(unknown)}: add their scopes to slack-app-manifest.yaml and docs/setup/slack.md"
    )
    needed = set().union(*(SLACK_SCOPES_BY_CALL[c] for c in calls)) | SLACK_EVENT_SCOPES
    if "url_private" in source:
        needed.add("files:read")  # downloads of files users share
    if manifest["features"].get("slash_commands"):
        needed.add("commands")  # the command menu (channels/slack/commands.py)
    assert set(manifest["oauth_config"]["scopes"]["bot"]) == needed
    assert set(manifest["settings"]["event_subscriptions"]["bot_events"]) == SLACK_EVENTS
    # Approve / Deny buttons (block_actions over the socket) need interactivity on.
    assert manifest["settings"]["interactivity"]["is_enabled"] is ("app.action(" in source)
    guide = (REPO / "docs" / "setup" / "slack.md").read_text(encoding="utf-8")
    for scope in needed | {"connections:write"}:
        assert f"`{scope}`" in guide, f"docs/setup/slack.md does not explain {scope}"


def test_discord_invite_permissions_add_up() -> None:
    import discord

    perms = discord.Permissions(
        view_channel=True, send_messages=True, send_messages_in_threads=True,
        read_message_history=True, attach_files=True, add_reactions=True,
    )  # fmt: skip
    guide = (REPO / "docs" / "setup" / "discord.md").read_text(encoding="utf-8")
    assert perms.value == 274878008384
    assert f"permissions={perms.value}" in guide and "274 878 008 384" in guide
    intents = re.search(r"intents = discord\.Intents\.none\(\)(.*?)\n\s*\n", _discord_source(), re.DOTALL)
    assert intents is not None, "the adapter moved: update this test's search"
    asked = set(re.findall(r"intents\.(\w+) = True", intents.group(1)))
    assert asked == {"guilds", "guild_messages", "dm_messages", "message_content"}, (
        f"the adapter asks for intents {sorted(asked)}: update docs/setup/discord.md"
    )


def _discord_source() -> str:
    return "".join(
        p.read_text(encoding="utf-8")
        for p in sorted((REPO / "channels").rglob("*.py"))
        if "discord" in p.as_posix()
    )
