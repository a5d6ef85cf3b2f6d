"""Standing permissions on Slack end to end (docs/approvals.md, "Standing permissions"): `chital
run` with slack-bolt over Socket Mode against the fake Slack, the real agent and sandbox. The
Telegram side is tests/test_e2e_approval_grants.py; this asserts the same contract where the
buttons are Block Kit, the refusals ephemeral, and ``/approvals`` a declared slash command.

``write_file`` is the gated tool (each call approved, by a person or a permission, so its output
never makes the thread's later calls ask: agent/provenance.py)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.daemon import chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.slack_server import FakeSlack
from tests.slack_daemon import CHANNEL, DM, FRIEND, thread_shows

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
OUT = "/mnt/user-data/outputs"
SLACK_OTHER = "U_OTHER"


def write(name: str) -> ToolCall:
    return ToolCall("write_file", {"file_path": f"{OUT}/{name}.txt", "content": f"{name}\n"})


def grant_id(listing: str) -> str:
    """The number ``/approvals`` shows in front of the write_file permission."""
    found = re.search(r"#(\d+)\W+write_file", listing)
    assert found, listing
    return found.group(1)


async def test_slack_admins_always_allow_applies_everywhere_until_revoked(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    """A non-admin's press on Always is refused; an admin's "Always" on Slack: a later call in another thread runs without asking;
    the slash command ``/approvals`` lists it as everywhere with who granted it; a non-admin may
    not revoke it; the admin's revocation makes the next call ask again."""
    model.script(
        Reply(tool_calls=[write("one")]),
        Reply(text="Wrote one."),
        Reply(tool_calls=[write("two")]),
        Reply(text="Wrote two."),
        Reply(tool_calls=[write("three")]),
    )
    cfg = chat_config(
        tmp_path, model.base_url, slack, allow=[f"slack:{FRIEND}", f"slack:{SLACK_OTHER}"],
        group_policy="mention", access={"admins": [f"slack:{FRIEND}"]},
        agent={"approvals": {"tools": ["write_file"], "timeout": 600}, "memory": {"enabled": False}},
    )  # fmt: skip
    async with started_daemon(tmp_path, cfg, slack):
        first = await slack.inject_mention(CHANNEL, FRIEND, "write one")
        request = await slack.wait_for(
            lambda: next((p for p in slack.posts if p.buttons()), None), timeout=30
        )
        assert request.buttons() == ["✅ Approve", "💬 Allow here", "♾ Always", "❌ Deny"]
        stranger = await slack.press_button(CHANNEL, request.ts, SLACK_OTHER, "Always", name="mallory")
        await slack.wait_for(lambda: slack.is_acked(stranger) or None, timeout=10)
        note = await slack.wait_for(lambda: next(iter(slack.ephemerals), None), timeout=10)
        assert note["user"] == SLACK_OTHER and "Not yours" in note["text"] and request.buttons()
        press = await slack.press_button(CHANNEL, request.ts, FRIEND, "Always", name="friend")
        await slack.wait_for(lambda: slack.is_acked(press) or None, timeout=10)
        await thread_shows(slack, CHANNEL, first.ts, "Wrote one.", timeout=30)
        assert request.buttons() == [] and "Approved by" in request.text

        second = await slack.inject_mention(CHANNEL, SLACK_OTHER, "write two")
        await thread_shows(slack, CHANNEL, second.ts, "Wrote two.", timeout=30)
        assert len([p for p in slack.posts if "Approval needed" in p.text]) == 1, "no second prompt"

        await slack.inject_slash(DM, FRIEND, "/approvals")
        listing = await slack.wait_for(
            lambda: next((t for t in slack.texts(DM) if "Standing permissions" in t), None), timeout=15
        )
        assert "write_file" in listing and "friend" in listing
        gid = grant_id(listing)

        await slack.inject_slash(CHANNEL, SLACK_OTHER, "/approvals", f"revoke {gid}")
        await slack.wait_for(
            lambda: next((t for t in slack.texts(CHANNEL) if "Not yours to revoke" in t), None),
            timeout=15,
        )
        await slack.inject_slash(DM, FRIEND, "/approvals", f"revoke {gid}")
        await slack.wait_for(lambda: next((t for t in slack.texts(DM) if "Revoked" in t), None), timeout=15)

        await slack.inject_mention(CHANNEL, FRIEND, "write three")
        await slack.wait_for(
            lambda: len([p for p in slack.posts if "Approval needed" in p.text]) == 2 or None, timeout=30
        )
