"""Discord application commands, end to end: ``chital run`` with the real discord.py on the fake
Discord registers the command registry as global application commands (bulk overwrite, admin rows
hidden from non-admin members), and answers a command interaction with a deferred response that the
normal reply path then edits, with the same registry rows and access checks as typed text.
Malformed interactions get a specific ephemeral refusal, never a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon import chat_config, started_daemon
from tests.discord_daemon import FRIEND, STRANGER
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, last_user_text

ADMIN = "515151515151515151"


def config(tmp_path: Path, model: FakeOpenAI, dc: FakeDiscord) -> dict[str, Any]:
    cfg = chat_config(
        tmp_path, model.base_url, dc, allow=[f"discord:{FRIEND}", f"discord:{ADMIN}"],
        group_policy="mention", access={"admins": [f"discord:{ADMIN}"]},
    )  # fmt: skip
    cfg["access"]["pairing"] = True
    return cfg


async def response(dc: FakeDiscord, iid: str, needle: str) -> str:
    def check() -> str | None:
        text = dc.response_text(iid)
        return text if text is not None and needle in text else None

    return await dc.wait_for(check, timeout=20)


async def test_commands_registered_and_answered_through_interactions(
    tmp_path: Path, dc: FakeDiscord, model: FakeOpenAI
) -> None:
    async with started_daemon(tmp_path, config(tmp_path, model, dc), dc) as daemon:
        await dc.wait_for(lambda: dc.global_commands, timeout=20)
        by_name = {c["name"]: c for c in dc.global_commands}
        assert {"new", "stop", "status", "model", "help", "approve"} <= set(by_name)
        assert by_name["approve"]["default_member_permissions"] == "0", "hidden from non-admin members"
        assert by_name["help"]["default_member_permissions"] is None
        assert by_name["model"]["options"][0]["name"] == "args"
        assert all(1 <= len(c["description"]) <= 100 for c in dc.global_commands)
        # /help in a DM: deferred (type 5) at once, then the deferred response edited with the answer.
        iid = await dc.run_command(FRIEND, "help")
        text = await response(dc, iid, "Commands:")
        assert dc.interaction_responses[iid]["type"] == 5
        assert "/approve" not in text, "a non-admin's /help"
        # /status in the guild channel; /model with its option.
        iid = await dc.run_command(FRIEND, "status", channel_id=dc.channel_id)
        await response(dc, iid, "Thread:")
        iid = await dc.run_command(FRIEND, "model", "no-such-model")
        await response(dc, iid, "no-such-model")
        # An admin-only command from a non-admin (e.g. in a DM, where Discord shows every command):
        # refused as when typed; the admin's runs.
        iid = await dc.run_command(FRIEND, "approve", "ABCD1234")
        await response(dc, iid, "only an admin")
        iid = await dc.run_command(ADMIN, "approve")
        answer = await dc.wait_for(lambda: dc.response_text(iid), timeout=20)
        assert "only an admin" not in answer
        # A stranger gets the pairing path, never the agent.
        iid = await dc.run_command(STRANGER, "help")
        answer = await dc.wait_for(lambda: dc.response_text(iid), timeout=20)
        assert "code" in answer.lower() or "access" in answer.lower()
        assert "Commands:" not in answer
        # A secret given as an argument never comes back.
        iid = await dc.run_command(FRIEND, "model", dc.token)
        await dc.wait_for(lambda: dc.response_text(iid), timeout=20)
        assert all(dc.token not in m.content for m in dc.posted)
        assert not model.requests, "no command reached the model"
        puts = dc.command_puts
        await daemon.terminate()
    # A restart with the same registry overwrites nothing.
    async with started_daemon(tmp_path, config(tmp_path, model, dc), dc):
        iid = await dc.run_command(FRIEND, "help")
        await response(dc, iid, "Commands:")
        assert ("GET", f"/api/v10/applications/{dc.application_id}/commands") in dc.rest_calls
        assert dc.command_puts == puts


async def test_malformed_command_interactions_are_refused(
    tmp_path: Path, dc: FakeDiscord, model: FakeOpenAI
) -> None:
    async with started_daemon(tmp_path, config(tmp_path, model, dc), dc) as daemon:
        await dc.wait_for(lambda: dc.global_commands, timeout=20)
        good = dc.global_commands[0]["name"]
        from tests.fakes.discord_commands import command_interaction

        def broken(**data: Any) -> dict[str, Any]:
            body = command_interaction(dc, FRIEND, dc.dm_channel(FRIEND), good, None)
            body["data"] = {**body["data"], **data}
            dc.interactions[body["id"]] = body
            return body

        cases = [
            broken(name=None),  # no name
            broken(name="X" * 40),  # a name no command has
            broken(options=[{"name": "args", "type": 3, "value": {"x": 1}}]),  # an option not a string
            broken(options="args"),  # options not a list
        ]
        for body in cases:
            await dc.inject_interaction(body)
        for body in cases:
            await dc.wait_for(lambda b=body: b["id"] in dc.interaction_responses, timeout=15)
            answer = dc.interaction_responses[body["id"]]
            assert answer["type"] == 4 and answer["data"]["flags"] == 64
            assert "couldn't read that command" in answer["data"]["content"]
        metrics = await daemon.metrics()
        assert 'chital_malformed_events_total{kind="command",platform="discord"} 4.0' in metrics
        # An unknown but well-formed name: the registry's own answer.
        iid = await dc.run_command(FRIEND, "bogus")
        await response(dc, iid, "Unknown command /bogus")
        # Oversized option text: journaled as unreadable, the user told.
        iid = await dc.run_command(FRIEND, "model", "x" * 1_100_000)
        await response(dc, iid, "couldn't read")
        # The channel still serves typed text.
        mid = await dc.inject_dm(FRIEND, "/help")
        await dc.wait_for(lambda: any(m.reply_to == mid for m in dc.posted), timeout=15)
        assert all("x" * 1000 not in last_user_text(r) for r in model.requests)
