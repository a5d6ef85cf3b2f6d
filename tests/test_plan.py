"""Plan mode's parts on their own: the graph the tool adds to, the plan events the stream carries
from untrusted shapes, and the checklist's text (bounded, inert, secrets masked before the cut).
The end-to-end behaviour is tests/test_e2e_plan.py."""

from __future__ import annotations

import json
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import TodoListMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.tools import tool

from agent.events import PlanItem, PlanUpdated
from agent.plan import MAX_ITEM_CHARS, MAX_ITEMS, PLAN_EVENT, PlanMode, plan_events, plan_of
from agent.redact import Redactor
from gateway.delivery.plan import BUDGET, plan_text


@tool
def other_tool(x: str) -> str:
    """Any tool: the agent of the test has a tool node either way."""
    return x


def test_plan_mode_adds_its_tool_and_no_graph_node() -> None:
    """Turns without a plan pay nothing for plan mode: no after-model node (a super-step and a
    checkpoint write per model call), only the tool and the prompt."""
    model = GenericFakeChatModel(messages=iter(()))
    with_plan = create_agent(model, [other_tool], middleware=[PlanMode()])
    without = create_agent(model, [other_tool])
    assert set(with_plan.get_graph().nodes) == set(without.get_graph().nodes)
    assert set(create_agent(model, [other_tool], middleware=[TodoListMiddleware()]).get_graph().nodes) > set(
        without.get_graph().nodes
    ), "the library's own middleware would add one (what this test guards against)"
    assert [t.name for t in PlanMode().tools] == ["write_todos"]


def test_plan_events_skip_what_is_not_a_plan() -> None:
    assert plan_events({"other": 1}) == []
    assert plan_events("text") == []
    assert plan_events({PLAN_EVENT: "not a list"}) == [PlanUpdated(())]
    part: dict[str, Any] = {
        PLAN_EVENT: [
            {"content": "ok", "status": "pending"},
            {"content": "bad status", "status": "done"},
            {"content": 7, "status": "pending"},
            "not a dict",
            {"content": "z" * 1000, "status": "completed"},
        ]
    }
    (event,) = plan_events(part)
    assert isinstance(event, PlanUpdated)
    assert event.items == (PlanItem("ok", "pending"), PlanItem("z" * MAX_ITEM_CHARS, "completed"))


def test_a_stored_plan_is_bounded_too() -> None:
    """A checkpoint written before the bounds (or by hand) still gives at most MAX_ITEMS items."""
    todos = [{"content": f"step {i}", "status": "pending"} for i in range(10_000)]
    assert len(plan_of({"todos": todos})) == MAX_ITEMS
    assert plan_of({}) == ()


def test_checklist_fits_one_message_of_every_platform() -> None:
    items = tuple(PlanItem("w" * MAX_ITEM_CHARS, "pending") for _ in range(MAX_ITEMS))
    for final in (False, True):
        text = plan_text(items, Redactor(), final=final)
        assert len(text) <= BUDGET
        assert "more" in text.splitlines()[-1]


def test_secret_is_masked_before_the_item_is_cut() -> None:
    """A secret straddling the cut would leave its first half unmasked if cut first."""
    secret = "tok-abcdefghijklmnopqrstuvwxyz0123456789"
    item = PlanItem("a" * 80 + secret, "pending")
    text = plan_text((item,), Redactor([secret]))
    assert secret[:15] not in text


def test_final_state_marks_every_unfinished_item() -> None:
    items = (PlanItem("one", "completed"), PlanItem("two", "in_progress"), PlanItem("three", "pending"))
    live = plan_text(items, Redactor())
    assert "(1/3 done)" in live and "◐ `two`" in live
    final = plan_text(items, Redactor(), final=True)
    assert "1 of 3 steps done" in final and "◐" not in final
    assert "☐ `two` (not done)" in final and "☐ `three` (not done)" in final and "☑ `one`" in final
    assert "all 1 steps done" in plan_text(items[:1], Redactor(), final=True)


