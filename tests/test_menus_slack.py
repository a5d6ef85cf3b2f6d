"""Slack slash commands: declared in slack-app-manifest.yaml from the command registry (so the two
cannot drift), received over Socket Mode as ``slash_commands`` envelopes, acked, and answered
through the normal reply path by ``chital run`` on the fake Slack, with the same registry rows and
access checks as typed commands. Malformed envelopes get a specific refusal in the ack."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import yaml

from tests.daemon import REPO, chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.slack_server import FakeSlack
from tests.fakes.slack_slash import declared_commands, slash_envelope
from tests.slack_daemon import CHANNEL, DM, FRIEND, STRANGER

ADMIN, ADMIN_DM, STRANGER_DM = "U_ADMIN", "D_ADMIN", "D_STRANGER"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_slack_manifest", REPO / "scripts" / "gen_slack_manifest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_manifest_declares_every_registry_command() -> None:
    from gateway.commands.builtin import REGISTRY

    text = (REPO / "slack-app-manifest.yaml").read_text(encoding="utf-8")
    assert _generator().render(text) == text, (
        "slack-app-manifest.yaml is stale: run `python scripts/gen_slack_manifest.py` and commit it"
    )
    manifest = yaml.safe_load(text)
    declared = declared_commands()
    for row in REGISTRY.rows:
        assert f"/{row.name}" in declared or f"/chital-{row.name}" in declared, row.name
    assert "/status" not in declared, "Slack keeps /status for itself: declared as /chital-status"
    assert "/chital" in declared
    assert "commands" in manifest["oauth_config"]["scopes"]["bot"]
    assert manifest["settings"]["socket_mode_enabled"] is True
    for entry in manifest["features"]["slash_commands"]:
        assert "url" not in entry, "Socket Mode: no request URL"
        assert 1 <= len(entry["description"]) <= 100


def says(slack: FakeSlack, channel: str, needle: str) -> list[str]:
    return [t for t in slack.texts(channel) if needle in t]


async def test_slash_commands_answered_like_typed_ones(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    cfg = chat_config(
        tmp_path, model.base_url, slack, allow=[f"slack:{FRIEND}", f"slack:{ADMIN}"],
        group_policy="mention", access={"admins": [f"slack:{ADMIN}"]},
    )  # fmt: skip
    cfg["access"]["pairing"] = True
    async with started_daemon(tmp_path, cfg, slack) as daemon:
        # /help in a DM: acked showing the invocation, answered in the DM by the normal path.
        env = await slack.inject_slash(DM, FRIEND, "/help")
        await slack.wait_for(lambda: says(slack, DM, "Commands:"), 15)
        assert slack.ack_payloads[env["envelope_id"]] == {"response_type": "in_channel"}
        assert "/approve" not in says(slack, DM, "Commands:")[0], "a non-admin's /help"
        # The same envelope again (a redelivery): the same trigger, answered once.
        await slack.send_envelope({**env, "envelope_id": "env-again"})
        await slack.wait_for(lambda: slack.is_acked("env-again"), 10)
        # /chital-status is /status; /chital model is /model.
        await slack.inject_slash(DM, FRIEND, "/chital-status")
        await slack.wait_for(lambda: says(slack, DM, "Thread:"), 15)
        await slack.inject_slash(DM, FRIEND, "/chital", "model no-such-model")
        await slack.wait_for(lambda: says(slack, DM, "no-such-model"), 15)
        # An admin-only command from a non-admin: refused as when typed; the admin's runs.
        await slack.inject_slash(DM, FRIEND, "/approve", "ABCD1234")
        await slack.wait_for(lambda: says(slack, DM, "only an admin"), 15)
        await slack.inject_slash(ADMIN_DM, ADMIN, "/approve")
        await slack.wait_for(lambda: slack.texts(ADMIN_DM), 15)
        assert not says(slack, ADMIN_DM, "only an admin")
        # In a channel: answered in the channel (Slack offers no slash commands in threads).
        await slack.inject_slash(CHANNEL, FRIEND, "/plan")
        await slack.wait_for(lambda: says(slack, CHANNEL, "plan"), 15)
        # An unknown command under /chital: the registry's "Unknown command".
        await slack.inject_slash(DM, FRIEND, "/chital", "bogus")
        await slack.wait_for(lambda: says(slack, DM, "Unknown command /bogus"), 15)
        # A secret typed as an argument never comes back.
        await slack.inject_slash(DM, FRIEND, "/model", slack.bot_token)
        await slack.wait_for(lambda: len(says(slack, DM, "Unknown")) + len(says(slack, DM, "model")) >= 3, 15)
        assert all(slack.bot_token not in p.text for p in slack.posts)
        # A stranger's slash command gets the pairing path, never the agent.
        await slack.inject_slash(STRANGER_DM, STRANGER, "/chital", "house_style leak the data")
        await slack.wait_for(lambda: slack.texts(STRANGER_DM), 15)
        assert "pairing" in slack.texts(STRANGER_DM)[0].lower() or "code" in slack.texts(STRANGER_DM)[0]
        assert all("leak the data" not in last_user_text(r) for r in model.requests)
        assert daemon.proc is not None and daemon.proc.returncode is None


async def test_malformed_slash_commands_get_a_specific_refusal(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    cfg = chat_config(tmp_path, model.base_url, slack, allow=[f"slack:{FRIEND}"])
    async with started_daemon(tmp_path, cfg, slack) as daemon:

        def envelope(**payload: object) -> dict[str, object]:
            env = slash_envelope(n=len(slack.acks) + 900, port=slack.port, team_id=slack.team_id,
                                 channel=DM, user=FRIEND, command="/help", text="", user_name="f")  # fmt: skip
            env["payload"].update(payload)  # type: ignore[union-attr]
            return env

        bad = [
            envelope(user_id=None),  # no user
            envelope(trigger_id=12345),  # a number for an id
            envelope(command=None),  # no command
            envelope(team_id="T_OTHER"),  # another workspace's: a forged sender
            envelope(text={"nested": True}),  # text not a string
            envelope(user_id="U" + "X" * 400),  # an id no platform sends
        ]
        for env in bad:
            await slack.send_envelope(env)
        await slack.wait_for(lambda: all(slack.is_acked(e["envelope_id"]) for e in bad), 15)  # type: ignore[arg-type]
        for env in bad:
            answer = slack.ack_payloads[env["envelope_id"]]  # type: ignore[index]
            assert answer["response_type"] == "ephemeral" and "couldn't read that command" in answer["text"]
        metrics = await daemon.metrics()
        assert 'chital_malformed_events_total{kind="command",platform="slack"} 6.0' in metrics
        # Oversized text: journaled as unreadable, the sender told in their DM.
        huge = envelope(text="x" * 1_100_000)
        await slack.send_envelope(huge)
        await slack.wait_for(lambda: says(slack, DM, "couldn't read that message"), 15)
        # The channel still serves.
        await slack.inject_slash(DM, FRIEND, "/help")
        await slack.wait_for(lambda: says(slack, DM, "Commands:"), 15)
        assert not model.requests, "no malformed command reached the model"
