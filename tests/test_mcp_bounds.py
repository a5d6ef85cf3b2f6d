"""A hostile MCP server's tool list (tests/fixtures/mcp_hostile_tools.py, built with the official
SDK) cannot put unbounded text in the model's prompt: schemas over ``max_schema_chars`` and tools
past ``max_tools_per_server`` are left out, descriptions are cut (agent/tools/mcp_bounds.py);
``/mcp`` and the log say what was left out. Through a real turn with deferred tools, the request
the fake model receives after ``tool_search`` carries the found tool's bounded schema only; a found
tool whose server answers invalid JSON-RPC or 50 MB gives the model a clear, short tool error and
the turn still answers.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentSettings, ModelSpec
from agent.context import ContextSettings, build_context_middleware
from agent.events import Final
from agent.harness import Harness
from agent.model import build_chat_model
from agent.redact import Redactor
from agent.settings import McpSettings, ToolSearchSettings
from agent.tool_search import HEAD, TOOL_SEARCH, build_tool_search
from agent.tools.mcp import McpCatalog
from gateway.commands.mcp import servers_text
from tests.daemon import started_daemon
from tests.fakes.mcp_servers import garbage_config, stdio_config
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, answered, telegram_config

HOSTILE = Path(__file__).parent / "fixtures" / "mcp_hostile_tools.py"


LEAK = "hostile-leak-token-3e9a71c4"
"""A secret the daemon configured for the server (its env), which the server quotes back."""


def _settings(filler: int = 5, **limits: Any) -> McpSettings:
    server = {
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(HOSTILE), "--filler", str(filler)],
        "env": {"HOSTILE_LEAK": LEAK},
    }
    return McpSettings.model_validate({"servers": {"hostile": server}, **limits})


@pytest.fixture
async def hostile(caplog: pytest.LogCaptureFixture) -> AsyncIterator[McpCatalog]:
    caplog.set_level(logging.WARNING, logger="agent.tools.mcp_bounds")
    settings = _settings(max_tools_per_server=7)
    # As agent/runtime.py builds it: masking every secret the daemon holds (the env value too).
    catalog = McpCatalog(settings, reconnect=False, redact=Redactor(settings.secrets()))
    await catalog.start()
    yield catalog
    await catalog.close()


def _harness(fake: FakeOpenAI, tmp_path: Path, catalog: McpCatalog, **search: Any) -> Harness:
    """The real harness with deferred tools over ``catalog`` (no title or summary calls)."""
    agent = AgentSettings(model_retries=0)
    spec = ModelSpec(base_url=fake.base_url, api_key="k", model="m")
    quiet = ContextSettings(title="off", summarize_after_tokens=None)
    stack = build_context_middleware(quiet, build_chat_model(spec, agent), secrets=[])
    stack += build_tool_search(ToolSearchSettings(**search), catalog.tools)
    return Harness(agent, spec, tmp_path / "cp.sqlite", extra_middleware=stack)


def _tool_defs(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in body.get("tools") or []}


def _results(body: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: str(m["content"]) for m in body["messages"] if m["role"] == "tool"}


async def test_oversized_tools_are_left_out_or_cut_and_mcp_and_the_log_say_so(
    hostile: McpCatalog, caplog: pytest.LogCaptureFixture
) -> None:
    names = [t.name for t in hostile.tools()]
    assert "giant_schema" not in names  # ~300 KB schema: left out, not cut
    assert names[:3] == ["long_story", "leaky_backup", "plain_lookup"] and len(names) == 7  # the cap
    leaky = next(t for t in hostile.tools() if t.name == "leaky_backup")
    assert LEAK not in leaky.description + json.dumps(leaky.args_schema)  # masked, not sent
    assert "Run a backup" in leaky.description
    story = next(t for t in hostile.tools() if t.name == "long_story")
    assert len(story.description) <= 2010 and "\u202e" not in story.description
    schema = story.args_schema
    assert isinstance(schema, dict)
    topic = schema["properties"]["topic"]["description"]
    assert len(topic) <= 510 and "\u200b" not in topic and schema["required"] == ["topic"]
    assert len(json.dumps(schema)) < 2000

    (view,) = hostile.servers()
    assert view.state == "connected"
    shown = servers_text(hostile.servers())
    assert "input schema over 10,000 characters" in shown and "`giant_schema`" in shown  # a code span
    assert "more than 7 tools" in shown and "extra_004" in shown
    assert "description(s) cut to 2,000 characters" in shown and "long_story" in shown
    logged = "\n".join(r.getMessage() for r in caplog.get_records("setup"))  # logged at listing
    assert "'hostile'" in logged and "giant_schema" in logged and "max_tools_per_server" in logged
    assert "vvvvvvvvvv" not in logged and "ssssssssss" not in logged  # the server's text is not logged


async def test_after_a_search_the_request_carries_only_the_bounded_schema(
    fake: FakeOpenAI, tmp_path: Path, hostile: McpCatalog
) -> None:
    fake.script(
        Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "giant_schema"}, id="g1")]),
        Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "leaky_backup"}, id="l1")]),
        Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "tell a long story"}, id="s1")]),
        Reply(tool_calls=[ToolCall("long_story", {"topic": "llamas"}, id="c1")]),
        Reply(text="Told."),
    )
    async with _harness(fake, tmp_path, hostile, max_results=3) as harness:
        async with aclosing(harness.run("t", user_id="u", message_id="m1", text="a story")) as run:
            events = [e async for e in run]
    assert events[-1] == Final("Told.")
    for body in fake.requests:  # the left-out tool never reaches the model, in any form
        assert "giant_schema" not in _tool_defs(body) and "vvvvvvvvvv" not in json.dumps(body)
    assert _results(fake.requests[1])["g1"].startswith("No tool matches")
    assert "leaky_backup" in _tool_defs(fake.requests[2])  # found: its schema is sent, masked
    assert all(LEAK not in json.dumps(body) for body in fake.requests)
    after = fake.requests[3]
    assert _results(after)["s1"].startswith(HEAD)
    assert _results(after)["s1"].count("\n- ") <= 3  # max_results
    story = _tool_defs(after)["long_story"]
    assert len(json.dumps(story)) < 2000 + 2000  # description (2,000) + schema, all bounded
    assert "story about llamas" in _results(fake.requests[4])["c1"]


async def test_a_found_tool_answering_garbage_or_50_mb_is_a_clear_tool_error(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    settings = McpSettings.model_validate(
        {
            "servers": {"junk": garbage_config("list", call_timeout=30), "local": stdio_config()},
            "tool_name_prefix": True,
        }
    )
    catalog = McpCatalog(settings, reconnect=False)
    await catalog.start()
    fake.script(
        Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "junk_broken"}, id="s1")]),
        Reply(tool_calls=[ToolCall("junk_broken", {}, id="b1")]),
        Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "local_huge"}, id="s2")]),
        Reply(tool_calls=[ToolCall("local_huge", {}, id="h1")]),
        Reply(text="Recovered from both."),
    )
    try:
        async with _harness(fake, tmp_path, catalog) as harness:
            async with aclosing(harness.run("t", user_id="u", message_id="m1", text="try them")) as run:
                events = [e async for e in run]
    finally:
        await catalog.close()
    assert events[-1] == Final("Recovered from both.")
    results = {k: v for body in fake.requests for k, v in _results(body).items()}
    assert "MCP server 'junk' answered 'junk_broken' badly" in results["b1"]
    assert "not valid JSON-RPC" in results["b1"]
    assert "larger than 16,777,216 bytes" in results["h1"] and "nothing was kept" in results["h1"]
    assert max(len(results["b1"]), len(results["h1"])) < 1000
    assert all(len(json.dumps(body)) < 200_000 for body in fake.requests)


async def test_through_the_daemon_mcp_shows_the_notes_and_no_request_carries_the_servers_secret(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """``chital run`` on Telegram with the hostile server (deferred tools on, the default): ``/mcp``
    says what was left out, the log names it, and after the model finds ``leaky_backup`` its
    schema reaches the model with the server's configured token masked (the runtime's redactor)."""
    cfg = telegram_config(tmp_path, tg, model)
    hostile = _settings(filler=2).servers["hostile"].model_dump(mode="json")
    hostile["env"] = {"HOSTILE_LEAK": LEAK}
    cfg["agent"]["mcp"] = {"servers": {"hostile": hostile}}
    async with started_daemon(tmp_path, cfg) as d:
        up = tg.inject_command(OWNER, OWNER, "mcp", "", chat_type="private", at=None)
        listed = (await answered(tg, OWNER, up, "MCP servers (1)", timeout=60)).text
        assert "left out: input schema over 10,000 characters" in listed and "giant_schema" in listed
        assert "description(s) cut to 2,000 characters" in listed
        model.script(
            Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "leaky_backup"}, id="l1")]),
            Reply(tool_calls=[ToolCall("leaky_backup", {"target": "s3://x"}, id="b1")]),
            Reply(text="Backed up."),
        )
        await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "back it up"), "Backed up", timeout=60)
        logs = "\n".join(p.read_text(errors="replace") for p in sorted(d.workdir.glob("daemon-*.log")))
    found = next(body for body in model.requests if "l1" in _results(body))
    assert "leaky_backup" in _tool_defs(found) and "giant_schema" not in _tool_defs(found)
    assert "backed up s3://x" in _results(model.requests[-1])["b1"]
    assert "giant_schema" in logs and "max_schema_chars" in logs
    for where in (json.dumps(model.requests), logs, "\n".join(m.text for m in tg.bot_messages(OWNER))):
        assert LEAK not in where
