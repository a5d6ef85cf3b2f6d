"""What the end-to-end tests of a Slack daemon share: the users and conversations the fake Slack
knows, and how to wait for the thread a user would see. One home, so no test module imports another."""

from __future__ import annotations

from tests.fakes.slack_server import FakeSlack

FRIEND = "U_FRIEND"
STRANGER = "U_STRANGER"
CHANNEL = "C_GENERAL"
DM = "D_FRIEND"


async def thread_shows(
    slack: FakeSlack, channel: str, thread_ts: str | None, needle: str, timeout: float = 15
) -> dict[str, str]:
    def check() -> dict[str, str] | None:
        msgs = slack.thread(channel, thread_ts)
        return msgs if any(needle in t for t in msgs.values()) else None

    return await slack.wait_for(check, timeout=timeout)
