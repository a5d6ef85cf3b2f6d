"""Hostile attacks on quiet schedules (gateway/turns/quiet.py, docs/schedules.md "Quiet runs"), end to
end: ``chital run`` with the fake Telegram server and the fake model, which calls the real schedule
tool and answers each firing as scripted.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.daemon import chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram

OWNER = 1001
DRESSED = ["**[silent]**", "`[silent]`", "\u200b[silent]\u200b", "\ufeff[SILENT]", "_[Silent]_",
           "```\n[silent]\n```", "*[silent]*\u2060"]  # fmt: skip
"""The whole answer is the token, dressed as models dress it: Markdown emphasis or code, invisible
characters (zero-width space, BOM, word joiner), another letter case."""


def brain(answers: list[str]) -> Callable[[dict[str, Any]], Reply]:
    """Schedules "check N" when asked to; answers the firing of "check N" with ``answers[N]``."""

    def reply(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        text = last_user_text(body)
        if last.get("role") == "tool":
            return Reply(text=f"Done: {str(last.get('content'))[:80]}")
        fired = re.search(r"\[Scheduled task #\d+.*?check (\d+)", text, re.S)
        if fired:
            return Reply(text=answers[int(fired.group(1))])
        asked = re.search(r"schedule check (\d+)", text)
        if asked:
            args = {"text": f"check {asked.group(1)}: say nothing when all is well", "delay": "2s"}
            return Reply(tool_calls=[ToolCall("schedule_task", args)])
        return Reply(text=f"echo: {text}")

    return reply


def fired(model: FakeOpenAI) -> int:
    return sum(
        1
        for b in model.requests
        if b["messages"][-1].get("role") == "user" and "[Scheduled task #" in last_user_text(b)
    )


async def test_a_token_dressed_in_markdown_or_invisible_characters_is_still_silent(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Untrusted text shown to people (class 2) and specific outcomes: a model that wraps the token
    in bold, backticks or a code block, or leaves a zero-width character beside it, meant "nothing
    to report". Before, the chat got a bare "[silent]" (rendered bold, as code, …) every run."""
    model.add_rule(lambda _text: True, brain(DRESSED))
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[str(OWNER)], agent={"memory": {"enabled": False}})
    async with started_daemon(tmp_path, cfg) as daemon:
        for n in range(len(DRESSED)):
            tg.inject_message(OWNER, OWNER, f"schedule check {n}")
        await tg.wait_for(lambda: fired(model) >= len(DRESSED), timeout=60, what="every firing")

        def ended() -> list[str]:  # the operator's log says how each run ended
            lines = daemon.logs().splitlines()
            return [ln for ln in lines if re.search(r"schedule #\d+ (ran silent|answered silent)", ln)]

        def posted() -> list[str]:  # what a run posted (everything else is a reply to the user)
            return [m.text for m in tg.bot_messages(OWNER) if m.reply_to is None]

        await tg.wait_for(
            lambda: len(ended()) + len(posted()) >= len(DRESSED) or None, timeout=60, what="every run's end"
        )
        await asyncio.sleep(1)
        assert posted() == [], posted()
        assert len(ended()) == len(DRESSED) and all("ran silent" in ln for ln in ended()), ended()
        tg.inject_command(OWNER, OWNER, "schedules", chat_type="private")
        listing = await tg.wait_for(
            lambda: next((t for t in tg.bot_texts(OWNER) if "Finished recently" in t), None),
            timeout=30,
            what="/schedules",
        )
        assert "posted" not in listing and listing.count("silent (nothing to report)") >= 3, listing
        assert not any("silent" in t.lower() for t in tg.bot_texts(OWNER) if "last run" not in t)
