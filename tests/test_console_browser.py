"""The operator console in a real browser (headless Chromium, tests/browser.py) against `chital run`
on the fake Telegram and the fake model: a person logs in through the form, walks every page,
approves a pairing request and cancels a schedule, and each is seen in the chat; then the attacks a
console invites, as only a browser shows them: no session, a forged form from another site and
from another port of the same host (SameSite=Strict, the Origin check), a missing or wrong CSRF
token, the console framed by another page, a script reading the cookie, untrusted text (a display
name, a message, a file name) that would run script, and traversal in static file URLs.

The HTTP-level twins of these checks are in tests/test_console.py; this file asserts what only a
browser decides: which cookies it sends, what runs, what the Content-Security-Policy blocks.
Screenshots of each page go to ``$CHITAL_CONSOLE_SCREENSHOTS`` when set (docs/console.md,
"Screenshots"), to the test's temporary directory otherwise.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.browser import Browser
from tests.console_support import (
    ADMIN,
    MEMBER,
    PAYLOADS,
    STRANGER,
    alert_open,
    answered,
    assert_nothing_ran,
    click,
    console_config,
    csp_violations,
    echo_and_schedule,
    heading,
    log_in,
    shots_dir,
    shows,
    until,
)
from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

PAGES = (
    # nav id, its page's <h1>, the id of what the page is for
    ("overview", "Overview", "channels"),
    ("chat", "Chat with the agent", "chats"),
    ("conversations", "Conversations", "conversations"),
    ("people", "People", "pending"),
    ("approvals", "Approvals", "approvals-pending"),
    ("schedules", "Schedules", "schedules"),
    ("tasks", "Background tasks", "tasks"),
    ("usage", "Usage", "chart-days"),
    ("skills", "Skills and MCP servers", "skills"),
)
QUEUE_JS = (
    "const t = document.getElementById('queue'); const [h, v] = t.rows;"
    " return Object.fromEntries([...h.cells].map((c, i) => [c.textContent, v.cells[i].textContent]));"
)
"""The overview's queue table as {state: count}."""
CHART_BARS = "svg#chart-users rect.bar, svg#chart-models rect.bar"


async def page_text(b: Browser, element_id: str) -> str:
    """The element's text, read again when a boosted swap replaced it under us (a stale element:
    the walk failed so in a loaded run); ``until`` ignores stale and missing elements."""
    found = await until(b, lambda d: [d.find_element("id", element_id).text], f"the text of #{element_id}")
    return str(found[0])


def refreshed(needle: str) -> Any:
    """A condition: the page shows ``needle``; it is reloaded each time it does not."""

    def check(driver: Any) -> bool:
        if needle in driver.find_element("tag name", "body").text:
            return True
        driver.refresh()
        return False

    return check


def settled_queue(driver: Any) -> bool:
    """A condition: the overview's queue shows no running entry; the page is reloaded until then."""
    if driver.execute_script(QUEUE_JS).get("running") == "0":
        return True
    driver.refresh()
    return False


