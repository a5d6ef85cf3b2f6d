"""The console's web chat over real HTTP against `chital run` (docs/console.md, "Web chat"): a
logged-in person talks to the agent through the gateway's own path (journaled, streamed as Server-Sent
Events, files in and out, approvals as buttons), and the attacks such a page invites: no session,
another person's chat, a forged or cross-origin post, a button the message does not carry, a file id
that walks out of its chat, hostile text and file names, oversized posts, too many streams."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.console_client import Console
from tests.console_support import XSS_FILE, XSS_TEXT, console_config
from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.webchat_client import WebChat, brain, logged_in, new_chat


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    brain(model)
    cfg = console_config(tmp_path, tg, model)
    cfg["channels"]["web"] = {"max_streams": 3, "max_file_bytes": 64 * 1024, "max_files": 2}
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


async def test_a_message_is_journaled_answered_once_and_streamed(
    daemon: DaemonProcess, browser: Console, chat: WebChat, model: FakeOpenAI
) -> None:
    nonce = await chat.nonce()
    status, body = await chat.send("hello from the web", nonce=nonce)
    assert status == 200 and isinstance(body, dict) and body["ok"], body
    answer = await chat.answer("echo: hello from the web")
    assert answer["role"] == "bot"
    mine = [m for m in chat.latest().values() if m["role"] == "user"]
    assert [m["text"] for m in mine] == ["hello from the web"] and mine[0]["author"] == "admin"
    # The same form posted again (a double click, a retry): the same message, no second answer.
    status, again = await chat.send("hello from the web", nonce=nonce)
    assert status == 200 and isinstance(again, dict) and again["id"] == body["id"]
    status, _ = await chat.send("second")
    await chat.answer("echo: second")
    texts = [m["text"] for m in chat.bot()]
    assert sum("hello from the web" in t for t in texts) == 1, texts
    # The journal holds it, like any chat app's message; the page after a reload shows the chat.
    status, page, _ = await browser.get(f"/conversation?c=web:{chat.chat}")
    assert status == 200 and "hello from the web" in page
    status, page, _ = await browser.get(f"/chat/{chat.chat}")
    assert status == 200 and "echo: hello from the web" in page and "echo: second" in page
    status, listing, _ = await browser.get("/chat")
    assert status == 200 and chat.chat in listing
    # A stream opened later, from the last event seen, gets only what came after it.
    late = WebChat(browser, chat.chat)
    late.listen(after=max(e["seq"] for e in chat.events))
    status, _ = await chat.send("third")
    await late.answer("echo: third")
    assert all("hello" not in m["text"] for m in late.latest().values())
    await late.close()


async def test_files_in_and_out(
    daemon: DaemonProcess, browser: Console, chat: WebChat, model: FakeOpenAI
) -> None:
    status, body = await chat.send("look at this", (("scores.csv", b"name,score\nada,3\n"),))
    assert status == 200, body
    await chat.answer("echo:")
    uploaded = list(daemon.sandbox_root.glob("**/uploads/scores.csv"))
    assert uploaded and uploaded[0].read_bytes() == b"name,score\nada,3\n"
    assert any("scores.csv" in last_user_text(r) for r in model.requests), "the agent was told"
    mine = next(m for m in chat.latest().values() if m["role"] == "user")
    assert [f["name"] for f in mine["files"]] == ["scores.csv"]

    status, _ = await chat.send("FILEME please")
    sent = await chat.wait(lambda: next((m for m in chat.bot() if m["files"]), None), "a file from the agent")
    file = sent["files"][0]
    assert file["name"] == "report.txt" and file["url"].startswith(f"/console/chat/{chat.chat}/file/")
    async with browser.http.get(browser.origin + file["url"]) as r:
        assert r.status == 200 and await r.read() == b"all good\n"
        assert r.headers["Content-Type"] == "application/octet-stream"
        assert r.headers["Content-Disposition"].startswith('attachment; filename="report.txt"')
        assert r.headers["X-Content-Type-Options"] == "nosniff"


async def test_an_approval_is_buttons_and_only_a_real_button_decides(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    brain(model)
    cfg = console_config(tmp_path, tg, model)
    cfg["agent"]["approvals"] = {"tools": ["write_file"], "timeout": 600}
    async with started_daemon(tmp_path, cfg) as daemon:
        browser = Console(daemon.port)
        await browser.login()
        chat = await WebChat.new(browser)
        chat.listen()
        try:
            await chat.send("APPROVEME now")
            asked = await chat.wait(
                lambda: next((m for m in chat.bot() if m["buttons"]), None), "approval buttons"
            )
            labels = [b["label"] for b in asked["buttons"]]
            assert any("Approve" in x for x in labels) and any("Deny" in x for x in labels), labels
            approve = next(b["value"] for b in asked["buttons"] if "Approve" in b["label"])
            # A value no button of that message carries, or a message of no such id: nothing decided.
            status, body = await chat.press(asked["id"], approve + "x")
            assert status == 200 and isinstance(body, dict) and not body["ok"], body
            assert "no longer there" in body["text"]
            status, body = await chat.press("b-0000", approve)
            assert isinstance(body, dict) and not body["ok"]
            status, body = await chat.press(asked["id"], approve)
            assert status == 200 and isinstance(body, dict) and body["ok"], body
            await chat.answer("Done:")
            closed = chat.latest()[asked["id"]]
            assert not closed["buttons"] and "Approved" in closed["text"], closed
            assert list(daemon.sandbox_root.glob("**/outputs/x.txt")), "the approved call ran"
        finally:
            await chat.close()
            await browser.close()


async def test_a_pending_approval_is_decided_from_the_approvals_page(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The console's Approve on /approvals settles the request as its chat button would: the
    chat's buttons close with the decision and the turn goes on; a second decision is refused."""
    brain(model)
    cfg = console_config(tmp_path, tg, model)
    cfg["agent"]["approvals"] = {"tools": ["write_file"], "timeout": 600}
    async with started_daemon(tmp_path, cfg) as daemon:
        browser = Console(daemon.port)
        await browser.login()
        chat = await WebChat.new(browser)
        chat.listen()
        try:
            await chat.send("APPROVEME now")
            asked = await chat.wait(
                lambda: next((m for m in chat.bot() if m["buttons"]), None), "approval buttons"
            )
            status, page, _ = await browser.get("/approvals")
            found = re.search(r'name="id" value="([^"]+)"', page)
            assert status == 200 and found and "write_file" in page, page
            csrf = await browser.csrf()
            status, _, r = await browser.post("/approvals/approve", {"csrf": csrf, "id": found.group(1)})
            assert status == 303 and r.headers["Location"] == "/console/approvals"
            status, page, _ = await browser.get("/approvals")
            assert "Approved: write_file" in page, page
            await chat.answer("Done:")
            closed = chat.latest()[asked["id"]]
            assert (
                not closed["buttons"]
                and "Approved by" in closed["text"]
                and "console:admin" in closed["text"]
            )
            status, _, _ = await browser.post("/approvals/deny", {"csrf": csrf, "id": found.group(1)})
            status, page, _ = await browser.get("/approvals")
            assert "no longer waiting" in page, page
            status, _, _ = await browser.post("/approvals/approve", {"csrf": csrf, "id": "../x"})
            status, page, _ = await browser.get("/approvals")
            assert "No such pending approval." in page
        finally:
            await chat.close()
            await browser.close()


