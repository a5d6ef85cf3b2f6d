"""The operator console over real HTTP against `chital run` (docs/console.md): the login and what it
refuses, every page and action behind it, the attacks a console invites (no session, a stolen
cookie used from another origin, a missing or wrong CSRF token, XSS in a display name, a message and
a file name, static path traversal, the token leaking), and two actions whose effect the chat user
sees: a pairing approved and a schedule cancelled from the console."""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config.schema import Config
from gateway.console.app import mount
from tests.console_client import ACTIONS, PAGES, TOKEN, Console
from tests.console_support import MEMBER, STRANGER, XSS_FILE, XSS_NAME, XSS_TEXT, answered, console_config
from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.gateway_rig import daemon_rows
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.fresh_python import run_python

SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, console_config(tmp_path, tg, model)) as d:
        yield d


@pytest.fixture
async def browser(daemon: DaemonProcess) -> AsyncIterator[Console]:
    console = Console(daemon.port)
    yield console
    await console.close()


def assert_headers(response: aiohttp.ClientResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, (name, dict(response.headers))
    csp = response.headers.get("Content-Security-Policy", "")
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, csp


async def test_nothing_is_reachable_without_a_session(daemon: DaemonProcess, browser: Console) -> None:
    for page in (*PAGES, "/conversation?c=telegram:1002", "/no-such-page"):
        status, _, r = await browser.get(page)
        assert status == 303 and r.headers["Location"] == "/console/login", (page, status)
        assert_headers(r)
    for action in ACTIONS:
        status, body, _ = await browser.post(action, {"code": "ABCDEFGH", "id": "1", "user": "telegram:1"})
        assert status == 401 and "No console session" in body, (action, status, body)
    # A cookie the server never issued is no session.
    browser.http.cookie_jar.update_cookies({"chital_console": "forged-session-id"})
    status, _, _ = await browser.get("/people")
    assert status == 303
    status, body, r = await browser.get("/login")
    assert status == 200 and 'id="login-form"' in body
    assert_headers(r)


async def test_login_cookie_csrf_and_origin(daemon: DaemonProcess, browser: Console) -> None:
    status, body, _ = await browser.login("not-the-token-at-all-0000")
    assert status == 401 and "That is not the console token." in body
    status, _, r = await browser.login()
    assert status == 303 and r.headers["Location"] == "/console/"
    cookie = r.headers["Set-Cookie"]
    assert cookie.startswith("chital_console=")
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "path", "max-age"} <= attributes, cookie
    assert "SameSite=Strict" in cookie and "Path=/console" in cookie and "Secure" not in cookie, cookie

    bodies = []
    for page in PAGES:
        status, body, r = await browser.get(page)
        assert status == 200, (page, status, body[:500])
        assert_headers(r)
        assert "<script>" not in body.replace('<script src="/console/static/htmx.min.js"></script>', "")
        bodies.append(body)
    csrf = await browser.csrf()

    # State-changing requests: no CSRF token, a wrong one, another origin, no origin at all.
    form = {"user": "telegram:4242"}
    status, body, _ = await browser.post("/people/revoke", form)
    assert status == 403 and "CSRF token is missing or wrong" in body
    # The last two characters changed, never to what they were (a random token may end in "xx").
    wrong = csrf[:-2] + ("yy" if csrf.endswith("xx") else "xx")
    status, body, _ = await browser.post("/people/revoke", {**form, "csrf": wrong})
    assert status == 403 and "CSRF" in body
    # A stolen cookie and even the right CSRF token, sent from another site's page: refused.
    for evil in ("http://evil.example", "http://127.0.0.1:1", "null"):
        status, body, _ = await browser.post("/people/revoke", {**form, "csrf": csrf}, origin=evil)
        assert status == 403 and "Origin check" in body, (evil, status, body)
    status, body, _ = await browser.post("/people/revoke", {**form, "csrf": csrf}, origin=None)
    assert status == 403 and "Origin check" in body
    referer = {"Referer": f"{browser.origin}/console/people"}
    status, _, r = await browser.post("/people/revoke", {**form, "csrf": csrf}, origin=None, headers=referer)
    assert status == 303 and r.headers["Location"] == "/console/people"
    status, body, _ = await browser.get("/people")
    assert "telegram:4242 was not approved by code." in body
    # A login from another origin (login CSRF) is refused too.
    status, _, _ = await browser.post("/login", {"token": TOKEN}, origin="http://evil.example")
    assert status == 403

    # Logout ends the session on the server: the old cookie no longer opens a page.
    stolen = browser.http.cookie_jar.filter_cookies(aiohttp.client.URL(browser.origin + "/console/"))
    status, _, _ = await browser.post("/logout", {"csrf": csrf})
    assert status == 303
    browser.http.cookie_jar.update_cookies({"chital_console": stolen["chital_console"].value})
    status, _, _ = await browser.get("/")
    assert status == 303

    # The admin token is in no page, no error and no log line.
    assert not any(TOKEN in b for b in bodies)
    assert TOKEN not in daemon.logs()
    assert "console: console:admin logged in" in daemon.logs()


