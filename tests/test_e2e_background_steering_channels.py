"""Background tasks and steering on Discord and Lark, end to end (docs/background-tasks.md,
docs/steering.md): the same code path as Telegram and Slack (tests/test_e2e_background.py,
tests/test_e2e_steering.py), through each platform's real SDK and wire-level fake. Asserted is
what the person reads: the chat is answered while a task works, ``/tasks`` lists it, its result
is one reply to the request; a steered message reaches the running turn as the user's own words
and gets its sign, not a second answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.turns.busy import ADDED
from tests.busy_support import (
    E2E,
    NO_MEMORY,
    QUEUED,
    STEER,
    TASK,
    TASK_ANSWER,
    asked,
    held_task,
    requests_with,
    two_calls,
)
from tests.daemon import chat_config, started_daemon
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.gateway_rig import until
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI, Reply

DC_USER = "424242424242424242"
LARK_USER, LARK_P2P = "ou_friend", "oc_p2p_friend"


def lark_text(m: Any) -> str:
    return str(m.text)


def discord_says(dc: FakeDiscord, needle: str, reply_to: str | None = None) -> list[Any]:
    return [
        m for m in dc.bot_messages() if needle in m.content and (reply_to is None or m.reply_to == reply_to)
    ]


def lark_says(lark: FakeLark, needle: str, parent: str | None = None) -> list[Any]:
    return [
        m
        for m in lark.bot_messages(LARK_P2P)
        if needle in lark_text(m) and (parent is None or m.parent_id == parent)
    ]


async def test_discord_bg_runs_while_the_dm_is_answered_and_reports_once(
    tmp_path: Path, dc: FakeDiscord, model: FakeOpenAI
) -> None:
    cfg = chat_config(tmp_path, model.base_url, dc, allow=[f"discord:{DC_USER}"], agent=NO_MEMORY)
    async with started_daemon(tmp_path, cfg, dc):
        held = held_task(model, "DCJOB", "Release notes drafted.")
        ask = await dc.inject_dm(DC_USER, "/bg DCJOB draft the release notes")
        await dc.wait_for(lambda: discord_says(dc, "Started background task #1") or None, timeout=E2E)
        await dc.wait_for(lambda: asked(model, "DCJOB") or None, timeout=E2E)
        await dc.inject_dm(DC_USER, "are you there")
        await dc.wait_for(lambda: discord_says(dc, "echo: are you there") or None, timeout=E2E)
        assert not held.is_set()
        await dc.inject_dm(DC_USER, "/tasks")
        await dc.wait_for(lambda: discord_says(dc, "#1 ⏳ running for") or None, timeout=E2E)
        held.set()
        (result,) = await dc.wait_for(lambda: discord_says(dc, "Release notes drafted.") or None, timeout=E2E)
        assert result.content.startswith("🧵 Background task #1:") and result.reply_to == ask
        assert len(discord_says(dc, "Release notes drafted.")) == 1


async def test_lark_bg_runs_while_the_chat_is_answered_and_reports_once(
    tmp_path: Path, lark: FakeLark, model: FakeOpenAI
) -> None:
    cfg = chat_config(tmp_path, model.base_url, lark, allow=[f"lark:{LARK_USER}"], agent=NO_MEMORY)
    async with started_daemon(tmp_path, cfg):
        held = held_task(model, "LARKJOB", "Travel plan ready.")
        ask = lark.inject_message(LARK_P2P, LARK_USER, "/bg LARKJOB plan the trip")
        await lark.wait_for_async(lambda f: lark_says(f, "Started background task #1") or None, E2E)
        await lark.wait_for_async(lambda _f: asked(model, "LARKJOB") or None, E2E)
        lark.inject_message(LARK_P2P, LARK_USER, "are you there")
        await lark.wait_for_async(lambda f: lark_says(f, "echo: are you there") or None, E2E)
        assert not held.is_set()
        lark.inject_message(LARK_P2P, LARK_USER, "/tasks")
        await lark.wait_for_async(lambda f: lark_says(f, "#1 ⏳ running for") or None, E2E)
        held.set()
        (result,) = await lark.wait_for_async(lambda f: lark_says(f, "Travel plan ready.") or None, E2E)
        assert lark_text(result).startswith("🧵 Background task #1:") and result.parent_id == ask.message_id
        assert len(lark_says(lark, "Travel plan ready.")) == 1


async def test_discord_steer_reaches_the_running_turn_and_says_so(
    tmp_path: Path, dc: FakeDiscord, model: FakeOpenAI
) -> None:
    first, second = two_calls(model, TASK, TASK_ANSWER)
    model.add_rule(lambda t: t.endswith(STEER), Reply(text=TASK_ANSWER, hold=second))
    cfg = chat_config(tmp_path, model.base_url, dc, allow=[f"discord:{DC_USER}"], agent=NO_MEMORY)
    cfg["channels"]["discord"]["busy_mode"] = "steer"
    async with started_daemon(tmp_path, cfg, dc):
        task = await dc.inject_dm(DC_USER, TASK)
        await until(lambda: requests_with(model, TASK), E2E, what="the task's first call")
        steer = await dc.inject_dm(DC_USER, STEER)
        await dc.wait_for(lambda: discord_says(dc, QUEUED, steer) or None, timeout=E2E)
        first.set()
        call = await until(lambda: requests_with(model, STEER), E2E, what="the second call, with the steer")
        said = [m for m in call[0]["messages"] if STEER in str(m.get("content"))]
        assert [(m["role"], m["content"]) for m in said] == [("user", STEER)]
        second.set()
        await dc.wait_for(lambda: discord_says(dc, TASK_ANSWER, task) or None, timeout=E2E)
        await dc.wait_for(
            lambda: [m.content for m in dc.bot_messages() if m.reply_to == steer] == [ADDED] or None,
            timeout=E2E,
        )
        assert len(discord_says(dc, TASK_ANSWER)) == 1, "one answer, the steer's sign is not a second"


async def test_lark_steer_reaches_the_running_turn_and_says_so(
    tmp_path: Path, lark: FakeLark, model: FakeOpenAI
) -> None:
    first, second = two_calls(model, TASK, TASK_ANSWER)
    model.add_rule(lambda t: t.endswith(STEER), Reply(text=TASK_ANSWER, hold=second))
    cfg = chat_config(tmp_path, model.base_url, lark, allow=[f"lark:{LARK_USER}"], agent=NO_MEMORY)
    cfg["channels"]["lark"]["busy_mode"] = "steer"
    async with started_daemon(tmp_path, cfg):
        task = lark.inject_message(LARK_P2P, LARK_USER, TASK)
        await until(lambda: requests_with(model, TASK), E2E, what="the task's first call")
        steer = lark.inject_message(LARK_P2P, LARK_USER, STEER)
        await lark.wait_for_async(lambda f: lark_says(f, QUEUED, steer.message_id) or None, E2E)
        first.set()
        call = await until(lambda: requests_with(model, STEER), E2E, what="the second call, with the steer")
        said = [m for m in call[0]["messages"] if STEER in str(m.get("content"))]
        assert [(m["role"], m["content"]) for m in said] == [("user", STEER)]
        second.set()
        await lark.wait_for_async(lambda f: lark_says(f, TASK_ANSWER, task.message_id) or None, E2E)
        await lark.wait_for_async(
            lambda f: (
                [lark_text(m) for m in f.bot_messages(LARK_P2P) if m.parent_id == steer.message_id] == [ADDED]
                or None
            ),
            E2E,
        )
        assert len(lark_says(lark, TASK_ANSWER)) == 1, "one answer, the steer's sign is not a second"
