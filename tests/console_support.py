"""What the console's end-to-end tests share (tests/test_console.py over HTTP, tests/test_console_browser.py
in headless Chromium): the daemon's config with the console on, the people it knows, the hostile
strings they type, waiting for the bot's answer in the fake Telegram, and driving the browser
through the console's pages by their ids (docs/console.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.browser import Browser
from tests.console_client import TOKEN
from tests.daemon import chat_config
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram

ADMIN = 1001
MEMBER = 1002
STRANGER = 6666
XSS_NAME = '<script>alert("name")</script>"onerror=alert(1)'
XSS_TEXT = '<img src=x onerror="alert(2)"><script>alert(3)</script>'
XSS_FILE = '<script>alert(4)</script>"onerror=x.txt'
WAIT = 60.0
"""Seconds a browser waits for a page to show what it should (a loaded 2-core machine is slow;
the wait ends as soon as the condition holds)."""


def console_config(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, **console: Any) -> dict[str, Any]:
    """A daemon on the fake Telegram with the console on: MEMBER allowed, ADMIN an admin, pairing
    on (a stranger gets a code the console can approve); ``console`` merged into its section."""
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[str(MEMBER)], console={"token": TOKEN, **console})
    cfg["access"].update(admins=[str(ADMIN)], pairing=True)
    return cfg


def echo_and_schedule(model: FakeOpenAI) -> None:
    """The fake model echoes each message; one holding SCHEDULEME asks for a schedule ("water the
    plants" in 2 h), and a tool's result is answered "Done: <result>"."""

    def brain(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last.get("role") == "tool":
            return Reply(text=f"Done: {str(last.get('content'))[:120]}")
        text = last_user_text(body)
        if "SCHEDULEME" in text:
            return Reply(tool_calls=[ToolCall("schedule_task", {"text": "water the plants", "delay": "2h"})])
        return Reply(text=f"echo: {text[-80:]}")

    model.add_rule(lambda _t: True, brain)


async def answered(tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str) -> str:
    """The bot's reply to ``update`` holding ``needle`` (waits for it)."""
    mid = update["message"]["message_id"]

    def check() -> Any:
        for m in tg.bot_messages(chat):
            if m.reply_to == mid and needle in m.text:
                return str(m.text)
        return None

    return str(await tg.wait_for(check, timeout=WAIT, what=f"reply with {needle!r}"))


# -- the browser's side -----------------------------------------------------------------------------


async def until(b: Browser, check: Any, what: str, timeout: float = WAIT) -> Any:
    """Wait until ``check(driver)`` is truthy and return it; on timeout fail saying ``what`` and
    showing the page the browser is on (its URL and visible text)."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver.support.wait import WebDriverWait

    # A boosted link swaps the page's body: an element found a moment ago may be gone (stale).
    ignored = (NoSuchElementException, StaleElementReferenceException)
    wait = WebDriverWait(b.driver, timeout, poll_frequency=0.2, ignored_exceptions=ignored)
    try:
        return await b.call(lambda: wait.until(check))
    except TimeoutException:
        raise AssertionError(
            f"{what}: not within {timeout:.0f} s on {await b.url()}:\n{await b.text()}"
        ) from None


def heading(text: str) -> Any:
    """A condition: the page's <h1> reads ``text`` (a page, or a boosted swap, has arrived)."""

    def check(driver: Any) -> bool:
        return bool(driver.find_element("css selector", "h1").text == text)

    return check


def shows(needle: str) -> Any:
    """A condition: the page's visible text holds ``needle``."""
    return lambda driver: needle in driver.find_element("tag name", "body").text


async def click(b: Browser, css: str) -> None:
    """Click ``css`` once it is on the page and takes a click, as a person waits for a page to load
    before clicking: right after a boosted link the element may not be there yet, or be stale."""
    from selenium.common.exceptions import (
        ElementClickInterceptedException,
        ElementNotInteractableException,
    )

    def clicked(driver: Any) -> bool:
        try:
            driver.find_element("css selector", css).click()
        except (ElementClickInterceptedException, ElementNotInteractableException):
            return False
        return True

    await until(b, clicked, f"a clickable {css}")


async def log_in(b: Browser, port: int, token: str = TOKEN, lands_on: str | None = "Overview") -> None:
    """Log in as a person does: open the console, land on the login page, type the token, submit,
    and (unless ``lands_on`` is None, as for a wrong token) wait for the page the login leads to."""
    await b.get(f"http://127.0.0.1:{port}/console/")
    await until(b, heading("Chital console"), "the login page")
    await b.call(lambda: b.driver.find_element("id", "token").send_keys(token))
    await click(b, "#login-submit")
    if lands_on is not None:
        await until(b, heading(lands_on), f"the {lands_on.lower()} after logging in")


# -- what a payload would leave (the browser tests of the console and the web chat) ----------------
NOTHING_RAN_JS = (
    "const ours = location.origin + '/console/static/';"
    " return {pwned: window.chitalPwned === undefined ? null : String(window.chitalPwned),"
    " jsLinks: [...document.querySelectorAll('a[href]')].filter(a => a.protocol === 'javascript:').length,"
    " imgs: [...document.images].filter(i => !i.src.startsWith(ours)).length,"
    " handlers: [...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,"
    " scripts: [...document.scripts].filter(s => !s.src.startsWith(ours)).length}"
)  # fmt: skip
"""What a payload would leave if it had become live markup or run (see :func:`assert_nothing_ran`)."""
PAYLOADS = {
    # A display name, a message and a file name, each trying a script, an inline handler and a
    # javascript: link; each would set window.chitalPwned and open an alert if it ever ran.
    "name": "<script>window.chitalPwned='name';alert('name')</script><img src=x onerror=\"window.chitalPwned='name-img'\">",
    "text": "<img src=x onerror=\"window.chitalPwned='text';alert(2)\"> <a href=\"javascript:window.chitalPwned='link'\">click me</a> [go](javascript:alert(document.domain)) <svg onload=\"window.chitalPwned='svg'\">",
    "file": "<script>window.chitalPwned='file'</script><img src=x onerror=alert(4)>.txt",
}  # fmt: skip


def shots_dir(tmp_path: Path) -> Path:
    """Where screenshots go: ``$CHITAL_CONSOLE_SCREENSHOTS`` (docs/console/ to refresh the docs'),
    else the test's own directory (the screenshot is still taken: a page that cannot render fails)."""
    where = Path(os.environ.get("CHITAL_CONSOLE_SCREENSHOTS") or tmp_path / "shots")
    where.mkdir(parents=True, exist_ok=True)
    return where


async def csp_violations(b: Browser) -> list[str]:
    """The browser console's messages since the last call that name the Content-Security-Policy."""
    return [str(e["message"]) for e in await b.logs() if "Content Security Policy" in str(e["message"])]


async def alert_open(b: Browser) -> str | None:
    """The text of an alert the page opened, or None."""
    from selenium.common.exceptions import NoAlertPresentException

    def check() -> str | None:
        try:
            return str(b.driver.switch_to.alert.text)
        except NoAlertPresentException:
            return None

    return await b.call(check)


async def assert_nothing_ran(b: Browser, where: str) -> None:
    """No alert is open, no payload's side effect happened, no live element of a payload is in the
    page (no javascript: link, no image or script but the console's own static files, no handler
    attribute) and the browser logged no Content-Security-Policy violation (nothing even tried)."""
    assert await alert_open(b) is None, where
    found = await b.call(b.driver.execute_script, NOTHING_RAN_JS)
    assert found["pwned"] is None and not found["jsLinks"] and not found["imgs"], (where, found)
    assert not found["handlers"] and not found["scripts"], (where, found)
    assert await csp_violations(b) == [], where
    assert not [e for e in await b.logs() if "chitalPwned" in str(e["message"])], where