async def test_static_files_by_name_only(daemon: DaemonProcess, browser: Console) -> None:
    status, body, r = await browser.get("/static/htmx.min.js")
    assert status == 200 and r.headers["Content-Type"].startswith("application/javascript")
    shipped = (resources.files("gateway.console") / "static" / "htmx.min.js").read_bytes()
    assert hashlib.sha256(body.encode()).hexdigest() == hashlib.sha256(shipped).hexdigest()
    for path in (
        "/static/../app.py",
        "/static/..%2fapp.py",
        "/static/%2e%2e/app.py",
        "/static/%2e%2e%2fapp.py",
        "/static/..%5capp.py",
        "/static/%2fetc%2fpasswd",
        "/static//etc/passwd",
        "/static/templates%2fbase.html",
        "/static/__init__.py",
        "/static/console.css%00.py",
    ):
        async with browser.http.get(browser.origin + "/console" + path, allow_redirects=False) as r:
            text = await r.text()
        # Refused (404, or to the login for a path that left /console/static): never a file's bytes.
        assert r.status in (303, 404), (path, r.status)
        assert "import" not in text and "root:" not in text and "{%" not in text, path


async def test_xss_and_secrets_are_escaped_and_actions_reach_the_chat(
    daemon: DaemonProcess, browser: Console, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    def brain(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last.get("role") == "tool":
            return Reply(text=f"Done: {str(last.get('content'))[:120]}")
        text = last_user_text(body)
        if "SCHEDULEME" in text:
            return Reply(tool_calls=[ToolCall("schedule_task", {"text": "water the plants", "delay": "2h"})])
        return Reply(text=f"echo: {text[-80:]}")

    model.add_rule(lambda _t: True, brain)
    # Untrusted text in: a stranger's display name, a member's message and a file name.
    asked = tg.inject_message(STRANGER, STRANGER, "let me in", first_name=XSS_NAME)
    text = await answered(tg, STRANGER, asked, "pairing code is")
    code = re.search(r"pairing code is ([A-Z0-9]{8})", text).group(1)  # type: ignore[union-attr]
    said = tg.inject_message(MEMBER, MEMBER, f"{XSS_TEXT} key sk-test-key-never-logged bot {tg.token}")
    await answered(tg, MEMBER, said, "echo:")
    document = tg.add_file(b"hello", file_name=XSS_FILE, mime_type="text/plain")
    sent = tg.inject_message(MEMBER, MEMBER, "a file", document=document)
    await answered(tg, MEMBER, sent, "echo:")
    plan = tg.inject_message(MEMBER, MEMBER, "SCHEDULEME please")
    done = await answered(tg, MEMBER, plan, "Done:")
    assert "Scheduled #1" in done, done

    await browser.login()
    status, people, _ = await browser.get("/people")
    assert status == 200 and f'id="approve-{code}"' in people
    assert "&lt;script&gt;alert(&#34;name&#34;)&lt;/script&gt;&#34;onerror=alert(1)" in people, people
    assert "<script>alert" not in people and '"onerror' not in people
    status, listing, _ = await browser.get("/conversations?q=src%3Dx")
    assert "telegram:1002" in listing and "telegram:6666" not in listing, listing
    status, transcript, _ = await browser.get("/conversation?c=telegram%3A1002")
    assert status == 200
    assert "&lt;img src=x onerror=&#34;alert(2)&#34;&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in transcript
    assert "&lt;script&gt;alert(4)&lt;/script&gt;&#34;onerror=x.txt" in transcript, transcript
    assert "<img" not in transcript and "<script>alert" not in transcript
    assert "sk-test-key-never-logged" not in transcript and "key ***" in transcript, transcript
    assert tg.token not in transcript and "bot ***" in transcript, transcript
    # The agent's side: its answers, the tool call with its arguments and the tool's result.
    assert 'class="history-assistant"' in transcript and 'class="history-tool"' in transcript
    assert "schedule_task {&#34;text&#34;: &#34;water the plants&#34;" in transcript, transcript
    assert "Done: " in transcript
    _, usage, _ = await browser.get("/usage")
    assert 'id="chart-users"' in usage and ">telegram:1002<" in usage and ">default<" in usage, usage
    for page in PAGES:
        _, body, _ = await browser.get(page)
        assert "<script>alert" not in body and "<img src=x" not in body, page

    # Approve the stranger from the console: they are told, then answered; the log names the console.
    csrf = await browser.csrf()
    status, _, r = await browser.post("/people/approve", {"csrf": csrf, "code": code})
    assert status == 303 and r.headers["Location"] == "/console/people"
    _, people, _ = await browser.get("/people")
    assert 'id="notice"' in people and "Approved" in people and f'id="approve-{code}"' not in people
    await tg.wait_for(
        lambda: any("approved you" in m.text for m in tg.bot_messages(STRANGER)), what="stranger told"
    )
    again = tg.inject_message(STRANGER, STRANGER, "now may I", first_name=XSS_NAME)
    assert "echo: now may I" in await answered(tg, STRANGER, again, "echo:")
    assert f"pairing: console:admin approved telegram:{STRANGER} (code {code})" in daemon.logs()
    # Revoke them from the console: their next message gets a pairing code again; deny that one.
    status, _, _ = await browser.post("/people/revoke", {"csrf": csrf, "user": f"telegram:{STRANGER}"})
    assert status == 303
    assert f"Revoked telegram:{STRANGER}." in (await browser.get("/people"))[1]
    assert f"pairing: console:admin revoked telegram:{STRANGER}" in daemon.logs()
    later = tg.inject_message(STRANGER, STRANGER, "hello again", first_name=XSS_NAME)
    text = await answered(tg, STRANGER, later, "pairing code is")
    code2 = re.search(r"pairing code is ([A-Z0-9]{8})", text).group(1)  # type: ignore[union-attr]
    status, _, _ = await browser.post("/people/deny", {"csrf": csrf, "code": code2})
    assert status == 303 and "Denied" in (await browser.get("/people"))[1]
    await tg.wait_for(
        lambda: any("declined" in m.text for m in tg.bot_messages(STRANGER)), what="stranger told of denial"
    )
    assert f"pairing: console:admin denied telegram:{STRANGER} (code {code2})" in daemon.logs()
    status, _, _ = await browser.post("/people/approve", {"csrf": csrf, "code": "ZZZZZZZZ"})
    assert "No pending pairing code &#39;ZZZZZZZZ&#39;" in (await browser.get("/people"))[1]

    # Cancel the member's schedule from the console: their /schedules no longer lists it.
    _, schedules, _ = await browser.get("/schedules")
    assert 'id="cancel-schedule-1"' in schedules and "water the plants" in schedules
    status, _, _ = await browser.post("/schedules/cancel", {"csrf": csrf, "id": "1"})
    assert status == 303
    _, schedules, _ = await browser.get("/schedules")
    assert "Cancelled schedule #1." in schedules and 'id="cancel-schedule-1"' not in schedules
    listed = tg.inject_command(MEMBER, MEMBER, "schedules", "", chat_type="private", at=None)
    assert "No schedules in this conversation" in await answered(tg, MEMBER, listed, "schedules")
    assert "schedule #1 cancelled by console:admin" in daemon.logs()
    # A second cancel says what happened, specifically.
    await browser.post("/schedules/cancel", {"csrf": csrf, "id": "1"})
    _, schedules, _ = await browser.get("/schedules")
    assert "No such active schedule: it ended or was cancelled." in schedules
    assert TOKEN not in daemon.logs()


async def test_failed_logins_are_limited_and_sessions_expire(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    cfg = console_config(tmp_path, tg, model, login_attempts=3, login_window=3, session_ttl=3)
    async with started_daemon(tmp_path, cfg) as daemon:
        browser = Console(daemon.port)
        try:
            for n in range(3):
                status, body, _ = await browser.login(f"wrong-guess-number-{n:04d}")
                assert status == 401 and "That is not the console token." in body
            # The next attempt is refused even with the right token, with its own message.
            status, body, _ = await browser.login()
            assert status == 429 and "Too many failed logins. Try again in" in body, body
            assert "chital_console" not in {c.key for c in browser.http.cookie_jar}
            # Once the window has passed, the right token logs in.
            deadline = time.monotonic() + 60
            while (status := (await browser.login())[0]) == 429 and time.monotonic() < deadline:
                await _pause()
            assert status == 303
            status, _, _ = await browser.get("/")
            assert status == 200
            # The session ends at its expiry: the page sends the browser back to the login.
            while (status := (await browser.get("/"))[0]) == 200 and time.monotonic() < deadline:
                await _pause()
            assert status == 303
            status, body, _ = await browser.post("/people/revoke", {"user": "telegram:1", "csrf": "x"})
            assert status == 401 and "expired" in body
        finally:
            await browser.close()
        assert TOKEN not in daemon.logs()


async def _pause() -> None:
    import asyncio

    await asyncio.sleep(0.2)


def test_no_token_no_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a token there is no console at all (not one with an empty password)."""
    from aiohttp import web

    monkeypatch.delenv("CHITAL_CONSOLE_TOKEN", raising=False)
    app = web.Application()
    config = Config()
    from gateway.console import ConsoleHost

    host = ConsoleHost(config, lambda s: s, lambda: None, lambda: None, _never, _never_lines)  # type: ignore[arg-type]
    assert mount(app, host) is False
    assert not [r for r in app.router.routes() if "console" in (r.resource.canonical if r.resource else "")]
    monkeypatch.setenv("CHITAL_CONSOLE_TOKEN", "short")
    assert config.console.admin_token() is None
    monkeypatch.setenv("CHITAL_CONSOLE_TOKEN", TOKEN)
    assert config.console.admin_token() == TOKEN


async def _never() -> dict[str, Any]:
    raise AssertionError


async def _never_lines() -> list[str]:
    raise AssertionError


async def test_a_background_task_stopped_from_the_console(
    daemon: DaemonProcess, browser: Console, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The Stop button ends the task as ``/tasks stop`` does: its owner sees it stopped, and
    ``/tasks`` says who stopped it (the console)."""
    import asyncio

    held = asyncio.Event()
    model.add_rule(lambda t: "CONSOLEJOB" in t, Reply(text="never shown", hold=held))
    try:
        ask = tg.inject_command(
            MEMBER, MEMBER, "bg", "CONSOLEJOB count the stars", chat_type="private", at=None
        )
        await answered(tg, MEMBER, ask, "Started background task #1")
        await browser.login()
        _, tasks, _ = await browser.get("/tasks")
        assert 'id="stop-task-1"' in tasks and "CONSOLEJOB count the stars" in tasks
        status, _, _ = await browser.post("/tasks/stop", {"csrf": await browser.csrf(), "id": "1"})
        assert status == 303
        assert "⏹ Stopping background task #1." in (await browser.get("/tasks"))[1]
        await answered(tg, MEMBER, ask, "⏹ Stopped.")
        listing = tg.inject_command(MEMBER, MEMBER, "tasks", "", chat_type="private", at=None)
        assert "stopped by console:admin" in await answered(tg, MEMBER, listing, "Background tasks here")
        status, _, _ = await browser.post("/tasks/stop", {"csrf": await browser.csrf(), "id": "1"})
        assert "No such running background task." in (await browser.get("/tasks"))[1]
    finally:
        held.set()


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_a_standing_permission_revoked_from_the_console(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The approvals page shows a call waiting for a decision (its command text escaped) and the
    standing permission "Allow here" made; Revoke ends it as ``/approvals revoke`` does: recorded in
    the approvals log under the console's user, and the next call is asked again."""
    cfg = console_config(tmp_path, tg, model)
    cfg["agent"]["approvals"] = {"tools": ["execute"], "timeout": 600}
    cfg["agent"]["memory"] = {"enabled": False}

    def runs(word: str) -> list[Reply]:
        return [
            Reply(tool_calls=[ToolCall("execute", {"command": f"echo {word}"})]),
            Reply(text=f"Ran: {word}."),
        ]

    def buttoned() -> list[Any]:
        return [m for m in tg.bot_messages(MEMBER) if tg.buttons(MEMBER, m.message_id)]

    async with started_daemon(tmp_path, cfg) as daemon:
        browser = Console(daemon.port)
        try:
            model.script(*runs("one"))
            first = tg.inject_message(MEMBER, MEMBER, "run one", first_name=XSS_NAME)
            request: Any = await tg.wait_for(
                lambda: next(iter(buttoned()), None), what="the approval buttons"
            )
            await browser.login()
            _, page, _ = await browser.get("/approvals")
            assert "execute" in page and f"telegram:{MEMBER}" in page and "<script>alert" not in page
            tg.press_button(MEMBER, request.message_id, MEMBER, "Allow here", first_name="Mia")
            await answered(tg, MEMBER, first, "Ran: one.")
            _, page, _ = await browser.get("/approvals")
            grant = re.search(r'id="revoke-grant-([0-9]+)"', page)
            assert grant, page
            form = {"csrf": await browser.csrf(), "id": grant.group(1)}
            status, _, _ = await browser.post("/approvals/revoke", form)
            assert status == 303
            _, page, _ = await browser.get("/approvals")
            assert (
                f"Revoked standing permission #{grant.group(1)}." in page and 'id="revoke-grant-' not in page
            )
            rows = daemon_rows(cfg["storage"], "SELECT action, by_user FROM approval_log ORDER BY id")
            assert ("revoke", "console:admin") in [tuple(r) for r in rows], rows
            asked_before = len(buttoned())
            model.script(*runs("two"))
            tg.inject_message(MEMBER, MEMBER, "run two")
            await tg.wait_for(lambda: len(buttoned()) > asked_before or None, what="asked again")
        finally:
            await browser.close()


def test_a_transcript_line_is_cut() -> None:
    """A huge tool result or tool argument becomes a bounded line (a page never carries 50 MB)."""
    from langchain_core.messages import AIMessage, ToolMessage

    from agent.transcript import ARGS, TEXT_CHARS, transcript_of

    huge = "x" * 5_000_000
    lines = transcript_of(
        [
            AIMessage(content="", tool_calls=[{"name": "execute", "args": {"command": huge}, "id": "c1"}]),
            ToolMessage(content=huge, tool_call_id="c1", name="execute"),
        ]
    )
    assert [line.role for line in lines] == ["assistant", "tool"] and lines[1].name == "execute"
    assert len(lines[0].tool_calls[0]) <= len("execute ") + ARGS and lines[0].tool_calls[0].endswith("…")
    assert len(lines[1].text) == TEXT_CHARS and lines[1].text.endswith("…")


def test_without_a_token_the_daemon_imports_nothing_of_the_console() -> None:
    """An idle daemon with the console off pays nothing for it: no Jinja2, no templates (the
    listener is built as `chital run` builds it)."""
    out = run_python(
        """
        import sys
        from gateway.config.schema import Config
        from gateway.daemon import listeners
        import gateway.daemon.app
        print(sorted(m for m in sys.modules if m.startswith(("jinja2", "aiohttp_jinja2", "gateway.console"))))
        """,
        timeout=120,
    )
    assert out == "[]"
