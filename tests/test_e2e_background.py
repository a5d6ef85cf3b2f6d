"""Background tasks end to end: `chital run` against the fake Telegram, the fake Slack and the fake
model (docs/background-tasks.md). Asserted is what people see in the chat and what the model was
asked: ``/bg`` and the agent's ``start_background_task`` start a task that works while the chat is
answered; ``/tasks`` lists it with its progress, its text inert and masked; the result is a reply to
the request, once, also across a kill -9; ``/tasks stop`` is its owner's or an admin's; the per-user
cap refuses with a note; a revoked owner's task ends without a word; ``/stop`` leaves tasks alone."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.busy_support import NO_MEMORY, asked, held_task
from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.gateway_rig import daemon_rows, until
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.slack_daemon import DM, FRIEND
from tests.telegram_daemon import replies_to

ADMIN = 1001
MEMBER = 1002
OTHER = 1003
STRANGER = 6666
GROUP = -100500600
SECRET = "sk-test-backgroundsecret-9f8e7d6c5b4a"


def tg_config(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, **sections: Any) -> dict[str, Any]:
    sections.setdefault("agent", NO_MEMORY)
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[str(MEMBER), str(OTHER)], **sections)
    cfg["access"].update(admins=[str(ADMIN)], pairing=True, group_policy="mention")
    cfg["models"][0]["api_key"] = SECRET  # a secret of the daemon's: never shown in chat
    return cfg


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, tg_config(tmp_path, tg, model)) as d:
        yield d


def say(tg: FakeTelegram, user: int, text: str, chat: int | None = None) -> dict[str, Any]:
    chat = user if chat is None else chat
    kind = "private" if chat == user else "supergroup"
    if text.startswith("/"):
        name, _, args = text[1:].partition(" ")
        return tg.inject_command(chat, user, name, args, chat_type=kind, at=None if kind == "private" else "")
    if kind != "private":
        return tg.inject_mention(chat, user, text)
    return tg.inject_message(chat, user, text)


async def reply(tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str, timeout: float = 20) -> Any:
    """The bot's message replying to ``update`` once it shows ``needle``."""
    mid = update["message"]["message_id"]

    def check() -> Any:
        return next((m for m in replies_to(tg, chat, mid) if needle in m.text), None)

    return await tg.wait_for(check, timeout=timeout, what=f"reply with {needle!r}")


async def task_row(daemon: DaemonProcess, task: int) -> tuple[Any, ...] | None:
    """(why it ended, its journal state) of task ``task``, read from the daemon's database."""
    sql = "SELECT t.ended, j.state FROM background_tasks t JOIN journal j ON j.key = t.key WHERE t.id = ?"
    rows = await asyncio.to_thread(daemon_rows, daemon.config["storage"], sql, (task,))
    return rows[0] if rows else None


async def settled(daemon: DaemonProcess, task: int) -> str:
    """The journal state of task ``task`` once it is no longer open (its answer goes out before
    its entry is marked done)."""

    async def closed() -> str | None:
        row = await task_row(daemon, task)
        return str(row[1]) if row and row[1] not in ("pending", "running") else None

    return str(await until(closed, 20, f"task #{task} to finish"))


