"""Deferred tools end to end: `chital run` on Telegram and on Slack, a real stdio MCP server
(FastMCP, tests/fixtures/mcp_many_tools.py) with more tools than the model is shown, and the fake
model finding one with ``tool_search`` and calling it.

What is asserted is what the user sees (the tool's answer in the chat) and what the model saw
(the fake's recorded requests): no MCP tool schema in the turn's first request, the found tool's
schema (and only it) after the search, the search result quoted as data.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.tool_search import HEAD, TOOL_SEARCH
from tests.daemon import ChatFake, chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

FIXTURE = Path(__file__).parent / "fixtures" / "mcp_many_tools.py"
ASK = "TOOLSEARCH: what does ACME trade at?"
QUOTE = "ACME last traded at 42.17 USD (quote-id Q-7731)"
OWNER = 1001


def _config(tmp_path: Path, model: FakeOpenAI, fake: ChatFake, allow: str) -> dict[str, Any]:
    cfg = chat_config(tmp_path, model.base_url, fake, allow=[f"{fake.platform}:{allow}"])
    cfg["agent"]["memory"] = {"enabled": False}  # no background model calls in the recording
    cfg["agent"]["context"] = {"title": "off"}
    cfg["agent"]["approvals"] = {"tools": ["run_*"], "timeout": 600}
    cfg["agent"]["mcp"] = {
        "servers": {"many": {"command": sys.executable, "args": [str(FIXTURE), "--filler", "30"]}}
    }
    return cfg


def _results(body: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: str(m["content"]) for m in body.get("messages", []) if m.get("role") == "tool"}


def _names(body: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or []}


def _script(model: FakeOpenAI) -> None:
    def reply(body: dict[str, Any]) -> Reply:
        results = _results(body)
        if "q1" in results:
            return Reply(text=f"The server says: {results['q1']}")
        if "s1" in results:
            return Reply(tool_calls=[ToolCall("stock_quote", {"symbol": "acme"}, id="q1")])
        return Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "stock price quote"}, id="s1")])

    def probe(body: dict[str, Any]) -> Reply:
        if "p1" in _results(body):
            return Reply(tool_calls=[ToolCall("run_probe", {"target": "db.internal"}, id="r1")])
        return Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "probe a network target"}, id="p1")])

    model.add_rule(lambda text: text.startswith("TOOLSEARCH"), reply)
    model.add_rule(lambda text: text.startswith("PROBE"), probe)


def _check_requests(model: FakeOpenAI) -> None:
    turn = [r for r in model.requests if last_user_text(r).startswith("TOOLSEARCH")]
    first = next(r for r in turn if not _results(r))
    after_search = next(r for r in turn if set(_results(r)) == {"s1"})
    # Before the search: the core tools and tool_search, none of the server's 33 tools.
    assert TOOL_SEARCH in _names(first) and "execute" in _names(first)
    assert not {"stock_quote", "run_probe", "helpful_notes"} & _names(first)
    assert not any(n.startswith("records_") for n in _names(first))
    assert "33 tool(s) are not loaded" in str(first["tools"])
    # After it: the found tool's schema is sent, the others still are not.
    assert "stock_quote" in _names(after_search)
    assert not any(n.startswith("records_") for n in _names(after_search))
    assert _results(after_search)["s1"].startswith(HEAD)
    final = next(r for r in turn if "q1" in _results(r))
    assert QUOTE in _results(final)["q1"]


async def test_telegram_user_gets_the_answer_of_a_deferred_mcp_tool(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    _script(model)
    async with started_daemon(tmp_path, _config(tmp_path, model, tg, str(OWNER))):
        tg.inject_message(OWNER, OWNER, ASK)
        found: Callable[[], Any] = lambda: next(  # noqa: E731
            (m for m in tg.bot_messages(OWNER) if QUOTE in m.text), None
        )
        await tg.wait_for(found, timeout=60, what="the quote in the bot's reply")
        _check_requests(model)
        # A found tool that the approval policy names still waits for a person's yes.
        tg.inject_message(OWNER, OWNER, "PROBE db.internal please")
        ask = await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(OWNER) if tg.buttons(OWNER, m.message_id)), None),
            timeout=60,
            what="the approval buttons",
        )
        assert "run_probe" in ask.text
    assert not any("r1" in _results(r) for r in model.requests), "the gated tool ran unapproved"


async def test_slack_user_gets_the_answer_of_a_deferred_mcp_tool(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    _script(model)
    async with started_daemon(tmp_path, _config(tmp_path, model, slack, "U_FRIEND"), slack):
        await slack.inject_dm("D_FRIEND", "U_FRIEND", ASK)
        await slack.wait_for(lambda: [t for t in slack.texts("D_FRIEND") if QUOTE in t], timeout=60)
    _check_requests(model)