async def test_no_session_no_chat(daemon: DaemonProcess, browser: Console, chat: WebChat) -> None:
    stranger = Console(daemon.port)
    try:
        base = f"/chat/{chat.chat}"
        for path in ("/chat", base, f"{base}/events", f"{base}/file/x-0"):
            status, _, r = await stranger.get(path)
            assert status == 303 and r.headers["Location"] == "/console/login", (path, status)
        for path in (f"{base}/send", f"{base}/press"):
            status, body, _ = await stranger.post(path, {"text": "hi", "nonce": "n" * 20, "csrf": "x"})
            assert status == 401, (path, status, body)
    finally:
        await stranger.close()
    # Another person's chat, a chat id that is not one, a malformed one: "no such chat".
    for other in ("bob~0123456789ab", "admin~nothex000000", "admin~0123456789AB", "admin~0123456789ab%00"):
        status, _, _ = await browser.get(f"/chat/{other}")
        assert status == 404, (other, status)
        status, body, _ = await browser.post(
            f"/chat/{other}/send", {"csrf": await browser.csrf(), "text": "x"}
        )
        assert status == 404, (other, status, body)


async def test_forged_posts_are_refused(daemon: DaemonProcess, browser: Console, chat: WebChat) -> None:
    status, body = await chat.send("forged", csrf="wrong-token")
    assert status == 403 and "CSRF" in str(body)
    status, body = await chat.send("forged", origin="http://evil.example")
    assert status == 403 and "Origin check" in str(body)
    status, body = await chat.send("forged", origin=None)
    assert status == 403
    status, body = await chat.send("bad nonce", nonce="short")
    assert status == 400 and isinstance(body, dict) and "reload the page" in body["error"]
    await asyncio.sleep(0)
    assert all("forged" not in m["text"] for m in chat.latest().values())


