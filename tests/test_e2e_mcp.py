"""MCP end to end through `chital run` and Telegram, against real MCP servers built with the
official SDK (tests/fixtures/mcp_test_server.py): stdio, streamable HTTP and SSE servers serve a
turn the fake model drives; ``/mcp`` lists them; an admin's ``/mcp reload`` and SIGHUP change
the tool set without a restart; a server that dies mid-call is a tool error, not a failed turn.
Secrets (bearer tokens, a stdio server's env) are looked for in the chat, the model's requests
and the daemon's logs."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.tool_search import TOOL_SEARCH
from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.mcp_servers import McpHttpServer, stdio_config
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.slack_daemon import DM, FRIEND
from tests.telegram_daemon import OTHER, OWNER, answered, telegram_config

HTTP_TOKEN = "mcp-http-token-51c0ffee"
SSE_TOKEN = "mcp-sse-token-7e57ab1e"
WRONG_TOKEN = "mcp-wrong-token-0badbad"
STDIO_SECRET = "mcp-stdio-secret-5ca1ab1e"
SECRETS = (HTTP_TOKEN, SSE_TOKEN, WRONG_TOKEN, STDIO_SECRET)


def mcp_config(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, servers: dict[str, Any]
) -> dict[str, Any]:
    cfg = telegram_config(tmp_path, tg, model)
    cfg["access"]["admins"] = [str(OWNER)]
    cfg["agent"]["mcp"] = {"servers": servers, "tool_name_prefix": True, "reconnect_backoff": 60}
    cfg["agent"]["tool_search"] = {"enabled": False}  # every MCP tool bound (deferral: test_e2e_tool_search)
    return cfg


def tool_names(body: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools", [])}


def tool_results(model: FakeOpenAI) -> dict[str, str]:
    """Every tool result the model was sent, by call id."""
    return {
        str(m["tool_call_id"]): str(m["content"])
        for body in model.requests
        for m in body["messages"]
        if m.get("role") == "tool"
    }


def full_logs(d: DaemonProcess) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(d.workdir.glob("daemon-*.log")))


async def command(tg: FakeTelegram, user: int, text: str, needle: str) -> str:
    name, _, args = text.partition(" ")
    up = tg.inject_command(user, user, name, args, chat_type="private", at=None)
    return str((await answered(tg, user, up, needle, timeout=60)).text)


def assert_no_secrets(tg: FakeTelegram, model: FakeOpenAI, d: DaemonProcess) -> None:
    seen = {
        "chat": "\n".join(m.text for chat in (OWNER, OTHER) for m in tg.bot_messages(chat)),
        "model": json.dumps(model.requests),
        "logs": full_logs(d),
    }
    for where, text in seen.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret} leaked into the {where}"


@pytest.fixture
async def http_servers() -> AsyncIterator[tuple[McpHttpServer, McpHttpServer]]:
    async with (
        McpHttpServer("streamable_http", token=HTTP_TOKEN) as web,
        McpHttpServer("sse", token=SSE_TOKEN) as feed,
    ):
        yield web, feed


async def test_servers_of_every_transport_serve_a_turn_and_mcp_lists_them(
    tmp_path: Path,
    tg: FakeTelegram,
    model: FakeOpenAI,
    http_servers: tuple[McpHttpServer, McpHttpServer],
) -> None:
    web, feed = http_servers
    servers = {
        "local": stdio_config(env={"LOCAL_TOKEN": STDIO_SECRET}),
        "web": web.config(HTTP_TOKEN),
        "feed": feed.config(SSE_TOKEN),
        "locked": web.config(WRONG_TOKEN),
        "off": stdio_config(enabled=False),
    }
    async with started_daemon(tmp_path, mcp_config(tmp_path, tg, model, servers)) as d:
        model.script(
            Reply(
                tool_calls=[
                    ToolCall("web_echo", {"text": "over http"}, id="t1"),
                    ToolCall("feed_add", {"a": 2, "b": 40}, id="t2"),
                    ToolCall("local_env_probe", {"name": "LOCAL_TOKEN"}, id="t3"),
                    ToolCall("local_env_probe", {"name": "OPENAI_API_KEY"}, id="t4"),
                    ToolCall("local_huge", {}, id="t5"),  # 50 MB over stdio: dropped as it streams
                    ToolCall("local_sized", {"chars": 300_000}, id="t7"),  # bounded for the model
                    ToolCall("web_huge", {}, id="t6"),  # 50 MB over HTTP: not read past the cap
                ]
            ),
            Reply(text="All done with the tools."),
        )
        await answered(
            tg, OWNER, tg.inject_message(OWNER, OWNER, "use the mcp tools"), "All done", timeout=60
        )
        first = next(r for r in model.requests if "web_echo" in tool_names(r))
        names = tool_names(first)
        assert {"web_echo", "feed_add", "local_env_probe", "local_notes"} <= names
        assert not any(n.startswith(("locked_", "off_")) for n in names)
        results = tool_results(model)
        assert "echo: over http" in results["t1"] and "42" in results["t2"]
        assert "set" in results["t3"] and "unset" in results["t4"]  # its env only, never the daemon's
        assert "larger than 16,777,216 bytes" in results["t5"] and len(results["t5"]) < 1000
        # Bounded before the model sees it (deepagents parks it, or ToolOutputCap cuts it).
        assert 0 < len(results["t7"]) < 120_000
        assert "larger than 16,777,216 bytes" in results["t6"] and len(results["t6"]) < 1000

        text = await command(tg, OWNER, "mcp", "MCP servers (5)")
        assert "connected" in text and "web_echo" in text and "feed_add" in text and "local_echo" in text
        assert "failed: credentials refused (HTTP 401)" in text  # the server with the wrong token, named
        assert "disabled" in text
        assert "MCP server 'locked' failed to start (credentials refused (HTTP 401)" in full_logs(d)
        assert_no_secrets(tg, model, d)


async def test_reload_by_admin_and_sighup_change_the_tools_and_a_dying_server_is_a_tool_error(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    async with McpHttpServer("streamable_http") as web:
        servers = {"local": stdio_config(), "web": web.config()}
        async with started_daemon(tmp_path, mcp_config(tmp_path, tg, model, servers)) as d:
            # Not an admin: refused, nothing re-read.
            refused = await command(tg, OTHER, "mcp reload", "only an admin")
            assert "Reloaded" not in refused

            d.config["agent"]["mcp"]["servers"]["extra"] = stdio_config(extra=True)
            d.write_config()
            text = await command(tg, OWNER, "mcp reload", "Reloaded the MCP servers")
            assert "extra_weather" in text

            model.script(
                Reply(tool_calls=[ToolCall("extra_weather", {"city": "Oslo"}, id="w1")]),
                Reply(text="Weather reported."),
            )
            await answered(
                tg, OWNER, tg.inject_message(OWNER, OWNER, "weather?"), "Weather reported", timeout=60
            )
            assert "sunny in Oslo" in tool_results(model)["w1"]

            # SIGHUP: the same reload, from the shell.
            del d.config["agent"]["mcp"]["servers"]["extra"]
            d.write_config()
            assert d.proc is not None
            os.kill(d.proc.pid, signal.SIGHUP)
            await tg.wait_for(
                lambda: "SIGHUP: 🔄 Reloaded" in full_logs(d) or None, timeout=60, what="reload"
            )
            text = await command(tg, OWNER, "mcp", "MCP servers (2)")
            assert "extra" not in text and "local_echo" in text

            # A server that dies in the middle of a call: the model gets a tool error naming it, the
            # turn goes on, and /mcp shows the server as failed (reconnecting with backoff).
            model.script(
                Reply(tool_calls=[ToolCall("web_die", {}, id="d1")]),
                Reply(text="The web server broke; carrying on."),
            )
            await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "break it"), "carrying on", timeout=60)
            assert "MCP server 'web' failed during 'web_die'" in tool_results(model)["d1"]
            text = await command(tg, OWNER, "mcp", "MCP servers (2)")
            assert "failed: connection lost" in text


async def test_slack_lists_mcp_servers_refuses_a_non_admin_reload_and_calls_a_tool(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    async with McpHttpServer("streamable_http", token=HTTP_TOKEN) as web:
        cfg = chat_config(tmp_path, model.base_url, slack, allow=[f"slack:{FRIEND}"])
        cfg["agent"]["mcp"] = {"servers": {"web": web.config(HTTP_TOKEN)}, "tool_name_prefix": True}
        cfg["agent"]["tool_search"] = {"enabled": False}
        async with started_daemon(tmp_path, cfg, slack) as d:

            async def dm(text: str, needle: str) -> str:
                await slack.inject_dm(DM, FRIEND, text)
                found = await slack.wait_for(
                    lambda: next((t for t in slack.texts(DM) if needle in t), None), timeout=60
                )
                return str(found)

            listed = await dm("/mcp", "MCP servers (1)")
            assert "connected" in listed and "web_echo" in listed
            await dm("/mcp reload", "only an admin")
            model.script(
                Reply(tool_calls=[ToolCall("web_echo", {"text": "from slack"}, id="s1")]),
                Reply(text="Slack used the MCP tool."),
            )
            await dm("echo it over mcp", "Slack used the MCP tool")
            assert "echo: from slack" in tool_results(model)["s1"]
            for text in (json.dumps(model.requests), "\n".join(slack.texts(DM)), full_logs(d)):
                assert HTTP_TOKEN not in text


async def test_a_tool_added_by_reload_is_found_by_tool_search(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    cfg = mcp_config(tmp_path, tg, model, {"local": stdio_config()})
    cfg["agent"]["tool_search"] = {"enabled": True}  # deferral: MCP tools only once found
    async with started_daemon(tmp_path, cfg) as d:
        d.config["agent"]["mcp"]["servers"]["extra"] = stdio_config(extra=True)
        d.write_config()
        assert "extra_weather" in await command(tg, OWNER, "mcp reload", "Reloaded the MCP servers")
        model.script(
            Reply(tool_calls=[ToolCall(TOOL_SEARCH, {"query": "weather in a city"}, id="q1")]),
            Reply(tool_calls=[ToolCall("extra_weather", {"city": "Oslo"}, id="w1")]),
            Reply(text="Weather found."),
        )
        await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "weather?"), "Weather found", timeout=60)
        assert "extra_weather" in tool_results(model)["q1"]
        assert "sunny in Oslo" in tool_results(model)["w1"]
