"""End to end: `chital run` as a subprocess with the real slack-bolt (Socket Mode) against the fake Slack."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, base_config, chat_config, free_port, started_daemon
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.slack_server import FakeSlack
from tests.slack_daemon import CHANNEL, DM, FRIEND, STRANGER, thread_shows


@pytest.fixture
async def daemon(tmp_path: Path, slack: FakeSlack, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = chat_config(tmp_path, model.base_url, slack, allow=[f"slack:{FRIEND}"], group_policy="mention")
    async with started_daemon(tmp_path, cfg, slack) as d:
        yield d


async def test_mention_answered_in_thread_once(daemon: DaemonProcess, slack: FakeSlack) -> None:
    chatter = await slack.inject_message(CHANNEL, FRIEND, "anyone for coffee")
    post = await slack.inject_mention(CHANNEL, FRIEND, "summarise the plan")
    msgs = await thread_shows(slack, CHANNEL, post.ts, "echo: summarise the plan")
    assert len(msgs) == 1, "message + app_mention of one post answered once"
    assert "<@" not in next(iter(msgs.values()))
    assert slack.thread(CHANNEL, chatter.ts) == {}, "unmentioned channel chatter is ignored"
    # Later messages in that thread need no new mention.
    follow = await slack.inject_thread_reply(CHANNEL, FRIEND, "and the budget?", thread_ts=post.ts)
    await thread_shows(slack, CHANNEL, post.ts, "echo: and the budget?")
    assert follow.ts
    # Picked-up and done reactions on the user's message.
    await slack.wait_for(lambda: len(slack.reactions.get((CHANNEL, post.ts), [])) >= 2 or None, timeout=5)


async def test_dm_answered(daemon: DaemonProcess, slack: FakeSlack) -> None:
    await slack.inject_dm(DM, FRIEND, "hello privately")
    await slack.wait_for(
        lambda: any("echo: hello privately" in t for t in slack.texts(DM)) or None, timeout=15
    )


async def test_long_answer_split(daemon: DaemonProcess, slack: FakeSlack) -> None:
    post = await slack.inject_mention(CHANNEL, FRIEND, "LONG please")
    await slack.wait_for(lambda: len(slack.thread(CHANNEL, post.ts)) >= 3 or None, timeout=30)
    parts = list(slack.thread(CHANNEL, post.ts).values())
    assert all(len(p) <= 3900 for p in parts)
    assert all(p.count("```") % 2 == 0 for p in parts)


async def test_retried_envelope_answered_once(daemon: DaemonProcess, slack: FakeSlack) -> None:
    post = await slack.inject_mention(CHANNEL, FRIEND, "once only")
    await thread_shows(slack, CHANNEL, post.ts, "echo: once only")
    await slack.redeliver(post.envelope, retry_attempt=1)
    nxt = await slack.inject_mention(CHANNEL, FRIEND, "next")
    await thread_shows(slack, CHANNEL, nxt.ts, "echo: next")
    assert len(slack.thread(CHANNEL, post.ts)) == 1


async def test_connection_drop_loses_nothing(daemon: DaemonProcess, slack: FakeSlack) -> None:
    await slack.inject_dm(DM, FRIEND, "before")
    await slack.wait_for(lambda: any("echo: before" in t for t in slack.texts(DM)) or None, timeout=15)
    slack.abort_ws()
    await slack.inject_dm(DM, FRIEND, "during the outage")
    await slack.wait_for(
        lambda: any("echo: during the outage" in t for t in slack.texts(DM)) or None, timeout=30
    )


async def test_attachment_reaches_uploads(
    daemon: DaemonProcess, slack: FakeSlack, model: FakeOpenAI, tmp_path: Path
) -> None:
    f = slack.add_file("data.csv", b"a,b\n1,2\n", "text/csv")
    await slack.inject_dm(DM, FRIEND, "analyse this", files=[f])
    await slack.wait_for(lambda: any("echo: analyse this" in t for t in slack.texts(DM)) or None, timeout=15)
    uploaded = list(daemon.sandbox_root.glob("**/uploads/data.csv"))
    assert uploaded and uploaded[0].read_bytes() == b"a,b\n1,2\n"
    assert any("data.csv" in last_user_text(r) for r in model.requests)


async def test_stranger_refused(daemon: DaemonProcess, slack: FakeSlack, model: FakeOpenAI) -> None:
    post = await slack.inject_mention(CHANNEL, STRANGER, "private data please")
    await thread_shows(slack, CHANNEL, post.ts, "only answer people I know")
    assert all("private data" not in last_user_text(r) for r in model.requests)


async def test_bad_token_channel_stays_down_others_serve(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    from tests.fakes.telegram_server import FakeTelegram

    tg = FakeTelegram()
    await tg.start()
    cfg: dict[str, Any] = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"]["slack"] = slack.channel_settings()
    cfg["channels"]["telegram"] = {**tg.channel_settings(), "token": "999:wrong-token-for-this-bot"}
    cfg["access"] = {"allow_users": [f"slack:{FRIEND}"]}
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start(wait_ready=False)
        info = await d.wait_channel_state("telegram", "failed")
        assert "401" in info["reason"] and "wrong-token" not in info["reason"]
        await d.wait_channel_state("slack", "connected")
        await slack.inject_dm(DM, FRIEND, "still here?")
        await slack.wait_for(
            lambda: any("echo: still here?" in t for t in slack.texts(DM)) or None, timeout=15
        )
        status, body = await d.get("/readyz")
        assert status == 503 and body["channels"]["slack"]["state"] == "connected"
        assert 'chital_channel_up{channel="slack"} 1.0' in await d.metrics()
        assert "wrong-token-for-this-bot" not in d.logs()
    finally:
        await d.close()
        await tg.stop()
