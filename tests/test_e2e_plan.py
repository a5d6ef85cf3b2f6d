"""Plan mode end to end: `chital run` with the fake model calling ``write_todos``, on the fake
Telegram and the fake Slack. Asserted is what the user sees: one checklist message per turn, edited
as items start and finish and left in a clear final state, ``/plan``, the same plan continued after
a kill -9, and the model's plan text shown bounded, inert and without secrets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.delivery.plan import PLAN_PART
from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.gateway_rig import daemon_rows
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.slack_server import FakeSlack, Post
from tests.fakes.telegram_server import FakeTelegram
from tests.slack_daemon import DM, FRIEND
from tests.telegram_daemon import OWNER, answered, replies_to

NO_MEMORY = {"memory": {"enabled": False}}
"""No memory extraction: every model call is one of the test's scripted replies."""


def todos(*items: tuple[str, str]) -> ToolCall:
    return ToolCall("write_todos", {"todos": [{"content": c, "status": s} for c, s in items]})


def plan(*texts: str) -> Reply:
    """One model step that writes the plan: ``texts`` are "status:content"."""
    pairs = [t.split(":", 1) for t in texts]
    return Reply(tool_calls=[todos(*((content, status) for status, content in pairs))])


def tool_results(model: FakeOpenAI, start: int = 0) -> list[str]:
    """The tool results the model was sent (in the requests from ``start`` on)."""
    return [
        str(m.get("content"))
        for body in model.requests[start:]
        for m in body["messages"]
        if m.get("role") == "tool"
    ]


@pytest.fixture
async def tg_daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[str(OWNER)], agent=NO_MEMORY)
    async with started_daemon(tmp_path, cfg) as d:
        yield d


