"""OAuth for HTTP MCP servers (agent/tools/mcp_oauth.py) against a real FastMCP resource server
and a test authorization server on 127.0.0.1 (tests/fixtures/mcp_oauth_server.py).

Asserted: what the model gets from a tool call, what ``/mcp`` shows (``servers()``), how often the
token endpoint was hit (by grant), the token file's permissions, and that no secret or token
appears in the operator's log or in a tool's text."""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.settings import McpServer, McpSettings
from agent.tools.mcp import LOGIN_POLL, McpCatalog
from tests.daemon import free_port, start_chital
from tests.fakes.gateway_rig import until
from tests.fakes.mcp_servers import McpOAuthServer
from tests.mcp_calls import call, state

CLIENT_ID = "chital-m2m"
SECRET = "cs-7f3e9a1b2c4d5e6f-oauth"


@pytest.fixture
async def made() -> AsyncIterator[list[McpCatalog]]:
    catalogs: list[McpCatalog] = []
    yield catalogs
    for c in catalogs:
        await c.close()


async def start(made: list[McpCatalog], token_dir: Path | None, **servers: dict[str, Any]) -> McpCatalog:
    s = McpSettings.model_validate({"servers": servers, "tool_name_prefix": True, "reconnect_backoff": 0.2})
    c = McpCatalog(s, token_dir=token_dir)
    made.append(c)
    await c.start()
    return c


