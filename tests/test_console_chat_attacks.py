"""Attacks on the console's web chat beyond tests/test_console_chat.py (docs/console.md, "Web chat"):
a secret by value where the page cuts or names things, characters a database column cannot hold,
forms no page makes, a nonce carried to another chat, and an event stream that outlives its
session. Real daemon, real HTTP, as tests/test_console_chat.py."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.console_client import TOKEN, Console
from tests.console_support import console_config
from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.gateway_rig import store_at
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.webchat_client import WebChat, logged_in, new_chat


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    model.add_rule(lambda _t: True, lambda body: Reply(text=f"echo: {last_user_text(body)[-60:]}"))
    cfg = console_config(tmp_path, tg, model)
    cfg["channels"]["web"] = {"max_file_bytes": 64 * 1024, "max_files": 2, "max_streams": 2}
    async with started_daemon(tmp_path, cfg) as d:
        yield d


@pytest.fixture
async def browser(daemon: DaemonProcess) -> AsyncIterator[Console]:
    async with logged_in(daemon.port) as console:
        yield console


@pytest.fixture
async def chat(browser: Console) -> AsyncIterator[WebChat]:
    async with new_chat(browser) as c:
        yield c


async def raw_send(chat: WebChat, fields: list[tuple[str, Any, dict[str, str]]]) -> tuple[int, Any]:
    """A multipart post of exactly ``fields`` (name, value, extra add_field arguments) plus the
    session's CSRF token: forms no page makes."""
    form = aiohttp.FormData(quote_fields=False)
    form.add_field("csrf", await chat.browser.csrf())
    for name, value, extra in fields:
        form.add_field(name, value, **extra)
    headers = {"Accept": "application/json", "Origin": chat.browser.origin}
    async with chat.browser.http.post(f"{chat.url}/send", data=form, headers=headers) as r:
        text = await r.text()
        try:
            return r.status, await r.json(content_type=None)
        except ValueError:
            return r.status, text


async def test_a_secret_is_never_shown_in_part_nor_named_in_a_download(
    browser: Console, chat: WebChat
) -> None:
    # The chat list shows the first message cut: a secret across the cut must not show its head.
    status, body = await chat.send("x" * 110 + TOKEN + " is the token")
    assert status == 200, body
    await chat.answer("echo:")
    status, listing, _ = await browser.get("/chat")
    assert status == 200 and chat.chat in listing
    assert TOKEN[:10] not in listing, "the head of a secret in the chat list"
    # A secret as a file name: masked on the page and in the events, and in the download's name.
    status, body = await chat.send("a file", ((f"{TOKEN}.txt", b"data"),))
    assert status == 200, body
    mine = await chat.wait(
        lambda: next((m for m in chat.latest().values() if m["role"] == "user" and m["files"]), None),
        "the file message",
    )
    file = mine["files"][0]
    assert TOKEN not in file["name"]
    async with browser.http.get(browser.origin + file["url"]) as r:
        assert r.status == 200 and await r.read() == b"data"
        disposition = r.headers["Content-Disposition"]
    assert TOKEN not in disposition and TOKEN[:10] not in disposition, disposition


async def test_a_nul_is_answered_on_both_engines(chat: WebChat, model: FakeOpenAI) -> None:
    """A NUL is valid in a form and in SQLite, not in PostgreSQL's text or jsonb (the room, the
    agent's checkpoints): it becomes U+FFFD at parse time, so the person gets an answer on either
    engine, never a 500 or "something went wrong" (run with CHITAL_TEST_POSTGRES=1 too)."""
    status, body = await chat.send("nul\x00here \x1b[31mred")
    assert status == 200, body
    answer = await chat.answer("echo:")
    assert "\x00" not in answer["text"]
    told = [last_user_text(r) for r in model.requests if "nul" in last_user_text(r)]
    assert told and all("nul\ufffdhere" in t for t in told), told
    mine = next(m for m in chat.latest().values() if m["role"] == "user")
    assert "nul" in mine["text"] and "\x00" not in mine["text"] and "\x1b" not in mine["text"], mine