async def test_walk_every_page_approve_a_stranger_and_cancel_a_schedule(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, browser: Browser
) -> None:
    echo_and_schedule(model)
    shots = shots_dir(tmp_path)
    async with started_daemon(tmp_path, console_config(tmp_path, tg, model)) as daemon:
        # The admin has talked to the bot (the fake Telegram knows their chat), so the pairing
        # request's notice to them is delivered rather than failing with "Chat not found".
        hello = tg.inject_message(ADMIN, ADMIN, "hello", first_name="Hedy")
        await answered(tg, ADMIN, hello, "echo:")
        asked = tg.inject_message(STRANGER, STRANGER, "hello, may I use the bot?", first_name="Ada")
        text = await answered(tg, STRANGER, asked, "pairing code is")
        code = re.search(r"pairing code is ([A-Z0-9]{8})", text).group(1)  # type: ignore[union-attr]
        said = tg.inject_message(MEMBER, MEMBER, "what is the capital of Peru?", first_name="Grace")
        await answered(tg, MEMBER, said, "echo:")
        document = tg.add_file(b"a,b\n1,2\n", file_name="sales-2026.csv", mime_type="text/csv")
        sent = tg.inject_message(
            MEMBER, MEMBER, "here are the numbers", first_name="Grace", document=document
        )
        await answered(tg, MEMBER, sent, "echo:")
        plan = tg.inject_message(MEMBER, MEMBER, "SCHEDULEME in two hours", first_name="Grace")
        assert "Scheduled #1" in await answered(tg, MEMBER, plan, "Done:")

        # No session: the console sends the browser to its login page, which takes the token.
        await b_get(browser, daemon.port, "/people")
        await until(browser, heading("Chital console"), "the login page instead of People")
        assert (await browser.url()).endswith("/console/login")
        await browser.screenshot(shots / "login.png")
        await log_in(browser, daemon.port)
        cookie = {c["name"]: c for c in await browser.cookies()}["chital_console"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console", cookie

        # Every page, reached by its link in the nav, shows what it is for.
        for nav, title, main in PAGES:
            await click(browser, f"#nav-{nav}")
            await until(browser, heading(title), f"the {title} page")
            await until(
                browser, lambda d, m=main: d.find_element("id", m).is_displayed(), f"#{main} on {title}"
            )
            assert (await browser.url()).split("/console", 1)[1] in (f"/{nav}", "/")
            shown = await page_text(browser, main)
            if nav == "overview":
                assert re.search(r"telegram\s+connected", shown), shown
                # An answer is in the chat a moment before its entry is marked done (on a loaded
                # machine, long enough for this page): reload until nothing runs, then none failed.
                await until(browser, settled_queue, "the overview's queue with no turn running")
                queue = await browser.call(browser.driver.execute_script, QUEUE_JS)
                assert queue["failed"] == "0", queue  # every turn answered
                assert "Daemon" in await page_text(browser, "ready")
                assert await page_text(browser, "summary")
            elif nav == "conversations":
                assert f"telegram:{MEMBER}" in shown and f"telegram:{STRANGER}" in shown, shown
            elif nav == "people":
                assert code in shown and "Ada" in shown and f"telegram:{STRANGER}" in shown, shown
                assert str(MEMBER) in await page_text(browser, "config-users")
            elif nav == "schedules":
                assert "water the plants" in shown and f"telegram:{MEMBER}" in shown, shown
            elif nav == "usage":  # usage is written in the background: reload until it shows
                await until(browser, refreshed(f"telegram:{MEMBER}"), "the usage per user")
                bars = await browser.call(browser.driver.find_elements, "css selector", CHART_BARS)
                assert len(bars) >= 2, "the usage charts are not drawn: " + await browser.text()
            elif nav in ("approvals", "tasks"):
                assert "None." in shown, shown
            await browser.screenshot(shots / f"{nav}.png")

        # A conversation's transcript: found by searching, opened by its link.
        await click(browser, "#nav-conversations")
        await until(browser, heading("Conversations"), "the conversations page")
        await browser.call(lambda: browser.driver.find_element("id", "q").send_keys("Peru"))
        await click(browser, "#search-submit")
        await until(browser, lambda d: "Peru" in d.current_url, "the search's results")
        listed = await page_text(browser, "conversations")
        assert f"telegram:{MEMBER}" in listed and f"telegram:{STRANGER}" not in listed, listed
        await click(browser, "a.conversation-link")
        await until(browser, heading(f"Conversation telegram:{MEMBER}"), "the member's transcript")
        transcript = await page_text(browser, "transcript")
        for seen in ("what is the capital of Peru?", "here are the numbers", "sales-2026.csv", "Grace"):
            assert seen in transcript, (seen, transcript)
        history = await page_text(browser, "history")  # the agent's side: answers, the tool call
        for seen in ("echo: what is the capital of Peru?", "schedule_task", "water the plants", "Done: "):
            assert seen in history, (seen, history)
        await browser.screenshot(shots / "conversation.png")

        # Approve the stranger: the notice says so, the request leaves the list, the chat is told
        # and the stranger's next message is answered by the model.
        await click(browser, "#nav-people")
        await until(browser, heading("People"), "the people page")
        await click(browser, f"#approve-{code}")
        await until(browser, lambda d: d.find_element("id", "notice").text, "the approval's notice")
        assert "Approved" in await page_text(browser, "notice")
        assert code not in await page_text(browser, "pending")
        await tg.wait_for(
            lambda: any("approved you" in m.text for m in tg.bot_messages(STRANGER)), timeout=60, what="told"
        )
        again = tg.inject_message(STRANGER, STRANGER, "thank you", first_name="Ada")
        assert "echo: thank you" in await answered(tg, STRANGER, again, "echo:")
        assert f"pairing: console:admin approved telegram:{STRANGER} (code {code})" in daemon.logs()

        # Cancel the member's schedule: gone from the page and from the member's /schedules.
        await click(browser, "#nav-schedules")
        await until(browser, heading("Schedules"), "the schedules page")
        await click(browser, "#cancel-schedule-1")
        await until(browser, shows("Cancelled schedule #1."), "the cancel's notice")
        assert "water the plants" not in await page_text(browser, "schedules")
        listed_in_chat = tg.inject_command(MEMBER, MEMBER, "schedules", "", chat_type="private", at=None)
        assert "No schedules in this conversation" in await answered(tg, MEMBER, listed_in_chat, "schedules")

        # Logging out ends the session: the pages send the browser back to the login.
        await click(browser, "#logout")
        await until(browser, heading("Chital console"), "the login page after logging out")
        await b_get(browser, daemon.port, "/")
        await until(browser, heading("Chital console"), "the login page, the session ended")


async def b_get(b: Browser, port: int, path: str) -> None:
    await b.get(f"http://127.0.0.1:{port}/console{path}")


async def test_untrusted_text_renders_as_text_and_the_csp_blocks_what_would_get_in(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, browser: Browser
) -> None:
    echo_and_schedule(model)
    async with started_daemon(tmp_path, console_config(tmp_path, tg, model)) as daemon:
        asked = tg.inject_message(STRANGER, STRANGER, "let me in", first_name=PAYLOADS["name"])
        text = await answered(tg, STRANGER, asked, "pairing code is")
        code = re.search(r"pairing code is ([A-Z0-9]{8})", text).group(1)  # type: ignore[union-attr]
        said = tg.inject_message(MEMBER, MEMBER, PAYLOADS["text"])
        await answered(tg, MEMBER, said, "echo:")
        document = tg.add_file(b"hello", file_name=PAYLOADS["file"], mime_type="text/plain")
        sent = tg.inject_message(MEMBER, MEMBER, "a file", document=document)
        await answered(tg, MEMBER, sent, "echo:")

        await log_in(browser, daemon.port)
        await browser.logs()  # what the login page logged is not this test's
        pages = [f"/{nav}" if nav != "overview" else "/" for nav, _, _ in PAGES]
        pages += [f"/conversation?c=telegram%3A{MEMBER}", f"/conversation?c=telegram%3A{STRANGER}"]
        for path in pages:
            await b_get(browser, daemon.port, path)
            await until(browser, lambda d: d.find_element("css selector", "h1").text, f"{path} loaded")
            await assert_nothing_ran(browser, path)
            if path == "/people":  # names are stored cut to a bound: the payload's start shows
                assert PAYLOADS["name"][:80] in await page_text(browser, "pending")
            if path.endswith(str(MEMBER)):
                transcript = await page_text(browser, "transcript")
                assert PAYLOADS["text"] in transcript, transcript
                assert "onerror=alert(4)>.txt" in transcript and "chitalPwned" in transcript, transcript
            if path.endswith(str(STRANGER)):
                assert PAYLOADS["name"][:80] in await page_text(browser, "transcript")
        assert code in (await b_text(browser, daemon.port, "/people"))

        # Defence in depth: markup put into a console page by a script (as a missed escape would)
        # does not run: the Content-Security-Policy refuses inline script and inline handlers, and
        # the browser says so in its console.
        await browser.call(
            lambda: browser.driver.execute_script(
                "const s = document.createElement('script');"
                "s.textContent = \"window.chitalPwned = 'inline'\"; document.body.appendChild(s);"
                "document.getElementById('main').insertAdjacentHTML('beforeend',"
                ' \'<img id="probe" src="/console/static/none.png" onerror="window.chitalPwned=1">\');'
            )
        )
        seen: list[str] = []

        async def violations() -> bool:
            seen.extend(await csp_violations(browser))
            return any("inline script" in m for m in seen) and any("inline event handler" in m for m in seen)

        await poll(violations, "CSP violations for the inline script and the inline handler")
        assert await browser.call(lambda: browser.driver.execute_script("return window.chitalPwned")) is None
        assert await alert_open(browser) is None


async def poll(check: Any, what: str, timeout: float = 60) -> None:
    """Wait until the coroutine function ``check`` returns True (re-checked every 0.2 s)."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        await asyncio.sleep(0.2)


async def b_text(b: Browser, port: int, path: str) -> str:
    await b_get(b, port, path)
    await until(b, lambda d: d.find_element("css selector", "h1").text, f"{path} loaded")
    return await b.text()


@asynccontextmanager
async def attacker(host: str, daemon_port: int) -> AsyncIterator[str]:
    """Another site's pages (an aiohttp server on ``host``), yielding its origin: ``/forge`` posts a
    form to the console by itself (fields from the query), ``/link`` links to the console's People
    page, ``/frame`` frames it."""
    console = f"http://127.0.0.1:{daemon_port}/console"

    async def forge(request: web.Request) -> web.Response:
        fields = "".join(
            f'<input type="hidden" name="{k}" value="{v}">' for k, v in request.query.items() if k != "to"
        )
        html = (
            f'<form id="f" method="post" action="{console}{request.query["to"]}">{fields}</form>'
            "<script>document.getElementById('f').submit()</script>"
        )
        return web.Response(text=html, content_type="text/html")

    async def link(_: web.Request) -> web.Response:
        return web.Response(text=f'<a id="go" href="{console}/people">prize</a>', content_type="text/html")

    async def frame(_: web.Request) -> web.Response:
        html = f'<h1>Click to win</h1><iframe id="console" src="{console}/people"></iframe>'
        return web.Response(text=html, content_type="text/html")

    app = web.Application()
    app.router.add_get("/forge", forge)
    app.router.add_get("/link", link)
    app.router.add_get("/frame", frame)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def test_forged_requests_framing_and_traversal_are_refused(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, browser: Browser
) -> None:
    echo_and_schedule(model)
    # Two attackers. Another site (127.0.0.2, another host: SameSite says cross-site), which the
    # config even lists as an allowed origin so that only SameSite=Strict stands in its way; and
    # another port of the console's own host (same site: the browser sends the cookie), which only
    # the Origin check stops.
    cfg = console_config(tmp_path, tg, model)
    async with (
        attacker("127.0.0.2", cfg["http"]["port"]) as other_site,
        attacker("127.0.0.1", cfg["http"]["port"]) as same_site,
    ):
        cfg["console"]["origins"] = [other_site]
        async with started_daemon(tmp_path, cfg) as daemon:
            await forged_framed_and_traversed(browser, tg, daemon, other_site, same_site)


async def forged_framed_and_traversed(
    browser: Browser, tg: FakeTelegram, daemon: DaemonProcess, other_site: str, same_site: str
) -> None:
    asked = tg.inject_message(STRANGER, STRANGER, "let me in", first_name="Mallory")
    text = await answered(tg, STRANGER, asked, "pairing code is")
    code = re.search(r"pairing code is ([A-Z0-9]{8})", text).group(1)  # type: ignore[union-attr]

    # No session: every page, a transcript and an unknown page send the browser to the login;
    # a forged form without a session is refused.
    for path in ("/", "/people", f"/conversation?c=telegram%3A{STRANGER}", "/schedules", "/no-such-page"):
        await b_get(browser, daemon.port, path)
        await until(browser, heading("Chital console"), f"the login page instead of {path}")
    await browser.get(f"{same_site}/forge?to=/people/approve&code={code}")
    refused = lambda d: re.search(r"Refused|No console session", d.find_element("tag name", "body").text)  # noqa: E731
    await until(browser, refused, "the forged form's refusal without a session")
    await log_in(browser, daemon.port, "not-the-console-token-at-all", lands_on=None)
    await until(browser, shows("That is not the console token."), "the wrong token's refusal")

    await log_in(browser, daemon.port)
    # HttpOnly: the page's scripts cannot read the session cookie.
    assert "chital_console" not in await browser.call(
        lambda: browser.driver.execute_script("return document.cookie")
    )
    await b_text(browser, daemon.port, "/people")
    stolen = await browser.call(
        lambda: browser.driver.execute_script(f"return document.querySelector('#approve-form-{code} [name=csrf]').value")
    )  # fmt: skip

    # A wrong CSRF token, then none: refused, the request stays pending. The token is changed and
    # the button pressed in one script, so no page load can come between them (a loaded run once
    # pressed a freshly loaded form, whose token was right, and the approval went through).
    # The first character is changed to one it is not: a random token starts with "x" one time
    # in 64, and a fixed "x" then left it right (CI once saw the approval go through).
    wrong = "el.value = (el.value[0] === 'x' ? 'y' : 'x') + el.value.slice(1)"
    for change in (wrong, "el.remove()"):
        await b_text(browser, daemon.port, "/people")
        await browser.call(
            lambda c=change: browser.driver.execute_script(
                f"const el = document.querySelector('#approve-form-{code} [name=csrf]'); {c};"
                f" document.querySelector('#approve-{code}').click();"
            )
        )
        await until(browser, shows("CSRF token is missing or wrong"), f"the refusal after {change}")

    # Forged forms carrying the stolen CSRF token: from another site the browser leaves the
    # cookie out (no session); from another port of this host it sends it, and the Origin
    # check refuses.
    forged = f"/forge?to=/people/approve&code={code}&csrf={stolen}"
    await browser.get(other_site + forged)
    await until(browser, shows("No console session"), "the cross-site form's refusal")
    await browser.get(same_site + forged)
    await until(browser, shows("Origin check"), "the same-site form's refusal")

    # A link from another site opens the login page (a Strict cookie is not sent on a
    # cross-site navigation) though the session is alive: typed in, the page shows.
    await browser.get(f"{other_site}/link")
    await click(browser, "#go")
    await until(browser, heading("Chital console"), "the login page after a cross-site link")
    assert code in await b_text(browser, daemon.port, "/people")

    # Framed by another page (clickjacking): the browser refuses to show the console in it.
    await browser.logs()
    await browser.get(f"{same_site}/frame")
    seen: list[str] = []

    async def refused_frame() -> bool:
        seen.extend(str(e["message"]) for e in await browser.logs())
        return any("frame-ancestors" in m or "X-Frame-Options" in m for m in seen)

    await poll(refused_frame, "the browser's refusal to frame the console")

    # Static files by name only: traversal, encoded or not, reaches no other file.
    await b_get(browser, daemon.port, "/")
    assert await browser.call(lambda: browser.driver.execute_script("return typeof htmx")) == "object"
    for path in ("../app.py", "..%2fapp.py", "%2e%2e/auth.py", "%2e%2e%2fauth.py", "..%5capp.py",
                 "..%2f..%2f..%2fpyproject.toml", "%2fetc%2fpasswd", "templates%2fbase.html", "console.css%00"):  # fmt: skip
        await b_get(browser, daemon.port, f"/static/{path}")
        await until(browser, lambda d: d.find_element("tag name", "body"), f"static {path}")
        shown = await browser.source()
        for leak in ("import ", "root:", "{%", "[project]"):
            assert leak not in shown, (path, shown[:300])

    # None of it acted: the request is still pending, the stranger was told nothing more.
    assert code in await page_text_of(browser, daemon.port, "/people", "pending")
    assert not any("approved you" in m.text for m in tg.bot_messages(STRANGER))
    assert "approved telegram:" not in daemon.logs()
    assert "refused: cross-origin" in daemon.logs() and "refused: no or a wrong CSRF token" in daemon.logs()


async def page_text_of(b: Browser, port: int, path: str, element_id: str) -> str:
    await b_text(b, port, path)
    return await page_text(b, element_id)