def assert_no_secrets(texts: list[str], issued: list[str]) -> None:
    for text in texts:
        assert SECRET not in text
        for token in issued:
            assert token not in text


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
async def test_tokens_are_issued_stored_0600_and_used(
    transport: Any, made: list[McpCatalog], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tokens = tmp_path / "mcp-oauth"
    async with McpOAuthServer(transport, client_id=CLIENT_ID, client_secret=SECRET) as srv:
        c = await start(made, tokens, svc=srv.oauth_config())
        assert state(c, "svc") == ("connected", "")
        assert await call(c, "svc_echo", {"text": "one"}) == "echo: one"
        stats = await srv.admin()
        assert stats["hits"]["client_credentials"] == 1  # one grant, reused by the later session
        files = list(tokens.iterdir())
        assert len(files) == 1
        assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
        assert stat.S_IMODE(tokens.stat().st_mode) == 0o700
        assert stats["issued"][0] in files[0].read_text()  # the access token is what is stored

        # a restarted daemon reuses the stored token: no new grant
        again = await start(made, tokens, svc=srv.oauth_config())
        assert await call(again, "svc_echo", {"text": "two"}) == "echo: two"
        assert (await srv.admin())["hits"]["client_credentials"] == 1

        # a wrong secret: refused, the server failed (not retried), the secret never shown
        wrong = await start(made, tmp_path / "other", bad=srv.oauth_config("wrong-secret-123456"))
        st, reason = state(wrong, "bad")
        assert st == "failed" and "authorization refused or revoked" in reason
        assert "wrong-secret-123456" not in caplog.text
    assert_no_secrets([caplog.text], stats["issued"])


async def test_an_expired_token_is_refreshed_with_the_refresh_token(
    made: list[McpCatalog], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with McpOAuthServer("streamable_http", client_id=CLIENT_ID, client_secret=SECRET) as srv:
        await srv.admin("ttl", seconds=1)  # tokens that live one second
        c = await start(made, tmp_path, svc=srv.oauth_config())
        assert state(c, "svc") == ("connected", "")
        await asyncio.sleep(1.5)  # the access token has expired (client and server side)
        assert await call(c, "svc_echo", {"text": "after"}) == "echo: after"
        stats = await srv.admin()
        assert stats["hits"]["refresh_token"] >= 1
        assert state(c, "svc") == ("connected", "")

        # the refresh token revoked alone: the SDK falls back to a new client-credentials grant
        await srv.admin("ttl", seconds=3600)
        await srv.admin("revoke_refresh")
        await asyncio.sleep(1.5)
        assert await call(c, "svc_echo", {"text": "fresh"}) == "echo: fresh"
        assert (await srv.admin())["hits"]["client_credentials"] >= 2
    assert_no_secrets([caplog.text], stats["issued"])


async def test_a_revoked_client_is_reported_once_and_never_retried_in_a_loop(
    made: list[McpCatalog], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with McpOAuthServer("streamable_http", client_id=CLIENT_ID, client_secret=SECRET) as srv:
        await srv.admin("ttl", seconds=1)
        c = await start(made, tmp_path, svc=srv.oauth_config())
        assert state(c, "svc") == ("connected", "")
        await srv.admin("revoke_client")
        await asyncio.sleep(1.5)
        first = await call(c, "svc_echo", {"text": "hi"})
        assert first.startswith("ERROR: MCP server 'svc' failed during 'svc_echo': authorization refused")
        st, reason = state(c, "svc")
        assert st == "failed" and "authorization refused or revoked" in reason
        hits = (await srv.admin())["hits"]

        # more calls and many backoff periods (0.2 s doubling) later: no token request at all
        texts = [await call(c, "svc_echo", {"text": "hi"}) for _ in range(5)]
        await asyncio.sleep(2.0)
        texts.append(await call(c, "svc_echo", {"text": "hi"}))
        assert all("An admin must fix its configuration and run /mcp reload" in t for t in texts)
        stats = await srv.admin()
        assert stats["hits"] == hits
        reports = [r for r in caplog.records if "MCP server 'svc' failed" in r.getMessage()]
        assert len(reports) == 1
    assert_no_secrets([caplog.text, first, *texts], stats["issued"])


def test_oauth_config_is_checked() -> None:
    base = {"client_id": "c", "client_secret": "s", "issuer": "https://auth.example"}
    with pytest.raises(ValidationError, match="'oauth' is for streamable_http and sse"):
        McpServer.model_validate({"command": "x", "oauth": base})
    with pytest.raises(ValidationError, match="not both"):
        McpServer.model_validate(
            {
                "transport": "sse",
                "url": "http://x/sse",
                "oauth": base,
                "headers": {"authorization": "Bearer t"},
            }
        )
    with pytest.raises(ValidationError):  # the issuer is required: the secret goes only there
        McpServer.model_validate(
            {"transport": "sse", "url": "http://x/sse", "oauth": {"client_id": "c", "client_secret": "s"}}
        )
    cfg = McpServer.model_validate(
        {"transport": "sse", "url": "http://x/sse", "oauth": {**base, "client_secret": SECRET}}
    )
    assert SECRET in cfg.secrets()  # masked in tool results like header values
    assert SECRET not in repr(cfg)


async def login_cli(srv: McpOAuthServer, tmp_path: Path, port: int) -> tuple[int, str]:
    """``chital mcp login svc`` as an operator runs it; the test plays the browser: it opens the
    printed URL (the authorization server consents at once and redirects to the loopback)."""
    import httpx
    import yaml

    cfg = tmp_path / "config.yaml"
    oauth = {"grant": "authorization_code", "redirect_port": port}
    server = {"transport": srv.transport, "url": srv.url, "oauth": oauth}
    data = {"storage": {"path": str(tmp_path / "data")}, "agent": {"mcp": {"servers": {"svc": server}}}}
    cfg.write_text(yaml.safe_dump(data))
    proc = await start_chital("mcp", "login", "svc", "-c", str(cfg))
    assert proc.stdout is not None
    out = ""
    try:
        while "http://" not in out or "Waiting" not in out:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            assert line, f"login ended before printing a URL: {out}"
            out += line
        url = next(w for w in out.split() if w.startswith(f"{srv.issuer}/authorize?"))
        async with httpx.AsyncClient(trust_env=False, follow_redirects=True) as browser:
            page = await browser.get(url)
        rest = await asyncio.wait_for(proc.stdout.read(), 60)
        out += page.text + rest.decode()
        return await proc.wait(), out
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_login_then_refresh_then_a_revoked_refresh_token_is_reported_once(
    made: list[McpCatalog], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    port = free_port()
    tokens = tmp_path / "data" / "mcp-oauth"
    async with McpOAuthServer("streamable_http", client_id=CLIENT_ID, client_secret=SECRET) as srv:
        config = {
            "transport": "streamable_http",
            "url": srv.url,
            "oauth": {"grant": "authorization_code", "redirect_port": port},
        }

        # never logged in: failed at once, nothing asked of the authorization server
        c0 = await start(made, tokens, svc=config)
        assert state(c0, "svc") == (
            "failed",
            "authorization revoked or missing: run chital mcp login svc",
        )
        assert (await srv.admin())["hits"]["register"] == 0
        await c0.close()  # (its pick-up of a login: the next test)

        await srv.admin("ttl", seconds=2)  # the login's tokens expire at once (for the daemon)
        code, out = await login_cli(srv, tmp_path, port)
        assert code == 0, out
        assert "Logged in to MCP server 'svc': 1 tool(s)" in out
        assert "authorization received" in out  # what the browser showed
        stats = await srv.admin()
        assert stats["hits"]["register"] == 1 and stats["hits"]["authorization_code"] == 1
        assert_no_secrets([out], stats["issued"])
        (file,) = tokens.iterdir()
        assert stat.S_IMODE(file.stat().st_mode) == 0o600

        # the daemon (after /mcp reload) uses the stored tokens: expired, so refreshed first
        await srv.admin("ttl", seconds=3600)
        c1 = await start(made, tokens, svc=config)
        assert state(c1, "svc") == ("connected", "")
        assert await call(c1, "svc_echo", {"text": "x"}) == "echo: x"
        stats = await srv.admin()
        assert stats["hits"]["refresh_token"] == 1 and stats["hits"]["authorization_code"] == 1

        # a second login, then its refresh token revoked: failed once, not retried
        await srv.admin("ttl", seconds=2)
        code, out = await login_cli(srv, tmp_path, port)
        assert code == 0, out
        await srv.admin("ttl", seconds=3600)
        await srv.admin("revoke_refresh")
        before = (await srv.admin())["hits"]
        c2 = await start(made, tokens, svc=config)
        st, reason = state(c2, "svc")
        assert (st, reason) == (
            "failed",
            "authorization revoked or missing: run chital mcp login svc",
        )
        hits = (await srv.admin())["hits"]
        assert hits["refresh_token"] == before["refresh_token"] + 1  # one refresh tried, refused
        await asyncio.sleep(2.0)  # many backoff periods (0.2 s doubling): no retry
        assert (await srv.admin())["hits"] == hits

        # the running daemon (c1) whose token the server no longer accepts: it cannot log in
        # by itself, so the call fails once with the instruction and nothing is retried
        await srv.admin("expire_access")
        first = await call(c1, "svc_echo", {"text": "hi"})
        assert first.startswith("ERROR: MCP server 'svc' failed during 'svc_echo': authorization revoked")
        assert "run chital mcp login svc" in first
        hits = (await srv.admin())["hits"]
        texts = [first, *[await call(c1, "svc_echo", {"text": "hi"}) for _ in range(3)]]
        await asyncio.sleep(2.0)
        assert all("run chital mcp login svc" in t for t in texts)
        stats = await srv.admin()
        assert stats["hits"] == hits
        reports = [r for r in caplog.records if "MCP server 'svc' failed" in r.getMessage()]
        assert len(reports) == 3  # c0 (never logged in), c2 (revoked), c1 (token refused): once each
    assert_no_secrets([caplog.text, *texts], stats["issued"])


async def test_login_refused_in_the_browser_says_so(tmp_path: Path) -> None:
    port = free_port()
    async with McpOAuthServer("streamable_http", client_id=CLIENT_ID, client_secret=SECRET) as srv:
        await srv.admin("deny")
        code, out = await login_cli(srv, tmp_path, port)
        assert code == 1
        assert "chital: mcp login svc: the authorization server refused: access_denied" in out
        assert not (tmp_path / "data" / "mcp-oauth").exists() or not any(
            "tokens" in p.read_text() for p in (tmp_path / "data" / "mcp-oauth").iterdir()
        )


async def test_a_running_daemon_uses_a_new_login_without_a_reload(
    made: list[McpCatalog], tmp_path: Path
) -> None:
    """The operator runs ``chital mcp login`` while the daemon runs: the server that waited for a
    login connects by itself, and until then nothing was asked of the authorization server."""
    port = free_port()
    tokens = tmp_path / "data" / "mcp-oauth"
    async with McpOAuthServer("streamable_http", client_id=CLIENT_ID, client_secret=SECRET) as srv:
        config = {
            "transport": "streamable_http",
            "url": srv.url,
            "oauth": {"grant": "authorization_code", "redirect_port": port},
        }
        c = await start(made, tokens, svc=config)
        assert state(c, "svc") == ("failed", "authorization revoked or missing: run chital mcp login svc")
        await asyncio.sleep(2 * LOGIN_POLL)  # a few looks at the (absent) token file
        assert (await srv.admin())["hits"]["register"] == 0, "nothing asked while waiting for a login"
        code, out = await login_cli(srv, tmp_path, port)
        assert code == 0, out
        await until(lambda: state(c, "svc")[0] == "connected", 30, "the new login picked up")
        assert await call(c, "svc_echo", {"text": "after login"}) == "echo: after login"