async def test_forms_no_page_makes_get_a_reason(chat: WebChat) -> None:
    ok = {"content_type": "text/plain"}
    status, body = await raw_send(chat, [("text", "no nonce", {})])
    assert status == 400 and "reload the page" in body["error"], body
    status, body = await raw_send(chat, [("nonce", "n" * 100_000, {}), ("text", "huge nonce", {})])
    assert status == 400 and "reload the page" in body["error"], body
    status, body = await raw_send(chat, [("nonce", secrets.token_urlsafe(18), {})])
    assert status == 400 and "Type a message" in body["error"], body
    # "files" as a plain field, not a file: not a file, and nothing else breaks.
    fields = [("nonce", secrets.token_urlsafe(18), {}), ("text", "plain files", {}), ("files", "x", ok)]
    status, body = await raw_send(chat, fields)
    assert status == 200 and body["ok"], body
    await chat.answer("echo: plain files")
    # A repeated nonce or text: the first of each, one message.
    first = secrets.token_urlsafe(18)
    fields = [("nonce", first, {}), ("nonce", secrets.token_urlsafe(18), {}), ("text", "one", {}),
              ("text", "two", {})]  # fmt: skip
    status, body = await raw_send(chat, fields)
    assert status == 200 and body["id"] == f"u-{first}", body


async def test_a_nonce_carried_to_another_chat_is_not_a_silent_half_message(
    browser: Console, chat: WebChat
) -> None:
    """A page's nonce names one message of one chat. Posted into another chat it must not be
    journaled there while that chat's page never shows it (the room's ids are global)."""
    nonce = secrets.token_urlsafe(18)
    status, body = await chat.send("in the first chat", nonce=nonce)
    assert status == 200, body
    await chat.answer("echo: in the first chat")
    other = await WebChat.new(browser)
    other.listen()
    try:
        status, body = await other.send("in the second chat", nonce=nonce)
        if status == 200:  # taken: then the second chat shows it, and it is answered there
            await other.wait(
                lambda: any(m["text"] == "in the second chat" for m in other.latest().values()),
                "the message on its own page",
            )
        else:
            assert status == 400 and "reload the page" in body["error"], (status, body)
    finally:
        await other.close()


async def test_an_event_stream_ends_at_logout(browser: Console, chat: WebChat) -> None:
    await chat.send("hello")
    await chat.answer("echo: hello")
    assert not chat.stream_ended.is_set()
    status, _, _ = await browser.post("/logout", {"csrf": await browser.csrf()})
    assert status == 303
    await asyncio.wait_for(chat.stream_ended.wait(), 30)


async def test_a_retry_after_a_failed_post_is_the_message_the_page_shows(
    daemon: DaemonProcess, chat: WebChat, model: FakeOpenAI
) -> None:
    """The worst moment: the first try was stored in the room, then the gateway refused it (a 503
    while the daemon stopped), and the person edits the text before pressing Send again with the
    same nonce. The page shows the first try; the agent must answer that one, not another text."""
    nonce = secrets.token_urlsafe(18)
    store = await store_at(Path(daemon.config["storage"]["path"]) / "gateway.sqlite")
    try:  # the first try's state: in the room, not in the journal
        await store.web_add(chat.chat, "admin", f"u-{nonce}", "user", "admin", "what the page shows")
    finally:
        await store.close()
    status, body = await chat.send("edited before the retry", nonce=nonce)
    assert status == 200 and body["id"] == f"u-{nonce}", body
    await chat.answer("echo: what the page shows")
    told = [last_user_text(r) for r in model.requests]
    assert not any("edited before the retry" in t for t in told), told
    mine = [m["text"] for m in chat.latest().values() if m["role"] == "user"]
    assert mine == ["what the page shows"], mine


async def test_a_stream_pushed_out_tells_the_page_not_to_reconnect(browser: Console, chat: WebChat) -> None:
    """Past ``max_streams`` the oldest stream is closed. A plain end makes the browser reconnect
    a second later (``retry: 1000``), closing the next oldest, round and round, for as long as
    the pages stay open: the pushed-out stream says ``closed`` so the page's script waits until
    it is looked at again (static/chat.js)."""

    async def read_all() -> str:
        async with browser.http.get(f"{chat.url}/events", timeout=aiohttp.ClientTimeout(total=120)) as r:
            assert r.status == 200
            return (await r.read()).decode()

    first = asyncio.create_task(read_all())
    await asyncio.sleep(0.5)
    newer = [WebChat(browser, chat.chat) for _ in range(2)]  # the fixture's own stream is one more
    for n in newer:
        n.listen()
    try:
        body = await asyncio.wait_for(first, 60)
        assert "event: closed" in body, body[-300:]
    finally:
        for n in newer:
            await n.close()


