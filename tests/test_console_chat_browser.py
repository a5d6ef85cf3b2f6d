"""The console's web chat in a real browser (headless Chromium, tests/browser.py) against `chital run`
and the fake model: a person opens a new chat from the nav, types, sends, and watches the answer
arrive through the page's event stream (static/chat.js); approves a tool call with the button under
the question; and hostile text they (or the model) wrote stays text: nothing runs, nothing is
blocked by the Content-Security-Policy because nothing even tries (docs/console.md, "Web chat")."""

from __future__ import annotations

from pathlib import Path

from tests.browser import Browser
from tests.console_support import (
    PAYLOADS,
    assert_nothing_ran,
    click,
    console_config,
    log_in,
    shots_dir,
    shows,
    until,
)
from tests.daemon import started_daemon
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram
from tests.webchat_client import brain


async def send(b: Browser, text: str) -> None:
    await b.call(lambda: b.driver.find_element("id", "chat-text").send_keys(text))
    await click(b, "#chat-send")


async def test_chat_streams_answers_takes_a_button_and_keeps_text_inert(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, browser: Browser
) -> None:
    brain(model)
    cfg = console_config(tmp_path, tg, model)
    cfg["agent"]["approvals"] = {"tools": ["write_file"], "timeout": 600}
    async with started_daemon(tmp_path, cfg) as daemon:
        await log_in(browser, daemon.port)
        await click(browser, "#nav-chat")
        await until(browser, shows("No chats yet."), "the chat list")
        await click(browser, "#new-chat")
        await until(browser, lambda d: d.find_element("id", "chat-text").is_displayed(), "the chat page")

        await send(browser, "hello from Chromium")
        await until(browser, shows("echo: hello from Chromium"), "the streamed answer")
        # Sent through the page's script: the form was cleared, the page never reloaded.
        assert (
            await browser.call(lambda: browser.driver.find_element("id", "chat-text").get_attribute("value"))
            == ""
        )

        await send(browser, PAYLOADS["text"])
        answers = "#messages .msg-bot"
        await until(
            browser, lambda d: len(d.find_elements("css selector", answers)) == 2, "the second answer"
        )
        await assert_nothing_ran(browser, "chat page, streamed")
        # The agent's Markdown is rendered (set by the page's script from the server's HTML), a
        # person's is shown as typed.
        await send(browser, "**bold** and [a link](https://example.com/x)")
        strong = "#messages .msg-bot .msg-md strong"
        await until(browser, lambda d: d.find_element("css selector", strong).text == "bold", "bold")
        link = "#messages .msg-bot .msg-md a"
        rel = await browser.call(
            lambda: browser.driver.find_element("css selector", link).get_attribute("rel")
        )
        assert rel == "noopener noreferrer nofollow", rel
        assert (
            await browser.call(
                lambda: browser.driver.find_elements("css selector", "#messages .msg-user strong")
            )
            == []
        ), "a person's Markdown is not rendered"
        await browser.call(browser.driver.refresh)
        await until(browser, shows("click me</a> [go](javascript:"), "the hostile text after a reload")
        await until(
            browser, lambda d: d.find_element("css selector", strong).text == "bold", "bold, reloaded"
        )
        await assert_nothing_ran(browser, "chat page, rendered by the server")

        await send(browser, "APPROVEME please")
        approve = "#messages .msg-buttons button.btn-primary"
        await until(
            browser, lambda d: d.find_element("css selector", approve).is_displayed(), "the Approve button"
        )
        await browser.screenshot(shots_dir(tmp_path) / "chat-conversation.png")
        await click(browser, approve)
        await until(browser, shows("Done:"), "the answer after the approval")
        assert list(daemon.sandbox_root.glob("**/outputs/x.txt")), "the approved call ran"
        await assert_nothing_ran(browser, "chat page after the approval")


async def test_a_refused_post_says_why_on_the_page(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, browser: Browser
) -> None:
    """A refusal of the gate (here a wrong CSRF token, as after a logout in another tab) was plain
    text; the page's script could not read it and said "That did not reach the daemon"."""
    brain(model)
    async with started_daemon(tmp_path, console_config(tmp_path, tg, model)) as daemon:
        await log_in(browser, daemon.port)
        await click(browser, "#nav-chat")
        await click(browser, "#new-chat")
        await until(browser, lambda d: d.find_element("id", "chat-text").is_displayed(), "the chat page")
        await browser.call(
            browser.driver.execute_script,
            "document.querySelector('#chat-form input[name=csrf]').value = 'stale';",
        )
        await send(browser, "with a stale token")
        status = "#chat-status"
        await until(
            browser, lambda d: "CSRF" in d.find_element("css selector", status).text, "the refusal's reason"
        )
        text = await browser.call(lambda: browser.driver.find_element("css selector", status).text)
        assert "did not reach" not in text, text
