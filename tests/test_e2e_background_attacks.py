"""Background tasks attacked end to end (docs/background-tasks.md, "Faults and untrusted input"):
`chital run` against the fake Telegram and the fake model. What the user sees in the chat and what
the model was asked are asserted; each test is a hole a hostile review found."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.canary_server import Canary
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import replies_to

OWNER = 1001


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    cfg = chat_config(
        tmp_path,
        model.base_url,
        tg,
        allow=[str(OWNER)],
        agent={
            "memory": {"enabled": False},
            "web": {"allow_hosts": ["127.0.0.1"]},
            "approvals": {"tools": ["execute"], "timeout": 600},
        },
    )
    async with started_daemon(tmp_path, cfg) as d:
        yield d


async def reply(tg: FakeTelegram, update: dict[str, Any], needle: str) -> Any:
    mid = update["message"]["message_id"]

    def check() -> Any:
        return next((m for m in replies_to(tg, OWNER, mid) if needle in m.text), None)

    return await tg.wait_for(check, timeout=30, what=f"reply with {needle!r}")


async def test_a_task_started_after_reading_a_web_page_carries_that_taint_to_its_lasting_actions(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI, canary: Canary
) -> None:
    """Provenance of lasting actions: the lead agent read a web page, then started a task. The
    task's own turn must count as having read it too: its approval request (a lasting action's
    gate) tells the owner it asks after reading content they did not write, and names the page."""
    url = f"http://127.0.0.1:{canary.port}/page"

    def brain(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        text = last_user_text(body)
        if last.get("role") == "tool":
            content = str(last.get("content"))
            if "chital_secret_metric" in content:  # the page was read: hand the work to a task
                return Reply(tool_calls=[ToolCall("start_background_task", {"task": "BGJOB run the check"})])
            return Reply(text=f"Done: {content[:200]}")
        if "BGJOB" in text:  # the task's agent: asks for a call that needs the owner's approval
            return Reply(tool_calls=[ToolCall("execute", {"command": "echo bg-run"})])
        if "read http" in text:
            return Reply(tool_calls=[ToolCall("web_fetch", {"url": url})])
        return Reply(text=f"echo: {text}")

    model.add_rule(lambda _t: True, brain)
    ask = tg.inject_message(OWNER, OWNER, f"please read {url}")
    await reply(tg, ask, "Done: Started background task #1")

    def buttons() -> Any:
        return next((m for m in tg.bot_messages(OWNER) if "Approve" in str(m.raw.get("reply_markup"))), None)

    request = await tg.wait_for(buttons, timeout=30, what="the task's approval request")
    assert "after reading content you did not write" in request.text, request.text
    assert f"127.0.0.1:{canary.port}" in request.text, request.text


async def test_tasks_stop_while_the_result_is_being_sent_says_it_is_too_late_not_stopping(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Faults at the worst moment: `/tasks stop` lands while the task's result is going out. The
    result is not cut (an answer is never stopped halfway), so the user must not be told it is
    stopping, and `/tasks` must not call a task that delivered its result "stopped": one outcome."""
    model.add_rule(lambda t: "LATEJOB" in t, Reply(text="LATEJOB-RESULT all done"))
    model.add_rule(lambda _t: True, Reply(text="ok"))
    held = tg.hold_answer("sendMessage", lambda p: "LATEJOB-RESULT" in str(p.get("text")))
    ask = tg.inject_command(OWNER, OWNER, "bg", "LATEJOB sum the numbers", chat_type="private")
    await reply(tg, ask, "LATEJOB-RESULT")  # in the chat; the bot still waits for the platform's answer
    stop = tg.inject_command(OWNER, OWNER, "tasks", "stop 1", chat_type="private")
    said = await reply(tg, stop, "#1")
    held.set()
    assert "Stopping" not in said.text and "too late to stop it" in said.text, said.text
    listing = await reply(tg, tg.inject_command(OWNER, OWNER, "tasks", "", chat_type="private"), "Background")
    assert "#1 ✅ finished" in listing.text or "#1 ⏳" in listing.text, listing.text
    assert "stopped by" not in listing.text, listing.text


async def test_tasks_stop_with_a_number_out_of_range_says_the_range_not_the_digits(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Specific errors: `/tasks stop 0` or a number too large for any task is written in the
    digits 0-9 already; the answer says which numbers exist (as /schedules does), and a mistyped
    one still says how to write it."""
    for typed in ("0", "99999999999999999999999", "#9223372036854775808", "#0"):
        update = tg.inject_command(OWNER, OWNER, "tasks", f"stop {typed}", chat_type="private")
        said = await reply(tg, update, "not a task number")
        assert said.text == f"{typed} is not a task number: they run from 1 to 9223372036854775807.", (
            said.text
        )
    update = tg.inject_command(OWNER, OWNER, "tasks", "stop ٣", chat_type="private")
    said = await reply(tg, update, "not a task number")
    assert said.text.endswith("is not a task number: write it in the digits 0-9, like 3."), said.text


async def test_a_task_can_schedule_and_the_firing_runs_in_the_chat_not_as_the_task(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """A task's own lasting action: `/bg` work that schedules a reminder. It used to be refused
    with a wrong error ("this conversation has moved on to a new thread"); the schedule is the
    chat's, and its firing is a firing (answered in the chat), not a rerun of the ended task."""

    def brain(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        text = last_user_text(body)
        if last.get("role") == "tool":
            return Reply(text=f"Done: {str(last.get('content'))[:120]}")
        if "[Scheduled task #1" in text:
            return Reply(text="FIRED-PING sent")
        if "SCHEDJOB" in text:
            return Reply(tool_calls=[ToolCall("schedule_task", {"text": "ping the team", "delay": "2s"})])
        return Reply(text=f"echo: {text}")

    model.add_rule(lambda _t: True, brain)
    ask = tg.inject_command(OWNER, OWNER, "bg", "SCHEDJOB remind the team", chat_type="private")
    done = await reply(tg, ask, "Done:")
    assert "Scheduled #1" in done.text, done.text
    await tg.wait_for(
        lambda: any("FIRED-PING sent" in m.text for m in tg.bot_messages(OWNER)),
        timeout=30,
        what="the firing",
    )
