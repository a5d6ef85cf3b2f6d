"""The MCP catalog (agent/tools/mcp.py) against real MCP servers built with the official SDK:
stdio, streamable HTTP and SSE, bearer tokens, reload, a server dying mid-call, broken JSON-RPC
and a 50 MB answer. What is asserted is what the model would get (the tool's result or error
text), what ``/mcp`` would show (``servers()``) and what the operator's log holds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.settings import McpSettings
from agent.tools.mcp import McpCatalog
from tests.fakes.gateway_rig import until
from tests.fakes.mcp_servers import McpHttpServer, garbage_config, stdio_config
from tests.mcp_calls import call, state, tool

TOKEN = "mcp-bearer-9f8e7d6c5b4a"


def settings(**servers: dict[str, Any]) -> McpSettings:
    return McpSettings.model_validate(
        {"servers": servers, "tool_name_prefix": True, "reconnect_backoff": 0.2}
    )


@pytest.fixture
async def catalog() -> AsyncIterator[list[McpCatalog]]:
    made: list[McpCatalog] = []
    yield made
    for c in made:
        await c.close()


async def started(made: list[McpCatalog], s: McpSettings) -> McpCatalog:
    c = McpCatalog(s)
    made.append(c)
    await c.start()
    return c


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
async def test_http_transports_list_and_call_with_a_bearer_token(
    transport: Any, catalog: list[McpCatalog], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with McpHttpServer(transport, token=TOKEN) as srv:
        c = await started(catalog, settings(good=srv.config(TOKEN), bad=srv.config("wrong-token-123456")))
        assert state(c, "good") == ("connected", "")
        names = sorted(t.name for t in c.tools())
        assert names == [
            "good_add",
            "good_die",
            "good_echo",
            "good_env_probe",
            "good_huge",
            "good_notes",
            "good_sized",
        ]
        assert await call(c, "good_echo", {"text": "hi"}) == "echo: hi"
        assert await call(c, "good_add", {"a": 2, "b": 40}) == "42"
        # The wrong token: a clear reason naming the cause, no tools, and no retry loop.
        st, reason = state(c, "bad")
        assert st == "failed" and "credentials refused (HTTP 401)" in reason
        assert "MCP server 'bad' failed to start (credentials refused (HTTP 401)" in caplog.text
        assert not any(v.tools for v in c.servers() if v.name == "bad")
        assert all(t.get_name() != "mcp-reconnect-bad" for t in asyncio.all_tasks())
    assert TOKEN not in caplog.text and "wrong-token-123456" not in caplog.text


async def test_server_text_is_bounded_and_cleaned_for_the_model(catalog: list[McpCatalog]) -> None:
    c = await started(catalog, settings(s=stdio_config()))
    description = tool(c, "s_notes").description
    assert len(description) <= 2010 and description.endswith("[…]")
    assert "\u202e" not in description and "\u200b" not in description


async def test_stdio_servers_never_get_the_daemons_environment(
    catalog: list[McpCatalog], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHITAL_TEST_DAEMON_SECRET", "do-not-leak-123")
    c = await started(catalog, settings(s=stdio_config(env={"MINE": "x"})))
    assert await call(c, "s_env_probe", {"name": "CHITAL_TEST_DAEMON_SECRET"}) == "unset"
    assert await call(c, "s_env_probe", {"name": "OPENAI_API_KEY"}) == "unset"
    assert await call(c, "s_env_probe", {"name": "MINE"}) == "set"


async def test_a_server_that_dies_mid_call_gives_a_tool_error_and_is_reconnected(
    catalog: list[McpCatalog], caplog: pytest.LogCaptureFixture
) -> None:
    async with McpHttpServer("streamable_http") as srv:
        c = await started(catalog, settings(web=srv.config()))
        seen: list[list[str]] = []
        c.subscribe(lambda tools: seen.append([t.name for t in tools]))
        out = await call(c, "web_die")
        assert out.startswith("ERROR: MCP server 'web' failed during 'web_die': connection lost"), out
        assert await srv.wait_exit() == 3
        assert state(c, "web")[0] == "failed"
        # While it is down, its tools answer at once with the reason (no hang, no crash).
        down = await call(c, "web_echo", {"text": "x"})
        assert "MCP server 'web' is unavailable" in down and "reconnecting" in down
        assert caplog.text.count("MCP server 'web' failed:") == 1  # reported once, not per retry
        await srv.start()  # back on the same port: the backoff loop finds it
        await until(lambda: state(c, "web")[0] == "connected", 30, "the reconnection")
        assert await call(c, "web_echo", {"text": "back"}) == "echo: back"
        assert seen and "web_echo" in seen[-1]


async def test_a_fifty_megabyte_answer_is_not_read_past_the_cap(catalog: list[McpCatalog]) -> None:
    async with McpHttpServer("streamable_http") as srv:
        s = settings(web=srv.config())
        c = await started(catalog, s.model_copy(update={"max_response_bytes": 1024 * 1024}))
        out = await call(c, "web_huge")
        assert "larger than 1,048,576 bytes" in out and "nothing was kept" in out
        assert state(c, "web") == ("connected", "")  # a big answer is not a dead server
        assert await call(c, "web_echo", {"text": "still here"}) == "echo: still here"


async def test_a_fifty_megabyte_answer_over_stdio_is_dropped_as_it_streams(catalog: list[McpCatalog]) -> None:
    s = settings(s=stdio_config()).model_copy(update={"max_response_bytes": 1024 * 1024})
    c = await started(catalog, s)
    out = await call(c, "s_huge")
    assert "larger than 1,048,576 bytes" in out and "nothing was kept" in out
    assert await call(c, "s_echo", {"text": "still here"}) == "echo: still here"
    # A server that writes the id after the result: the relay answers the one pending request.
    late = settings(late=garbage_config("idlast", call_timeout=60)).model_copy(
        update={"max_response_bytes": 1024 * 1024}
    )
    c = await started(catalog, late)
    out = await call(c, "late_broken")
    assert "larger than 1,048,576 bytes" in out, out


async def test_invalid_json_rpc_gives_a_clear_error(catalog: list[McpCatalog]) -> None:
    s = settings(
        junk=garbage_config("list", call_timeout=10),
        mute=garbage_config("init", timeout=5),
    )
    c = await started(catalog, s)
    st, reason = state(c, "mute")
    assert st == "failed" and "not valid JSON-RPC" in reason, reason
    out = await call(c, "junk_broken")
    assert out.startswith("ERROR: MCP server 'junk' answered 'junk_broken' badly"), out
    assert "not valid JSON-RPC" in out, out
    assert state(c, "junk") == ("connected", "")  # a bad answer is not a dead server
    assert "not a list" not in out  # the server's text is not passed on


async def test_reload_adds_removes_and_keeps_servers(catalog: list[McpCatalog]) -> None:
    c = await started(catalog, settings(a=stdio_config(), b=stdio_config()))
    kept = tool(c, "a_echo")
    views = await c.reload(
        settings(a=stdio_config(), c=stdio_config(extra=True), d=stdio_config(enabled=False))
    )
    assert [(v.name, v.state) for v in views] == [("a", "connected"), ("c", "connected"), ("d", "disabled")]
    names = {t.name for t in c.tools()}
    assert "c_weather" in names and not any(n.startswith(("b_", "d_")) for n in names)
    assert tool(c, "a_echo") is kept  # an unchanged server is not reconnected
    assert await call(c, "c_weather", {"city": "Oslo"}) == "sunny in Oslo"
