"""Plan mode end to end on the fake Discord and the fake Lark: `chital run` with the fake model
calling ``write_todos``. Asserted is what the user sees: one checklist message per turn (Discord's
2,000-character limit, Lark's cards), edited to its final "all N steps done" state, and ``/plan``."""

from __future__ import annotations

from pathlib import Path

from tests.daemon import chat_config, started_daemon
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

NO_MEMORY = {"memory": {"enabled": False}}
DC_FRIEND = "424242424242424242"
LARK_FRIEND, LARK_CHAT = "ou_friend", "oc_p2p"


def plan(*texts: str) -> Reply:
    """One model step that writes the plan: ``texts`` are "status:content"."""
    pairs = [t.split(":", 1) for t in texts]
    return Reply(
        tool_calls=[ToolCall("write_todos", {"todos": [{"content": c, "status": s} for s, c in pairs]})]
    )


def script(model: FakeOpenAI, answer: str) -> None:
    model.script(
        plan("in_progress:gather the figures", "pending:draw the chart", "pending:write the summary"),
        plan("completed:gather the figures", "in_progress:draw the chart", "pending:write the summary"),
        plan("completed:gather the figures", "completed:draw the chart", "completed:write the summary"),
        # the largest plan (25 long items) on the way: paced, it may or may not be shown live
        plan(*(f"completed:{i} " + "z" * 190 for i in range(25))),
        plan("completed:gather the figures", "completed:draw the chart", "completed:write the summary"),
        Reply(text=answer),
    )


async def test_discord_plan_is_one_message_edited_to_done_and_plan_shows_it(
    tmp_path: Path, dc: FakeDiscord, model: FakeOpenAI
) -> None:
    cfg = chat_config(tmp_path, model.base_url, dc, allow=[f"discord:{DC_FRIEND}"], agent=NO_MEMORY)
    async with started_daemon(tmp_path, cfg, dc):
        script(model, "Here is the report.")
        await dc.inject_dm(DC_FRIEND, "make me a report")
        await dc.wait_for(lambda: any("Here is the report." in m.content for m in dc.bot_messages()), 30)
        await dc.wait_for(
            lambda: any("all 3 steps done" in m.content for m in dc.bot_messages() if "📋" in m.content), 10
        )
        lists = [m for m in dc.bot_messages() if "📋" in m.content]
        assert len(lists) == 1, "one checklist message per turn"
        checklist = lists[0]
        assert checklist.edits >= 1, "sent once, then edited in place"
        assert (
            checklist.content.count("☑") == 3
            and "☐" not in checklist.content
            and "◐" not in checklist.content
        )
        for item in ("`gather the figures`", "`draw the chart`", "`write the summary`"):
            assert item in checklist.content, checklist.content
        assert len(dc.bot_messages()) == 2, "the checklist and the answer, nothing else"
        assert "write_todos" not in "".join(m.content for m in dc.bot_messages()), "no tool chatter"

        await dc.inject_dm(DC_FRIEND, "/plan")
        shown = await dc.wait_for(
            lambda: next((m for m in dc.bot_messages() if "(3/3 done)" in m.content), None), 15
        )
        assert shown is not checklist and shown.content.count("☑") == 3, "/plan answers on its own"


async def test_lark_plan_is_one_card_edited_to_done_and_plan_shows_it(
    tmp_path: Path, lark: FakeLark, model: FakeOpenAI
) -> None:
    cfg = chat_config(tmp_path, model.base_url, lark, allow=[f"lark:{LARK_FRIEND}"], agent=NO_MEMORY)
    async with started_daemon(tmp_path, cfg, lark):
        script(model, "Here is the report.")
        lark.inject_message(LARK_CHAT, LARK_FRIEND, "make me a report")
        await lark.wait_for_async(
            lambda f: any("Here is the report." in m.text for m in f.bot_messages(LARK_CHAT)) or None, 30
        )
        await lark.wait_for_async(
            lambda f: any("all 3 steps done" in m.text for m in f.bot_messages(LARK_CHAT)) or None, 10
        )
        lists = [m for m in lark.bot_messages(LARK_CHAT) if "📋" in m.text]
        assert len(lists) == 1, "one checklist message per turn"
        checklist = lists[0]
        assert checklist.edits >= 1, "sent once, then edited in place"
        assert any("◐" in json_text for json_text in checklist.history), "it was shown live first"
        assert checklist.text.count("☑") == 3 and "☐" not in checklist.text and "◐" not in checklist.text
        for item in ("gather the figures", "draw the chart", "write the summary"):
            assert item in checklist.text, checklist.text
        assert len(lark.bot_messages(LARK_CHAT)) == 2, "the checklist and the answer, nothing else"
        assert "write_todos" not in "".join(m.text for m in lark.bot_messages(LARK_CHAT))

        lark.inject_message(LARK_CHAT, LARK_FRIEND, "/plan")
        shown = await lark.wait_for_async(
            lambda f: next((m for m in f.bot_messages(LARK_CHAT) if "(3/3 done)" in m.text), None), 15
        )
        assert shown.message_id != checklist.message_id and shown.text.count("☑") == 3
