"""Plan mode end to end: `chital run` with the fake model calling ``write_todos``, on the fake
Telegram and the fake Slack. Asserted is what the user sees: one checklist message per turn, edited
as items start and finish and left in a clear final state, ``/plan``, the same plan continued after
a kill -9, and the model's plan text shown bounded, inert and without secrets."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.delivery.plan import PLAN_PART
from gateway.delivery.reply import SENDING
from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.gateway_rig import daemon_rows, turns_settled
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

    await turns_settled(slack_daemon.config["storage"])  # ended, so /plan says "as left"
    # The journal marks the turn done before its last steps here (the done reaction, releasing
    # it), which a loaded machine can stretch past a /plan: asked again until the turn is over
    # in the daemon too (CI once saw the first /plan still counting the turn as running).
    shown: list[str] = []
    for _ in range(5):
        await slack.inject_dm(DM, FRIEND, "/plan")
        with contextlib.suppress(AssertionError):
            shown = await slack.wait_for(
                lambda: [t for t in slack.texts(DM) if "last answer left it" in t] or None, timeout=4
            )
            break
    assert shown, slack.texts(DM)
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


@pytest.mark.parametrize("cancel", ["/stop", "never mind, something else"])
async def test_a_paused_plan_whose_approval_is_cancelled_ends_marked_not_done(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, cancel: str
) -> None:
    """A turn paused for an approval keeps its live checklist; cancelling the request (``/stop``, or a
    newer message) closes the checklist as unfinished in the same message, and the gated call never runs."""
    model.script(
        plan("completed:fetch the page", "in_progress:summarise it", "pending:send it"),
        Reply(tool_calls=[ToolCall("web_fetch", {"url": "https://example.org/"})]),
        Reply(text="Something else, then."),  # the newer message's own turn
    )
    agent = {**NO_MEMORY, "approvals": {"tools": ["web_fetch"], "timeout": 600}}
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[str(OWNER)], agent=agent)
    async with started_daemon(tmp_path, cfg) as d:
        up = tg.inject_message(OWNER, OWNER, "summarise the page")
        mid = up["message"]["message_id"]
        await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(OWNER) if tg.buttons(OWNER, m.message_id)), None),
            timeout=30,
            what="the approval buttons",
        )
        for _ in range(600):  # the turn has paused (not merely asked): the cancel finds it waiting
            if 'chital_turns_total{outcome="waiting"} 1.0' in await d.metrics():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the turn never paused")
        live = checklists_tg(tg, mid)
        assert len(live) == 1 and "◐" in live[0].text, "paused: the checklist stays live"
        tg.inject_message(OWNER, OWNER, cancel)
        lists = await tg.wait_for(
            lambda: [m for m in checklists_tg(tg, mid) if "not finished" in m.text] or None,
            timeout=20,
            what="the checklist's final state after the cancel",
        )
        await tg.wait_for(
            lambda: any("Not run: the request was cancelled" in m.text for m in replies_to(tg, OWNER, mid)),
            timeout=20,
            what="the paused reply closed as cancelled",
        )
    assert "1 of 3 steps done" in lists[0].text and "◐" not in lists[0].text
    assert lists[0].text.count("(not done)") == 2
    assert len(checklists_tg(tg, mid)) == 1, "closed in place, not posted again"
    assert not any("example.org" in r for r in tool_results(model)), "the gated call never ran"


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


async def test_a_turn_given_up_after_its_last_attempt_ends_its_checklist_not_done(
    tg_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Killed three times mid-plan: the fourth start gives the turn up with a note, and the
    checklist the first run posted is closed from the checkpoint's plan, not left "in progress"."""
    holds = [asyncio.Event() for _ in range(3)]
    model.script(
        plan("completed:open the file", "in_progress:parse it", "pending:report on it"),
        *(Reply(text="never seen", hold=held) for held in holds),
    )
    up = tg.inject_message(OWNER, OWNER, "parse my file")
    mid = up["message"]["message_id"]
    await tg.wait_for(lambda: checklists_tg(tg, mid) or None, timeout=30, what="the checklist")
    # Killed before its message id is recorded, the checklist is a send whose answer was lost
    # (a Telegram send has no key): nothing can close it later. CI hit that window under load.
    await _until_recorded(tg_daemon.config["storage"])
    try:
        for run, held in enumerate(holds):
            await tg.wait_for(
                lambda n=run: len(model.requests) >= n + 2 or None,
                timeout=40,
                what=f"model call of run {run + 1}",
            )
            tg_daemon.kill9()
            await tg_daemon.wait_exit()
            held.set()
            await tg_daemon.start()
        await answered(tg, OWNER, up, "could not finish this answer after several tries", timeout=40)
    finally:
        for held in holds:
            held.set()
    lists = await tg.wait_for(
        lambda: [m for m in checklists_tg(tg, mid) if "not finished" in m.text] or None,
        timeout=30,
        what="the checklist's final state after the turn was given up",
    )
    assert "1 of 3 steps done" in lists[0].text and "◐" not in lists[0].text
    assert lists[0].text.count("(not done)") == 2
    assert len(checklists_tg(tg, mid)) == 1, "closed in place, not posted again"


async def test_a_parked_reply_closes_its_checklist_when_it_is_delivered(
    tg_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The platform goes down as the answer is ready: the reply is parked, and when it finally goes
    out the checklist goes to its final state with it, in the same message."""
    held = asyncio.Event()
    model.script(
        plan("completed:look it up", "in_progress:write it down"),
        Reply(text="Here is what I found.", hold=held),
        Reply(text="Here is what I found."),  # should the retried turn ask the model again
    )
    up = tg.inject_message(OWNER, OWNER, "find it for me")
    mid = up["message"]["message_id"]
    try:
        await tg.wait_for(lambda: checklists_tg(tg, mid) or None, timeout=30, what="the checklist")
        await tg.wait_for(lambda: len(model.requests) >= 2 or None, timeout=15, what="the second model call")
        tg.down_methods |= {"sendMessage", "editMessageText", "sendChatAction", "setMessageReaction"}
        held.set()
        for _ in range(600):  # parked: the daemon counts a delivery retry
            if "chital_delivery_retries_total{" in await tg_daemon.metrics():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the reply was never parked")
        assert not [m for m in checklists_tg(tg, mid) if "not finished" in m.text], "still live while down"
    finally:
        held.set()
        tg.down_methods.clear()
    await answered(tg, OWNER, up, "Here is what I found.", timeout=60)
    lists = await tg.wait_for(
        lambda: [m for m in checklists_tg(tg, mid) if "not finished" in m.text] or None,
        timeout=15,
        what="the checklist's final state once the parked reply went out",
    )
    assert "1 of 2 steps done" in lists[0].text and "◐" not in lists[0].text
    assert len(checklists_tg(tg, mid)) == 1
    assert len([m for m in replies_to(tg, OWNER, mid) if "Here is what I found." in m.text]) == 1


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
    """Until the daemon's outbox holds the checklist's message id (part PLAN_PART); not the mark
    written before the send (``SENDING``): a kill then is the send window, and it posts anew."""
    sql = "SELECT message_id FROM outbox WHERE part = ? AND message_id != ?"
    for _ in range(int(timeout / 0.05)):
        if await asyncio.to_thread(daemon_rows, storage, sql, (PLAN_PART, SENDING)):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the checklist's message id was never recorded")