@pytest.fixture
async def slack_daemon(tmp_path: Path, slack: FakeSlack, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = chat_config(tmp_path, model.base_url, slack, allow=[f"slack:{FRIEND}"], agent=NO_MEMORY)
    async with started_daemon(tmp_path, cfg, slack) as d:
        yield d


def checklists_tg(tg: FakeTelegram, mid: int) -> list[Any]:
    return [m for m in replies_to(tg, OWNER, mid) if "📋" in m.text]


def checklists_slack(slack: FakeSlack) -> list[Post]:
    return [p for p in slack.posts if p.channel == DM and any("📋" in h for h in p.history)]


# -- the checklist ------------------------------------------------------------------------------------
async def test_telegram_plan_is_one_message_edited_to_done_and_plan_shows_it(
    tg_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(
        plan("in_progress:gather the figures", "pending:draw the chart", "pending:write the summary"),
        plan("completed:gather the figures", "in_progress:draw the chart", "pending:write the summary"),
        plan("completed:gather the figures", "completed:draw the chart", "completed:write the summary"),
        Reply(text="Here is the report."),
    )
    up = tg.inject_message(OWNER, OWNER, "make me a report")
    mid = up["message"]["message_id"]
    await answered(tg, OWNER, up, "Here is the report.", timeout=30)
    lists = await tg.wait_for(
        lambda: [m for m in checklists_tg(tg, mid) if "all 3 steps done" in m.text] or None,
        timeout=10,
        what="the checklist's final state",
    )
    assert len(checklists_tg(tg, mid)) == 1, "one checklist message per turn"
    checklist = lists[0]
    assert checklist.edits >= 1, "sent once, then edited in place"
    assert checklist.text.count("☑") == 3 and "☐" not in checklist.text and "◐" not in checklist.text
    assert checklist.spans("code") == ["gather the figures", "draw the chart", "write the summary"]
    sends = [c for c in tg.calls_to("sendMessage") if "Plan" in str(c.params.get("text"))]
    assert len(sends) == 1, "the checklist was posted once; every change after was an edit"
    assert len(replies_to(tg, OWNER, mid)) == 2, "the checklist and the answer, nothing else"
    assert any("Updated todo list" in r for r in tool_results(model)), "the tool ran for the model"
    assert "write_todos" not in "".join(m.text for m in tg.bot_messages(OWNER)), "no tool chatter"

    shown = tg.inject_message(OWNER, OWNER, "/plan")
    reply = await answered(tg, OWNER, shown, "Plan", timeout=15)
    assert "(3/3 done)" in reply.text and reply.text.count("☑") == 3
    assert reply.spans("code") == ["gather the figures", "draw the chart", "write the summary"]


async def test_slack_plan_is_one_message_edited_through_its_states(
    slack_daemon: DaemonProcess, slack: FakeSlack, model: FakeOpenAI
) -> None:
    """On Slack each state may be its own chat.update (paced); the post's history shows the plan
    going from started to done in one message."""
    model.script(
        plan("in_progress:fetch the data", "pending:check it"),
        plan("completed:fetch the data", "in_progress:check it"),
        plan("completed:fetch the data", "completed:check it"),
        Reply(text="Checked and done."),
    )
    await slack.inject_dm(DM, FRIEND, "please check the data")
    await slack.wait_for(lambda: any("Checked and done." in t for t in slack.texts(DM)) or None, timeout=30)
    await slack.wait_for(
        lambda: any("all 2 steps done" in p.text for p in checklists_slack(slack)) or None, timeout=10
    )
    posts = checklists_slack(slack)
    assert len(posts) == 1, [p.history for p in posts]
    history = posts[0].history
    assert len(history) >= 2, "posted, then edited"
    assert "◐" in history[0] and "(0/2 done)" in history[0], history
    assert "all 2 steps done" in history[-1] and "◐" not in history[-1]
    assert len(slack.calls_to("chat.update")) >= 1

    await slack.inject_dm(DM, FRIEND, "/plan")
    shown = await slack.wait_for(
        lambda: [t for t in slack.texts(DM) if "last answer left it" in t] or None, timeout=15
    )
    assert "fetch the data" in shown[0] and shown[0].count("☑") == 2


async def test_a_plan_abandoned_halfway_ends_marked_not_done(
    tg_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    first = tg.inject_message(OWNER, OWNER, "/plan")
    await answered(tg, OWNER, first, "No plan in this conversation yet", timeout=15)
    model.script(
        plan("completed:read the file", "in_progress:translate it", "pending:proofread it"),
        Reply(text="I stopped here: the file is too long to translate."),
    )
    up = tg.inject_message(OWNER, OWNER, "translate my file")
    mid = up["message"]["message_id"]
    await answered(tg, OWNER, up, "I stopped here", timeout=30)
    lists = await tg.wait_for(
        lambda: [m for m in checklists_tg(tg, mid) if "not finished" in m.text] or None,
        timeout=10,
        what="the checklist's final state",
    )
    text = lists[0].text
    assert "1 of 3 steps done" in text
    assert "◐" not in text, "nothing shows as still being worked on"
    assert text.count("(not done)") == 2 and text.count("☑") == 1
    assert len(checklists_tg(tg, mid)) == 1


async def test_a_plan_stopped_with_stop_ends_marked_not_done(
    tg_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    held = asyncio.Event()
    model.script(
        plan("completed:open the page", "in_progress:read it", "pending:sum it up"),
        Reply(text="never seen", hold=held),
    )
    up = tg.inject_message(OWNER, OWNER, "sum up the page")
    mid = up["message"]["message_id"]
    try:
        await tg.wait_for(lambda: checklists_tg(tg, mid) or None, timeout=30, what="the checklist")
        await tg.wait_for(lambda: len(model.requests) >= 2 or None, timeout=15, what="the second model call")
        tg.inject_message(OWNER, OWNER, "/stop")
        lists = await tg.wait_for(
            lambda: [m for m in checklists_tg(tg, mid) if "not finished" in m.text] or None,
            timeout=15,
            what="the checklist's final state after /stop",
        )
    finally:
        held.set()
    assert "1 of 3 steps done" in lists[0].text and "◐" not in lists[0].text
    assert len(checklists_tg(tg, mid)) == 1


# -- a crash in the middle --------------------------------------------------------------------------
async def test_kill9_mid_plan_continues_the_same_plan_in_the_same_message(
    tg_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    held = asyncio.Event()
    model.script(
        plan("in_progress:download the data", "pending:clean it", "pending:plot it"),
        Reply(text="never seen", hold=held),  # the daemon dies while the model "thinks"
        plan("completed:download the data", "in_progress:clean it", "pending:plot it"),
        plan("completed:download the data", "completed:clean it", "completed:plot it"),
        Reply(text="The plot is ready."),
    )
    up = tg.inject_message(OWNER, OWNER, "plot my data")
    mid = up["message"]["message_id"]
    await tg.wait_for(lambda: checklists_tg(tg, mid) or None, timeout=30, what="the first checklist")
    await tg.wait_for(lambda: len(model.requests) >= 2 or None, timeout=15, what="the second model call")
    # Killed once the checklist's id is recorded: a kill between Telegram's answer and that write
    # is the send window docs/durability.md describes (sendMessage has no idempotency key).
    await _until_recorded(tg_daemon.config["storage"])
    before = len(model.requests)
    tg_daemon.kill9()
    await tg_daemon.wait_exit()
    held.set()
    await tg_daemon.start()
    await answered(tg, OWNER, up, "The plot is ready.", timeout=40)
    await tg.wait_for(
        lambda: [m for m in checklists_tg(tg, mid) if "all 3 steps done" in m.text] or None,
        timeout=10,
        what="the checklist's final state",
    )
    assert len(checklists_tg(tg, mid)) == 1, "the resumed turn edited the checklist it had posted"
    resumed = model.requests[before]
    sent = json.dumps(resumed["messages"])
    assert "download the data" in sent and "Updated todo list" in sent, "the plan came from the checkpoint"
    assert sum("plot my data" in json.dumps(b["messages"][-1]) for b in model.requests) == 1, (
        "the turn continued; it did not start over"
    )
    answers = [m for m in replies_to(tg, OWNER, mid) if "The plot is ready." in m.text]
    assert len(answers) == 1

    shown = tg.inject_message(OWNER, OWNER, "/plan")
    reply = await answered(tg, OWNER, shown, "Plan", timeout=15)
    assert reply.text.count("☑") == 3


# -- the model's text is untrusted ------------------------------------------------------------------
SECRET = "sk-test-key-never-logged"  # the model's API key in tests/daemon.py's config


def hostile(secret: str) -> Reply:
    return Reply(
        tool_calls=[
            todos(
                ("ping <!everyone> and @channel @everyone", "in_progress"),
                ("[Verify your account](https://evil.example/login)", "pending"),
                (f"use the key {secret} now", "pending"),
                ("evil\u202eexe.txt\u200b and `code` break", "pending"),
                ("x" * 200, "pending"),
            )
        ]
    )


HUGE = Reply(tool_calls=[todos(*((f"step {i}", "pending") for i in range(10_000)))])


async def test_telegram_huge_and_hostile_plans_are_refused_or_shown_inert(
    tg_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    parallel = Reply(tool_calls=[todos(("a", "pending")), todos(("b", "pending"))])
    model.script(HUGE, parallel, hostile(SECRET), Reply(text="Plan written."))
    up = tg.inject_message(OWNER, OWNER, "plan something big")
    mid = up["message"]["message_id"]
    await answered(tg, OWNER, up, "Plan written.", timeout=30)
    results = tool_results(model)
    assert any("at most 25 are allowed" in r for r in results), "the model was told the bound"
    assert sum("multiple times in parallel" in r for r in results) >= 2, "parallel plans: both refused"
    lists = await tg.wait_for(
        lambda: [m for m in checklists_tg(tg, mid) if "not finished" in m.text] or None, timeout=10
    )
    assert len(replies_to(tg, OWNER, mid)) == 2, "10,000 items did not flood the chat"
    checklist = lists[0]
    text = checklist.text
    assert "step 1" not in text
    assert len(text) < 2000
    assert SECRET not in text and "***" in text
    assert "\u202e" not in text and "\u200b" not in text
    kinds = {e["type"] for e in checklist.entities}
    assert not kinds & {"text_link", "url", "mention", "text_mention"}, kinds
    assert len(checklist.spans("code")) == 5, "every item is shown as literal code"
    assert "…" in checklist.spans("code")[4], "a long item is cut"


async def test_slack_huge_long_and_hostile_plans_never_ping_link_or_leak(
    slack_daemon: DaemonProcess, slack: FakeSlack, model: FakeOpenAI
) -> None:
    too_long = Reply(tool_calls=[todos(("y" * 5000, "pending"))])
    model.script(HUGE, too_long, hostile(SECRET), Reply(text="Plan written."))
    await slack.inject_dm(DM, FRIEND, "plan something big")
    await slack.wait_for(lambda: any("Plan written." in t for t in slack.texts(DM)) or None, timeout=30)
    results = tool_results(model)
    assert any("at most 25 are allowed" in r for r in results)
    assert any("longer than 200 characters" in r for r in results)
    await slack.wait_for(
        lambda: any("not finished" in p.text for p in checklists_slack(slack)) or None, timeout=10
    )
    posts = checklists_slack(slack)
    assert len(posts) == 1
    assert len(slack.texts(DM)) == 2, "the checklist and the answer, nothing else"
    for text in posts[0].history:
        assert "<!everyone>" not in text and "<!channel>" not in text and "<!here>" not in text
        assert "<https://evil.example" not in text, "no live link"
        assert SECRET not in text
        assert "\u202e" not in text and "y" * 300 not in text
        assert len(text) < 2000


async def _until_recorded(storage: dict[str, Any], timeout: float = 15.0) -> None:
    """Until the daemon's outbox holds the checklist's message id (part PLAN_PART)."""
    sql = "SELECT message_id FROM outbox WHERE part = ?"
    for _ in range(int(timeout / 0.05)):
        if await asyncio.to_thread(daemon_rows, storage, sql, (PLAN_PART,)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the checklist's message id was never recorded")