# -- /bg: the chat stays free, the result is a reply to the request --------------------------------
async def test_bg_runs_while_the_chat_is_answered_and_reports_once_as_a_reply(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    held = held_task(model, "BGJOB", "The report is compiled: 42 rows.")
    ask = say(tg, MEMBER, "/bg BGJOB compile the quarterly report")
    started = await reply(tg, MEMBER, ask, "Started background task #1")
    assert "/tasks stop 1" in started.text and started.spans("code") == ["BGJOB compile the quarterly report"]
    await tg.wait_for(lambda: asked(model, "BGJOB") or None, what="the task's model call")

    chat = say(tg, MEMBER, "what is the capital of France")
    await reply(tg, MEMBER, chat, "echo: what is the capital of France")  # while the task still runs
    assert not held.is_set()

    listing = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    assert "1 running" in listing.text and "#1 ⏳ running for" in listing.text, listing.text
    assert "0 step(s)" in listing.text, "progress: the steps its thread has taken so far"
    assert "BGJOB compile the quarterly report" in listing.spans("code")

    held.set()
    result = await reply(tg, MEMBER, ask, "The report is compiled")
    assert result.text.startswith("🧵 Background task #1:"), result.text
    request = asked(model, "BGJOB")[0]
    text = last_user_text(request)
    assert "[Background task #1" in text and text.endswith("BGJOB compile the quarterly report")
    assert "what is the capital" not in json.dumps(request["messages"]), "its own thread, not the chat's"

    assert await settled(daemon, 1) == "done"
    done = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    assert "#1 ✅ finished" in done.text and "0 running" in done.text
    results = [m for m in replies_to(tg, MEMBER, ask["message"]["message_id"]) if "42 rows" in m.text]
    assert len(results) == 1
    assert len(asked(model, "BGJOB")) == 1


async def test_the_agent_starts_a_background_task_with_its_tool_on_the_lead_only(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The chat's turn calls ``start_background_task`` and answers at once; the task's own agent
    may not start another (no fan-out), and works from the user's words quoted with the task."""

    def task(body: dict[str, Any]) -> Reply:
        if body["messages"][-1].get("role") == "tool":
            return Reply(text="Market study: three competitors found.")
        return Reply(tool_calls=[ToolCall("start_background_task", {"task": "TOOLJOB nested"})])

    def chat(body: dict[str, Any]) -> Reply:
        if body["messages"][-1].get("role") == "tool":
            return Reply(text="I started that in the background.")
        return Reply(tool_calls=[ToolCall("start_background_task", {"task": "TOOLJOB study the market"})])

    model.add_rule(lambda t: "TOOLJOB" in t, task)  # first: the task's message quotes the user's too
    model.add_rule(lambda t: "please research" in t, chat)
    ask = say(tg, MEMBER, "please research the market for me")
    await reply(tg, MEMBER, ask, "I started that in the background.")
    result = await reply(tg, MEMBER, ask, "three competitors found")
    assert result.text.startswith("🧵 Background task #1:")

    first = asked(model, "TOOLJOB")[0]
    text = last_user_text(first)
    assert "> please research the market for me" in text and text.endswith("TOOLJOB study the market")
    tools = [t["function"]["name"] for t in first.get("tools", [])]
    assert "start_background_task" in tools, "the lead agent has the tool"
    refused = [
        m["content"] for b in asked(model, "TOOLJOB") for m in b["messages"] if m.get("role") == "tool"
    ]
    assert any("background task already" in str(c) for c in refused), refused
    assert await settled(daemon, 1) == "done"
    listing = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    assert "#1 ✅ finished" in listing.text and "#2" not in listing.text


async def test_tasks_stop_is_the_owners_or_an_admins_and_slash_stop_leaves_tasks_alone(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    held = held_task(model, "STOPJOB", "STOPJOB result that must never show")
    ask = say(tg, MEMBER, "/bg STOPJOB crunch the numbers", GROUP)
    await reply(tg, GROUP, ask, "Started background task #1")
    await tg.wait_for(lambda: asked(model, "STOPJOB") or None, what="the task's model call")

    stop = await reply(tg, GROUP, say(tg, MEMBER, "/stop", GROUP), "Nothing is running")
    assert "/tasks stop" in stop.text, "/stop says background tasks go on and how to stop one"
    not_yours = await reply(tg, GROUP, say(tg, OTHER, "/tasks stop 1", GROUP), "Only")
    assert not_yours.text == "Only telegram:1002, who started #1, or an admin can stop it."
    assert not_yours.spans("code") == ["telegram:1002"]
    await reply(tg, GROUP, say(tg, MEMBER, "/tasks stop 99", GROUP), "There is no background task #99")
    bad = await reply(tg, GROUP, say(tg, MEMBER, "/tasks stop ²", GROUP), "is not a task number")
    assert "digits 0-9" in bad.text
    still = await reply(tg, GROUP, say(tg, MEMBER, "/tasks", GROUP), "Background tasks here")
    assert "1 running" in still.text

    await reply(tg, GROUP, say(tg, ADMIN, "/tasks stop 1", GROUP), "⏹ Stopping background task #1.")
    await reply(tg, GROUP, ask, "⏹ Stopped.")
    held.set()
    listing = await reply(tg, GROUP, say(tg, MEMBER, "/tasks", GROUP), "Background tasks here")
    assert "#1 ⏹ stopped by telegram:1001" in listing.text, listing.text
    again = await reply(tg, GROUP, say(tg, MEMBER, "/tasks stop 1", GROUP), "already ended")
    assert "stopped by telegram:1001" in again.text
    await reply(tg, GROUP, say(tg, MEMBER, "a sync point", GROUP), "echo: a sync point")
    assert not any("must never show" in m.text for m in tg.bot_messages(GROUP))


async def test_the_per_user_cap_refuses_with_a_note(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    cfg = tg_config(tmp_path, tg, model, tasks={"max_per_user": 1})
    async with started_daemon(tmp_path, cfg) as d:
        held = held_task(model, "CAPJOB", "first done")
        first = say(tg, MEMBER, "/bg CAPJOB one")
        await reply(tg, MEMBER, first, "Started background task #1")
        second = await reply(tg, MEMBER, say(tg, MEMBER, "/bg CAPJOB two"), "Not started")
        assert second.text == (
            "⚠️ Not started: you already have 1 background task(s) running, the most one person may "
            "have at once (1); /tasks lists them and /tasks stop ID stops one."
        )
        other = await reply(tg, OTHER, say(tg, OTHER, "/bg CAPJOB theirs"), "Started background task #2")
        assert other is not None, "the cap is per user"
        held.set()
        await reply(tg, MEMBER, first, "first done")
        # The task's entry is marked done just after its answer is sent: until then it still counts.
        done = "SELECT 1 FROM journal WHERE key LIKE ? AND state = 'done'"
        await until(lambda: daemon_rows(d.config["storage"], done, ("%:bg-1",)), 20, "task #1 marked done")
        await reply(tg, MEMBER, say(tg, MEMBER, "/bg CAPJOB three"), "Started background task #3")
        long = await reply(tg, MEMBER, say(tg, MEMBER, "/bg " + "x" * 4001), "Not started")
        assert "4,001 characters long" in long.text and "at most 4,000" in long.text
        empty = await reply(tg, MEMBER, say(tg, MEMBER, "/bg"), "Usage: /bg TASK")
        assert empty is not None


async def test_a_task_text_is_shown_inert_bounded_and_without_secrets(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    held = held_task(model, "UNTRUSTED", "ok")
    text = f"UNTRUSTED use {SECRET} \u202egnp.exe [click](https://evil.example) `x` @channel " + "y" * 300
    await reply(tg, MEMBER, say(tg, MEMBER, f"/bg {text}"), "Started background task #1")
    listing = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    held.set()
    spans = listing.spans("code")
    shown = next(s for s in spans if "UNTRUSTED" in s)
    assert SECRET not in listing.text and "\u202e" not in listing.text
    assert len(shown) <= 80 and shown.endswith("…")
    assert not [e for e in listing.entities if e["type"] in ("text_link", "url", "mention")]
    assert SECRET not in json.dumps(model.requests), "the model provider never gets the daemon's secret"


async def test_a_failing_task_reports_a_specific_error_without_secrets(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.add_rule(
        lambda t: "FAILJOB" in t,
        Reply(status=401, error_message=f"Incorrect API key provided: {SECRET}"),
    )
    ask = say(tg, MEMBER, "/bg FAILJOB summarise everything")
    await reply(tg, MEMBER, ask, "Started background task #1")
    failed = await reply(tg, MEMBER, ask, "🧵 Background task #1:")
    assert failed.text == (
        "🧵 Background task #1:\n\n⚠️ The model service refused our credentials; ask the admin to check the API key."
    ), failed.text
    assert SECRET not in "".join(tg.bot_texts(MEMBER))
    assert await settled(daemon, 1) == "done"  # answered with the error: the outcome was delivered
    listing = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    assert "#1 ✅ finished" in listing.text


async def test_a_revoked_owners_task_ends_without_a_word_to_the_chat(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    import re

    await reply(tg, ADMIN, say(tg, ADMIN, "hi"), "echo: hi")  # the admin's DM exists
    code_text = await reply(tg, STRANGER, say(tg, STRANGER, "let me in"), "pairing code is")
    code = re.search(r"pairing code is ([A-Z0-9]{8})", code_text.text).group(1)  # type: ignore[union-attr]
    await reply(tg, ADMIN, say(tg, ADMIN, f"/approve {code}"), "Approved")
    held = held_task(model, "REVOKEJOB", "REVOKEJOB secret findings")
    ask = say(tg, STRANGER, "/bg REVOKEJOB dig up the findings")
    await reply(tg, STRANGER, ask, "Started background task #1")
    await tg.wait_for(lambda: asked(model, "REVOKEJOB") or None, what="the task's model call")
    await reply(tg, ADMIN, say(tg, ADMIN, f"/revoke {STRANGER}"), "Revoked")
    held.set()
    assert await settled(daemon, 1) == "done"
    assert await task_row(daemon, 1) == ("its owner may no longer use the bot here", "done")
    assert not any("secret findings" in m.text for m in tg.bot_messages(STRANGER))
    assert not any("secret findings" in t for _, _, t in tg.drafts)


# -- a crash in the middle ------------------------------------------------------------------------------
def todos(*items: tuple[str, str]) -> Reply:
    return Reply(
        tool_calls=[ToolCall("write_todos", {"todos": [{"content": c, "status": s} for c, s in items]})]
    )


async def test_kill9_mid_task_resumes_it_and_it_reports_once(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    held = asyncio.Event()
    model.script(
        todos(("collect the logs", "in_progress"), ("summarise them", "pending")),
        Reply(text="never seen", hold=held),  # the daemon dies while the task's model "thinks"
        todos(("collect the logs", "completed"), ("summarise them", "completed")),
        Reply(text="Summary: 3 errors, all from the cache."),
    )
    ask = say(tg, MEMBER, "/bg KILLJOB summarise the logs")
    await reply(tg, MEMBER, ask, "Started background task #1")
    await tg.wait_for(
        lambda: len(model.requests) >= 2 or None, timeout=30, what="the task's second model call"
    )
    listing = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    assert "2 step(s), plan 0/2 done" in listing.text, listing.text
    storage = daemon.config["storage"]
    key = f"telegram:{MEMBER}:bg-1"
    sql = "SELECT j.state, o.message_id FROM journal j JOIN outbox o ON o.key = j.key WHERE j.key = ?"

    async def recorded() -> bool:  # the task runs and its checklist's message id is recorded
        rows = await asyncio.to_thread(daemon_rows, storage, sql, (key,))
        return any(state == "running" and mid for state, mid in rows)

    await until(recorded, 20, "the task running with its checklist recorded")
    before = len(model.requests)
    daemon.kill9()
    await daemon.wait_exit()
    held.set()
    await daemon.start()

    result = await reply(tg, MEMBER, ask, "Summary: 3 errors", timeout=40)
    assert result.text.startswith("🧵 Background task #1:")
    mid = ask["message"]["message_id"]
    shown = [m.text for m in replies_to(tg, MEMBER, mid)]
    print("what the user saw, replying to their /bg:", *shown, sep="\n  ")
    assert sum("Summary: 3 errors" in t for t in shown) == 1, "reported once"
    assert sum("Started background task" in t for t in shown) == 1, "started once"
    assert sum("KILLJOB" in json.dumps(b["messages"][-1]) for b in model.requests) == 1, (
        "the task continued from its checkpoint; it did not start over"
    )
    assert "collect the logs" in json.dumps(model.requests[before]["messages"])
    assert await settled(daemon, 1) == "done"
    done = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    assert "#1 ✅ finished" in done.text and "0 running" in done.text


# -- Slack -------------------------------------------------------------------------------------------------
async def test_slack_bg_runs_while_the_dm_is_answered_and_reports_once(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    cfg = chat_config(tmp_path, model.base_url, slack, allow=[f"slack:{FRIEND}"], agent=NO_MEMORY)
    async with started_daemon(tmp_path, cfg, slack):
        held = held_task(model, "SLACKJOB", "Deploy checklist written.")
        ask = await slack.inject_dm(DM, FRIEND, "/bg SLACKJOB write the deploy checklist")
        await slack.wait_for(lambda: any("Started background task #1" in t for t in slack.texts(DM)) or None)
        await slack.wait_for(lambda: asked(model, "SLACKJOB") or None)
        await slack.inject_dm(DM, FRIEND, "are you there")
        await slack.wait_for(lambda: any("echo: are you there" in t for t in slack.texts(DM)) or None)
        assert not held.is_set()
        await slack.inject_dm(DM, FRIEND, "/tasks")
        await slack.wait_for(lambda: any("#1 ⏳ running for" in t for t in slack.texts(DM)) or None)
        held.set()
        await slack.wait_for(lambda: any("Deploy checklist written." in t for t in slack.texts(DM)) or None)
        results = [p for p in slack.posts if p.channel == DM and "Deploy checklist written." in p.text]
        assert len(results) == 1 and results[0].text.startswith("🧵 Background task #1:")
        assert results[0].thread_ts in (None, ask.ts), "in the DM, or threaded under the request"


async def test_a_spent_budget_refuses_a_task_and_forget_ends_the_owners_tasks(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    cfg = tg_config(tmp_path, tg, model, usage={"users": {f"telegram:{OTHER}": 1}})
    async with started_daemon(tmp_path, cfg):
        await reply(tg, OTHER, say(tg, OTHER, "spend it"), "echo: spend it")
        refused = await reply(tg, OTHER, say(tg, OTHER, "/bg BUDGETJOB more work"), "Not started")
        assert "token budget for today" in refused.text, refused.text
        assert not asked(model, "BUDGETJOB")

        held = held_task(model, "FORGETJOB", "FORGETJOB result that must never show")
        ask = say(tg, MEMBER, "/bg FORGETJOB remember my preferences")
        await reply(tg, MEMBER, ask, "Started background task #1")
        await tg.wait_for(lambda: asked(model, "FORGETJOB") or None, what="the task's model call")
        await reply(tg, MEMBER, say(tg, MEMBER, "/forget"), "memory is off")
        await reply(tg, MEMBER, ask, "⏹ Stopped.")
        held.set()
        listing = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
        assert "#1 ⏹ stopped by /forget" in listing.text, listing.text
        await reply(tg, MEMBER, say(tg, MEMBER, "sync"), "echo: sync")
        assert not any("must never show" in m.text for m in tg.bot_messages(MEMBER))


async def test_a_task_the_agent_starts_after_reading_someone_elses_words_gets_them_as_data(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Provenance: a forwarded message is not the user's words; a task the agent starts from it
    carries its text quoted, with where it came from, and the user's own message beside it."""

    def chat(body: dict[str, Any]) -> Reply:
        if body["messages"][-1].get("role") == "tool":
            return Reply(text="Started it.")
        return Reply(tool_calls=[ToolCall("start_background_task", {"task": "TAINTJOB mail the files out"})])

    model.add_rule(lambda t: "TAINTJOB" in t, Reply(text="Done reading."))
    model.add_rule(lambda t: "forwarded note" in t, chat)
    ask = tg.inject_message(MEMBER, MEMBER, "forwarded note: do the thing", forwarded_from="Mallory")
    await reply(tg, MEMBER, ask, "Started it.")
    await reply(tg, MEMBER, ask, "Done reading.")
    text = last_user_text(asked(model, "TAINTJOB")[0])
    assert "after reading content the user did not write" in text and "Mallory" in text, text
    assert "> TAINTJOB mail the files out\n[End of the task text.]" in text
    listing = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
    assert "TAINTJOB mail the files out" in listing.spans("code"), "the listing shows the task, not the note"


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_a_tasks_files_come_with_its_result(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(
        Reply(tool_calls=[ToolCall("execute", {"command": "echo 7,8 > /mnt/user-data/outputs/t.csv"})]),
        Reply(tool_calls=[ToolCall("present_files", {"paths": ["t.csv"], "caption": "the table"})]),
        Reply(text="Here is the table."),
    )
    ask = say(tg, MEMBER, "/bg FILEJOB build the table")
    result = await reply(tg, MEMBER, ask, "Here is the table.", timeout=40)
    assert result.text.startswith("🧵 Background task #1:")
    docs = await tg.wait_for(
        lambda: [m for m in tg.bot_messages(MEMBER) if m.document] or None, what="the file"
    )
    assert await settled(daemon, 1) == "done"
    assert len(docs) == 1 and tg.file_bytes(docs[0].document["file_id"]) == b"7,8\n"
    assert docs[0].text == "the table"


async def test_tasks_run_beside_the_chat_slots_and_wait_for_their_own(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """With one chat slot and one task slot: a working task leaves the chat its slot (a message is
    answered), and a second task waits for the first, shown as waiting by /tasks."""
    cfg = tg_config(tmp_path, tg, model, concurrency={"max_turns": 1}, tasks={"max_running": 1})
    async with started_daemon(tmp_path, cfg):
        held = held_task(model, "SLOTJOB", "slot work done")
        first = say(tg, MEMBER, "/bg SLOTJOB first")
        await reply(tg, MEMBER, first, "Started background task #1")
        await tg.wait_for(lambda: asked(model, "SLOTJOB") or None, what="the first task's model call")
        await reply(tg, MEMBER, say(tg, MEMBER, "hello"), "echo: hello")  # the one chat slot is free
        second = say(tg, OTHER, "/bg SLOTJOB second")
        await reply(tg, OTHER, second, "Started background task #2")
        listing = await reply(tg, OTHER, say(tg, OTHER, "/tasks"), "Background tasks here")
        assert "#2 ⏳ waiting for a free slot (asked" in listing.text, listing.text
        assert len(asked(model, "SLOTJOB")) == 1, "the second task waits for the task slot"
        held.set()
        await reply(tg, MEMBER, first, "slot work done")
        await reply(tg, OTHER, second, "slot work done")


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_a_tasks_approval_is_asked_in_the_chat_and_the_task_goes_on_once_approved(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    agent = {**NO_MEMORY, "approvals": {"tools": ["execute"], "timeout": 600}}
    async with started_daemon(tmp_path, tg_config(tmp_path, tg, model, agent=agent)) as daemon:
        model.script(
            Reply(tool_calls=[ToolCall("execute", {"command": "echo approved-run"})]),
            Reply(text="Ran it: approved-run."),
        )
        ask = say(tg, MEMBER, "/bg APPROVEJOB run the check")
        request = await tg.wait_for(
            lambda: next(
                (m for m in tg.bot_messages(MEMBER) if "Approve" in str(m.raw.get("reply_markup"))), None
            ),
            what="the approval buttons",
        )
        assert await settled(daemon, 1) == "waiting", "parked a moment after the buttons are posted"
        listing = await reply(tg, MEMBER, say(tg, MEMBER, "/tasks"), "Background tasks here")
        assert "#1 🔐 waiting for approval" in listing.text, "paused on a person: not finished, not working"
        tg.press_button(MEMBER, request.message_id, MEMBER, "Approve")
        result = await reply(tg, MEMBER, ask, "Ran it: approved-run.", timeout=30)
        assert result.text.startswith("🧵 Background task #1:")
        assert await settled(daemon, 1) == "done"