def test_the_largest_checklist_is_one_message_on_all_four_platforms() -> None:
    """``Reply.show`` sends the first rendered part only: the checklist must never need two, and
    a hostile item stays inert in each platform's own formatting."""
    from channels.discord import render as discord
    from channels.lark import render as lark
    from channels.slack import render as slack
    from channels.telegram import render as telegram

    items = tuple(
        PlanItem("<!everyone> @here [x](https://evil.example) " + "w" * 150, "pending") for _ in range(25)
    )
    text = plan_text(items, Redactor(), final=True)
    for render in (discord.render, lark.render, slack.render, telegram.render_markdown):
        parts = render(text)
        assert len(parts) == 1, render
    (slack_part,) = slack.render(text)
    assert "<!everyone>" not in slack_part.text and "<https://evil" not in slack_part.text
    (tg_part,) = telegram.render_markdown(text)
    assert all(e["type"] in ("code", "bold") for e in (tg_part.payload or {}).get("entities", ()))


HOSTILE_ITEMS = (
    "@everyone @here <!channel> <!everyone> <!here|here> <@U123> <@&42> <#C1>",
    '<at id=all></at> <at user_id="ou_1">boss</at> <font color=red>x</font>',
    "[login](https://evil.example) <https://evil.example|click> https://evil.example/p",
    "<b>bold</b> <a href='https://evil.example'>a</a> **b** __u__ ~~s~~ ||spoiler|| ``` fence",
    "`tick` ``double`` \\`escaped",
    "zero\u200bwidth \u202eexe.txt\u202c \u2066iso\u2069 \ufeffbom \u00adshy",
    "key tok-SECRET-0123456789abcdefghij in the plan",
    "w" * 190,
)


def test_hostile_plan_items_are_inert_on_all_four_platforms() -> None:
    """Every class of hostile item text (mass and user mentions of each platform, Lark at-tags,
    Markdown and HTML injection, fence and backtick escapes, invisible and bidi characters, a
    secret by value, a very long item), rendered by each platform's own renderer as the checklist
    message is: no mention or link comes alive, the secret and the invisible characters are gone,
    each item stays one bounded code span."""
    from channels.discord import render as discord
    from channels.lark import render as lark
    from channels.slack import render as slack
    from channels.telegram import render as telegram

    secret = "tok-SECRET-0123456789abcdefghij"
    items = tuple(
        PlanItem(text, "in_progress" if i % 2 else "pending") for i, text in enumerate(HOSTILE_ITEMS)
    )
    for final in (False, True):
        text = plan_text(items, Redactor([secret]), final=final)
        assert secret not in text and "SECRET" not in text
        for ch in "\u200b\u202e\u202c\u2066\u2069\ufeff\u00ad":
            assert ch not in text, repr(ch)
        for line in text.splitlines()[1:]:  # one code span per item, bounded
            rest = line.partition(" ")[2]
            assert rest.startswith("`") and rest.count("`") == 2, line
            assert len(rest.split("`")[1]) <= 100, line

        (slack_part,) = slack.render(text)
        for live in ("<!channel>", "<!everyone>", "<!here", "<@U123>", "<@&42>", "<#C1>", "<https://"):
            assert live not in slack_part.text, live

        (lark_part,) = lark.render(text)
        card = json.loads(str((lark_part.payload or {})["content"]))["body"]["elements"][0]["content"]
        assert "<at " not in card and "<font" not in card and "<\u200bat" in card

        (discord_part,) = discord.render(text)
        for line in discord_part.text.splitlines()[1:]:
            assert line.split(" ", 1)[1].startswith("`"), line  # mentions only inside code spans

        (tg_part,) = telegram.render_markdown(text)
        kinds = {e["type"] for e in (tg_part.payload or {}).get("entities", ())}
        assert kinds <= {"code", "bold"}, kinds