async def test_a_form_of_thousands_of_parts_is_refused_before_it_is_kept(
    daemon: DaemonProcess, chat: WebChat
) -> None:
    # Tiny file parts: each one was a temporary file on the daemon's disk (aiohttp's post()); the
    # body is far under the size limit, so only a part count stops it.
    many = [("files", b"x", {"filename": f"f{i}.txt", "content_type": "text/plain"}) for i in range(3000)]
    status, body = await raw_send(chat, [("text", "hi", {}), ("nonce", "n", {}), *many])
    assert status == 413, body
    assert "more than 10 parts" in str(body), body  # max_files 2 + 8
    # Not even a login form (no session needed) may hold many parts.
    form = aiohttp.FormData(quote_fields=False)
    for _ in range(3000):
        form.add_field("token", "x", content_type="text/plain")
    one_file = aiohttp.FormData(quote_fields=False)
    one_file.add_field("token", b"x", filename="t.txt", content_type="text/plain")
    origin = {"Origin": chat.browser.origin}
    login = f"http://127.0.0.1:{daemon.port}/console/login"
    async with aiohttp.ClientSession() as http:
        async with http.post(login, data=form, headers=origin) as r:
            assert r.status == 413, await r.text()
            assert "more than 16 parts" in await r.text()
        async with http.post(login, data=one_file, headers=origin) as r:
            assert r.status == 413 and "takes no files" in await r.text()
    # The daemon goes on: the chat's next message is answered.
    status, body = await chat.send("after the flood")
    assert status == 200, body
    await chat.answer("echo: after the flood")


async def test_a_nul_from_the_model_or_a_tool_is_answered_on_both_engines(
    chat: WebChat, model: FakeOpenAI
) -> None:
    """The model's text and a command's output are not parsed by a channel: a NUL in either must
    not break the thread's checkpoints on PostgreSQL (run with CHITAL_TEST_POSTGRES=1 too)."""
    model.script(Reply(text="from\x00the model"))
    status, body = await chat.send("model nul please")
    assert status == 200, body
    answer = await chat.answer("the model")
    assert "\x00" not in answer["text"], answer
    call = ToolCall("execute", {"command": "printf 'tool\\000out'"})
    model.script(Reply(tool_calls=[call]), Reply(text="ran it"))
    status, body = await chat.send("tool nul please")
    assert status == 200, body
    await chat.answer("ran it")
    told = [m for r in model.requests for m in r.get("messages", []) if m.get("role") == "tool"]
    assert any("tool" in str(m.get("content")) and "out" in str(m.get("content")) for m in told), told
    status, body = await chat.send("and after")
    assert status == 200, body
    await chat.answer("echo: and after")


async def test_the_agents_markdown_is_rendered_and_stays_inert(
    browser: Console, chat: WebChat, model: FakeOpenAI
) -> None:
    """A bot message is Markdown the server renders (gateway/console/markdown.py), in its event and
    in the page; a person's text is shown as typed; the model's HTML, script links and images stay
    text; a secret that markup splits is shown as plain text, never joined (docs/console.md)."""
    model.script(
        Reply(
            text="**Done**: see below\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n[go](javascript:alert(1))"
            " <img src=x onerror=alert(1)> ![p](https://evil.example/p.png)"
        )
    )
    status, body = await chat.send("**mine** stays as typed")
    assert status == 200, body
    answer = await chat.answer("Done")
    html = answer["html"]
    assert "<strong>Done</strong>" in html and "<td>1</td>" in html, html
    assert 'href="javascript' not in html and "<img" not in html, html
    assert '<a href="https://evil.example/p.png" rel="noopener noreferrer nofollow"' in html, html
    mine = next(m for m in chat.latest().values() if m["role"] == "user")
    assert "html" not in mine and mine["text"] == "**mine** stays as typed", mine
    status, page, _ = await browser.get(f"/chat/{chat.chat}")
    assert status == 200
    assert '<div class="msg-text msg-md"><p><strong>Done</strong>' in page and "<td>2</td>" in page
    assert "**mine** stays as typed" in page and "<strong>mine</strong>" not in page
    assert "<img src=x" not in page and 'href="javascript' not in page

    half = len(TOKEN) // 2
    model.script(Reply(text=f"the key: {TOKEN[:half]}**{TOKEN[half:]}**"))
    status, body = await chat.send("show me the key")
    assert status == 200, body
    answer = await chat.answer("the key:")
    assert "html" not in answer and answer["text"].endswith("**"), answer
    status, page, _ = await browser.get(f"/chat/{chat.chat}")
    assert status == 200 and TOKEN not in page and f"<strong>{TOKEN[half:]}" not in page
