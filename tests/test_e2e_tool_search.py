"""Deferred tools end to end: `chital run` on Telegram and on Slack, a real stdio MCP server
(FastMCP, tests/fixtures/mcp_many_tools.py) with more tools than the model is shown, and the fake
model finding one with ``tool_search`` and calling it.

What is asserted is what the user sees (the tool's answer in the chat) and what the model saw
(the fake's recorded requests): no MCP tool schema in the turn's first request, the found tool's
schema (and only it) after the search, the search result quoted as data. A sub-agent gets the same
rule with its own ``tool_search`` (gated tools hidden from it: it cannot ask a person), and an
approval prompt of a deferred tool shows its arguments masked and escaped like a core tool's.
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
MODEL_KEY = "sk-test-key-never-logged"
"""The model API key of tests/daemon.py's base config: a secret the daemon knows."""
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
            target = f"db.internal {MODEL_KEY} \u202egpj.exe ``` @channel"
            return Reply(tool_calls=[ToolCall("run_probe", {"target": target}, id="r1")])
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
        assert "run_probe" in ask.text and "db.internal" in ask.text
        # Its arguments as for a core tool: the daemon's secret masked, a bidi override escaped.
        assert MODEL_KEY not in ask.text and "\u202e" not in ask.text and "\\u202e" in ask.text
    assert not any("r1" in _results(r) for r in model.requests), "the gated tool ran unapproved"


async def test_slack_user_gets_the_answer_of_a_deferred_mcp_tool(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    _script(model)
    async with started_daemon(tmp_path, _config(tmp_path, model, slack, "U_FRIEND"), slack):
        await slack.inject_dm("D_FRIEND", "U_FRIEND", ASK)
        await slack.wait_for(lambda: [t for t in slack.texts("D_FRIEND") if QUOTE in t], timeout=60)
    _check_requests(model)


SUBTASK = "SUBTASK: find the ACME quote with your tools"


def _delegating(model: FakeOpenAI) -> None:
    """The lead delegates; the sub-agent (its last user text is the task) searches for a gated
    tool by name, then for the quote tool, calls it and reports."""

    def lead(body: dict[str, Any]) -> Reply:
        results = _results(body)
        if "t1" in results:
            return Reply(text=f"Lead reports: {results['t1']}")
        return Reply(
            tool_calls=[
                ToolCall("task", {"description": SUBTASK, "subagent_type": "general-purpose"}, id="t1")
            ]
        )

    def sub(body: dict[str, Any]) -> Reply:
        results = _results(body)
        if "q2" in results:
            return Reply(text=f"Sub-agent found: {results['q2']}")
        if "s2" in results:
            return Reply(tool_calls=[ToolCall("stock_quote", {"symbol": "acme"}, id="q2")])
        if "p2" in results:
            return Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "stock price quote"}, id="s2")])
        return Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "run_probe"}, id="p2")])

    model.add_rule(lambda text: text.startswith("DELEGATE"), lead)
    model.add_rule(lambda text: text.startswith("SUBTASK"), sub)


def _check_subagent_requests(model: FakeOpenAI) -> None:
    subs = [r for r in model.requests if last_user_text(r).startswith("SUBTASK")]
    leads = [r for r in model.requests if last_user_text(r).startswith("DELEGATE")]
    first = subs[0]
    # The sub-agent's first request: its core tools and tool_search, none of the 33 MCP schemas;
    # the gated run_probe is not even counted (a sub-agent cannot ask for approval).
    assert TOOL_SEARCH in _names(first) and "stock_quote" not in _names(first)
    assert not any(n.startswith("records_") for n in _names(first))
    assert "32 tool(s) are not loaded" in str(first["tools"])
    hidden = next(r for r in subs if "p2" in _results(r))
    assert "not available to you" in _results(hidden)["p2"] and "run_probe" not in _names(hidden)
    after = next(r for r in subs if "s2" in _results(r))
    assert "stock_quote" in _names(after) and not any(n.startswith("records_") for n in _names(after))
    assert QUOTE in _results(next(r for r in subs if "q2" in _results(r)))["q2"]
    # What the sub-agent found stays its own: the lead never had the quote tool bound.
    assert all("stock_quote" not in _names(r) for r in leads) and len(leads) == 2


async def test_a_sub_agent_finds_and_calls_a_deferred_mcp_tool_without_every_schema(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    _delegating(model)
    cfg = _config(tmp_path, model, tg, str(OWNER))
    cfg["agent"]["tool_search"] = {"remember": "thread"}  # a leak of found tools would show
    async with started_daemon(tmp_path, cfg):
        tg.inject_message(OWNER, OWNER, "DELEGATE: get me the ACME quote")
        await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(OWNER) if "Lead reports" in m.text), None),
            timeout=90,
            what="the lead's answer",
        )
        assert QUOTE in next(m.text for m in tg.bot_messages(OWNER) if "Lead reports" in m.text)
    _check_subagent_requests(model)


async def test_a_sub_agent_on_slack_finds_and_calls_a_deferred_mcp_tool(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    _delegating(model)
    cfg = _config(tmp_path, model, slack, "U_FRIEND")
    cfg["agent"]["tool_search"] = {"remember": "thread"}
    async with started_daemon(tmp_path, cfg, slack):
        await slack.inject_dm("D_FRIEND", "U_FRIEND", "DELEGATE: get me the ACME quote")
        await slack.wait_for(
            lambda: [t for t in slack.texts("D_FRIEND") if "Lead reports" in t and QUOTE in t], timeout=90
        )
    _check_subagent_requests(model)