async def test_hostile_text_and_file_names_stay_text(
    daemon: DaemonProcess, browser: Console, chat: WebChat
) -> None:
    status, body = await chat.send(XSS_TEXT, ((XSS_FILE, b"hi"), ("../../etc/passwd", b"x")))
    assert status == 200, body
    await chat.answer("echo:")
    mine = next(m for m in chat.latest().values() if m["role"] == "user")
    names = [f["name"] for f in mine["files"]]
    assert names[1] == "passwd" and "/" not in "".join(names), names
    status, page, _ = await browser.get(f"/chat/{chat.chat}")
    assert status == 200
    for raw in ("<script>alert", "<img src=x", 'onerror="alert'):
        assert raw not in page, raw
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in page
    # A file id that tries to leave its chat, or a real one under another chat: not found.
    file_id = mine["files"][0]["id"]
    for bad in ("..%2f..%2fetc%2fpasswd", "%2e%2e", file_id + "%00", "x" * 200):
        status, _, _ = await browser.get(f"/chat/{chat.chat}/file/{bad}")
        assert status == 404, (bad, status)
    other = await WebChat.new(browser)
    status, _, _ = await browser.get(f"/chat/{other.chat}/file/{file_id}")
    assert status == 404


async def test_sizes_and_counts_are_bounded(daemon: DaemonProcess, browser: Console, chat: WebChat) -> None:
    status, body = await chat.send("big", (("big.bin", b"x" * (64 * 1024 + 1)),))
    assert status == 400 and isinstance(body, dict) and "big.bin is larger than" in body["error"], body
    status, body = await chat.send("many", (("a", b"1"), ("b", b"2"), ("c", b"3")))
    assert status == 400 and isinstance(body, dict) and "At most 2 files" in body["error"], body
    status, body = await chat.send("x" * 20_001)
    assert status == 400 and isinstance(body, dict) and "too long" in body["error"], body
    status, body = await chat.send("huge", (("a", b"x" * 700_000), ("b", b"y" * 700_000)))
    assert status == 413, (status, str(body)[:200])
    # Streams: at most 3 open (channels.web.max_streams); a fourth closes the oldest.
    others = [WebChat(browser, chat.chat) for _ in range(3)]
    for o in others:
        o.listen()
        await asyncio.sleep(0.3)
    await asyncio.wait_for(chat.stream_ended.wait(), 30)
    for o in others:
        assert not o.stream_ended.is_set()
        await o.close()
