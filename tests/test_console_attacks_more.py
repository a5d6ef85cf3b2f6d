"""More hostile review of the console and its web chat (beyond tests/test_console_chat_attacks.py):
bodies and addresses no page makes (a multipart body without its boundary or cut short, a form
that is not UTF-8 or names an unknown charset, thousands of URL-encoded fields, a NUL in the
address or a field, a digit ``int()`` refuses), a path that would forge a log line, and a secret
echoed back in an error. Each gets a specific answer (400/413 naming what is wrong), never a 500
or "Internal Server Error". Real daemon, real HTTP, as tests/test_console_chat.py; run with
CHITAL_TEST_POSTGRES=1 too (a NUL is refused by PostgreSQL's text only)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.console_client import TOKEN, Console
from tests.console_support import console_config
from tests.daemon import DaemonProcess, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.webchat_client import WebChat, logged_in, new_chat

FORM = "application/x-www-form-urlencoded"


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    model.add_rule(lambda _t: True, lambda body: Reply(text=f"echo: {last_user_text(body)[-60:]}"))
    cfg = console_config(tmp_path, tg, model)
    cfg["channels"]["web"] = {"max_file_bytes": 64 * 1024, "max_files": 2}
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


def log_of(daemon: DaemonProcess) -> str:
    return daemon.log_path.read_text(errors="replace")


def console_failures(daemon: DaemonProcess) -> list[str]:
    """The console's 500s ("console: GET /x failed: …") in the daemon's log."""
    return [line for line in log_of(daemon).splitlines() if "ERROR gateway.console" in line]


async def raw_post(browser: Console, path: str, body: bytes, kind: str) -> tuple[int, str]:
    """A body exactly as given, from the console's own origin with the session's cookie."""
    headers = {"Content-Type": kind, "Origin": browser.origin, "Accept": "application/json"}
    url = browser.origin + "/console" + path
    async with browser.http.post(url, data=body, headers=headers, allow_redirects=False) as r:
        return r.status, await r.text()


async def test_bodies_no_page_makes_get_a_reason_not_a_500(
    daemon: DaemonProcess, browser: Console, chat: WebChat
) -> None:
    csrf = (await browser.csrf()).encode()
    send = f"/chat/{chat.chat}/send"
    part = b'--b\r\nContent-Disposition: form-data; name="csrf"\r\n\r\n' + csrf + b"\r\n"
    for body, kind in (
        (b"text=hi", "multipart/form-data"),  # no boundary
        (part + b'--b\r\nContent-Disposition: form-data; name="text"\r\n\r\nhi', "multipart/form-data; boundary=b"),
        (b"not multipart at all", "multipart/form-data; boundary=b"),
        (b"not multipart at all", f"multipart/form-data; boundary={TOKEN}"),
    ):  # fmt: skip
        status, text = await raw_post(browser, send, body, kind)
        assert status == 400 and "multipart body could not be read" in text, (kind, status, text)
        assert TOKEN[:8] not in text, text  # the sender's boundary is not echoed

    # A file part whose headers hold a control character (400), or a Content-Type that is not
    # UTF-8 (lone surrogates, which neither database stores: a 500): the message is taken.
    def file_part(disposition: bytes, kind: bytes) -> bytes:
        nonce = secrets.token_urlsafe(18).encode()
        return (
            part + b'--b\r\nContent-Disposition: form-data; name="nonce"\r\n\r\n' + nonce + b"\r\n"
            b'--b\r\nContent-Disposition: form-data; name="text"\r\n\r\nodd file\r\n'
            b'--b\r\nContent-Disposition: form-data; name="files"; ' + disposition + b"\r\n"
            b"Content-Type: " + kind + b"\r\n\r\nDATA\r\n--b--\r\n"
        )

    multipart = "multipart/form-data; boundary=b"
    status, text = await raw_post(browser, send, file_part(b'filename="a\x01.txt"', b"text/plain"), multipart)
    assert status == 400 and "headers" in text, (status, text)
    status, text = await raw_post(browser, send, file_part(b'filename="a.txt"', b"text/\xff\xfe"), multipart)
    assert status == 200, (status, text)
    await chat.answer("uploads/a.txt")
    # Not UTF-8, or a charset nobody knows: read as UTF-8 with U+FFFD, answered by the action.
    for body, kind in (
        (b"csrf=" + csrf + b"&code=\xff\xfe", FORM),
        (b"csrf=" + csrf + b"&code=abc", f"{FORM}; charset=no-such-charset"),
    ):
        status, text = await raw_post(browser, "/people/approve", body, kind)
        assert status == 303, (kind, status, text)
    # As many fields as a multipart form may have parts: the login (no session needed) too.
    many = b"&".join(b"token=x" for _ in range(3000))
    status, text = await raw_post(browser, "/people/approve", b"csrf=" + csrf + b"&" + many, FORM)
    assert status == 413 and "more than 16 fields" in text, (status, text)
    async with aiohttp.ClientSession() as anon:
        headers = {"Content-Type": FORM, "Origin": browser.origin}
        async with anon.post(browser.origin + "/console/login", data=many, headers=headers) as r:
            assert r.status == 413 and "more than 16 fields" in await r.text(), r.status
    # A "digit" str.isdigit() takes and int() refuses, in the address and as Last-Event-ID.
    for query, header in (("after=%C2%B2", ""), ("after=1", "\u00b2")):
        headers = {"Last-Event-ID": header} if header else {}
        async with browser.http.get(
            f"{chat.url}/events?{query}", headers=headers, timeout=aiohttp.ClientTimeout(total=60)
        ) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r.status
            assert (await r.content.readuntil(b"\n\n")).startswith(b"retry:")
    # Nothing was a 500 ("could not read the daemon's state"), and the chat goes on.
    assert not console_failures(daemon), console_failures(daemon)
    status, body = await chat.send("after the bad bodies")
    assert status == 200, body
    await chat.answer("echo: after the bad bodies")


async def test_a_nul_in_the_address_or_a_field_is_answered_on_both_engines(
    daemon: DaemonProcess, browser: Console
) -> None:
    """A NUL is valid in a URL and a form; PostgreSQL's text refuses it (run with
    CHITAL_TEST_POSTGRES=1): a search or a code holding one was a 500 there."""
    for path in ("/conversations?q=a%00b", "/conversation?c=telegram%00x"):
        status, text, _ = await browser.get(path)
        assert status == 400 and "NUL" in text, (path, status, text)
    csrf = await browser.csrf()
    for path, field in (("/people/approve", "code"), ("/people/revoke", "user"), ("/schedules/cancel", "id")):
        status, _, r = await browser.post(path, {"csrf": csrf, field: "AB\x00CD"})
        assert status == 303, (path, status)
        page = r.headers["Location"].removeprefix("/console")
        status, text, _ = await browser.get(page)
        assert status == 200 and 'id="notice"' in text, (path, status)
    assert not console_failures(daemon), console_failures(daemon)


async def test_a_path_cannot_forge_a_log_line(daemon: DaemonProcess, browser: Console) -> None:
    """Refusals log the request's path, decoded: ``%0a`` was a newline in the daemon's log, so
    anyone, before any login, could write a line that reads as the daemon's own."""
    forged = "2026-01-01 00:00:00,000 INFO gateway.console.auth: console: console:admin logged in"
    path = "/console/x%0a" + forged.replace(" ", "%20") + "%0d"
    async with aiohttp.ClientSession() as anon:  # no Origin: refused, and logged
        async with anon.post(browser.origin + path, data=b"") as r:
            assert r.status == 403
    status, _, _ = await browser.post(path.removeprefix("/console"), {"csrf": "wrong"})
    assert status == 403
    # A secret across the log line's cut of the path: masked before the cut, not only whole.
    async with aiohttp.ClientSession() as anon:
        async with anon.post(f"{browser.origin}/console/{'y' * 180}{TOKEN}", data=b"") as r:
            assert r.status == 403
    # U+2028 is a line break to str.splitlines (the recent errors read a record's first line).
    async with aiohttp.ClientSession() as anon:
        async with anon.post(browser.origin + path.replace("%0a", "%E2%80%A8"), data=b"") as r:
            assert r.status == 403
    await asyncio.sleep(0.5)
    lines = log_of(daemon).splitlines()
    assert not [line for line in lines if line.startswith("2026-01-01")], lines[-5:]
    assert TOKEN[:8] not in log_of(daemon), "a secret's head past the cut of a logged path"
    assert sum("x\\n2026-01-01" in line for line in lines) == 2, lines[-5:]
    assert sum("x\\u2028" + "2026-01-01" in line for line in lines) == 1, lines[-5:]


async def test_a_secret_quoted_in_an_error_is_masked(chat: WebChat) -> None:
    """A file over the limit is refused naming it: a secret as its name must not come back in the
    error the page's script shows (the page and the download were masked; the JSON was not)."""
    status, body = await chat.send("too big", ((f"{TOKEN}.bin", b"x" * (65 * 1024)),))
    assert status == 400 and isinstance(body, dict), (status, body)
    assert "larger than" in body["error"] and TOKEN not in body["error"], body
    assert TOKEN[:12] not in body["error"], body


async def test_head_and_options_hold_no_stream_and_do_nothing(browser: Console, chat: WebChat) -> None:
    """HEAD is a GET without the body: on the event stream it held one of ``max_streams`` for its
    five minutes (a page's own stream pushed out by requests that never read a byte). OPTIONS and
    HEAD on an action change nothing."""
    streams = 16  # channels.web.max_streams' default; the fixture's own stream is one more
    for _ in range(streams):
        async with browser.http.head(f"{chat.url}/events", timeout=aiohttp.ClientTimeout(total=60)) as r:
            assert r.status == 200, r.status
    await asyncio.sleep(1.0)
    assert not chat.stream_ended.is_set(), "a HEAD pushed the page's stream out"
    status, body = await chat.send("still streaming")
    assert status == 200, body
    await chat.answer("echo: still streaming")
    for method in ("HEAD", "OPTIONS"):
        for path in ("/people/approve", f"/chat/{chat.chat}/send", "/logout"):
            async with browser.http.request(
                method, browser.origin + "/console" + path, headers={"Origin": browser.origin}
            ) as r:
                assert r.status == 405, (method, path, r.status)
    status, _, _ = await browser.get("/")
    assert status == 200, "still logged in"


async def raw_request(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4000), 30)
    finally:
        writer.close()


async def test_malformed_requests_do_not_flood_the_recent_errors(
    daemon: DaemonProcess, browser: Console
) -> None:
    """aiohttp logged each request line it could not parse as an ERROR with a traceback: anyone,
    before any login, pushed the errors that matter out of the console's "Recent errors" (and
    ``chital status``) and filled the log with tracebacks. Now one INFO line each."""
    long = b"GET /console/conversations?q=" + b"x" * 30 + TOKEN.encode() + b"q" * 10_000 + b" HTTP/1.1"
    for line in (b"GET /console/conver\xff HTTP/1.1", long):
        answer = await raw_request(daemon.port, line + b"\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0], answer[:200]
    status, page, _ = await browser.get("/")
    assert status == 200
    errors = page.split('id="errors"', 1)[1].split("</table>", 1)[0]
    assert "Error handling request" not in errors and "malformed" not in errors, errors
    log = log_of(daemon)
    assert "Traceback" not in log, log[-2000:]
    assert "http: a malformed request from 127.0.0.1 refused (400" in log, log[-2000:]
    assert TOKEN[:8] not in log, "a secret in the request, cut by aiohttp's message, kept its head"


async def test_the_daemon_stopping_ends_an_open_stream_cleanly(daemon: DaemonProcess, chat: WebChat) -> None:
    """The worst moment for a page: the daemon stops while its stream is open. The stream read the
    database the stopping daemon had closed: an ERROR "events failed: ProgrammingError: Cannot
    operate on a closed database" at every stop with a page open. It ends when the channel stops."""
    status, body = await chat.send("before the stop")
    assert status == 200, body
    await chat.answer("echo: before the stop")
    assert await daemon.terminate(timeout=120) == 0
    await asyncio.wait_for(chat.stream_ended.wait(), 30)
    errors = [line for line in log_of(daemon).splitlines() if " ERROR gateway.console" in line]
    assert not errors, errors


async def test_the_chat_script_is_told_why_a_post_was_refused(browser: Console, chat: WebChat) -> None:
    """The page's script reads JSON: a refusal of the gate (no session, a wrong CSRF token, a form
    too large or malformed) was plain text, which the script could not read and showed as "That
    did not reach the daemon; send it again" (an expired session: sent again and again)."""
    status, body = await chat.send("wrong token", csrf="nope")
    assert status == 403 and isinstance(body, dict) and "CSRF" in body["error"], (status, body)
    status, body = await chat.send("too many", tuple((f"f{i}", b"x") for i in range(11)))
    assert status == 413 and isinstance(body, dict) and "parts" in body["error"], (status, body)
    status, text = await raw_post(browser, f"/chat/{chat.chat}/send", b"x", "multipart/form-data")
    assert status == 400 and '"ok": false' in text and "multipart" in text, (status, text)
    status, _, _ = await browser.post("/logout", {"csrf": await browser.csrf()})
    assert status == 303
    status, body = await chat.send("after the logout", csrf="stale")
    assert status == 401 and isinstance(body, dict) and "log in" in body["error"], (status, body)
    # A page (no Accept: JSON) still gets the text it always got.
    status, text, _ = await browser.post(f"/chat/{chat.chat}/send", {"csrf": "x", "text": "y"})
    assert status == 401 and text.startswith("No console session"), (status, text)


async def test_a_secret_across_the_transcripts_cut_is_masked_whole(
    browser: Console, chat: WebChat, model: FakeOpenAI
) -> None:
    """The conversation page's transcript cuts a tool call's arguments at 600 characters; the page
    masked afterwards, so a secret across the cut kept its head (the chat list's fixed hole, again
    in the transcript). Masked first, then cut."""
    command = "echo " + "x" * 570 + TOKEN  # the token starts ~590 characters into the JSON
    model.script(Reply(tool_calls=[ToolCall("execute", {"command": command})]), Reply(text="ran it"))
    status, body = await chat.send("run the long one")
    assert status == 200, body
    await chat.answer("ran it")
    status, page, _ = await browser.get(f"/conversation?c=web:{chat.chat}")
    assert status == 200 and 'class="tool-call"' in page, (status, page[-2000:])
    assert "execute {" in page and "xxxxxxxxxx" in page
    assert TOKEN[:8] not in page, "the head of a secret cut in the transcript"


async def test_a_secret_in_an_uploaded_files_bytes_is_masked_in_its_download(
    browser: Console, chat: WebChat
) -> None:
    """The name was masked in the download's Content-Disposition; the bytes of a person's upload
    were served as sent (the agent's files are masked by the channel's egress on their way in)."""
    data = f"api_key = {TOKEN}\n".encode()
    status, body = await chat.send("a config file", (("settings.ini", data),))
    assert status == 200, body
    mine = await chat.wait(
        lambda: next((m for m in chat.latest().values() if m["role"] == "user" and m["files"]), None),
        "the file message",
    )
    async with browser.http.get(browser.origin + mine["files"][0]["url"]) as r:
        assert r.status == 200
        got = await r.read()
    assert TOKEN.encode() not in got and got.startswith(b"api_key = ") and len(got) == len(data), got


async def test_a_header_that_is_not_utf8_is_refused_not_a_500(
    daemon: DaemonProcess, browser: Console
) -> None:
    """A CSRF token sent in ``X-CSRF-Token`` with bytes that are not UTF-8: aiohttp reads them as
    lone surrogates, and the strict encode of the comparison raised (a 500). A wrong token: 403."""
    cookie = "; ".join(f"{c.key}={c.value}" for c in browser.http.cookie_jar).encode()
    head = b"POST /console/people/revoke HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % daemon.port
    answer = await raw_request(
        daemon.port,
        head + b"Origin: " + browser.origin.encode() + b"\r\nCookie: " + cookie + b"\r\n"
        b"X-CSRF-Token: ab\xffcd\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    assert answer.split(b"\r\n")[0].endswith(b"403 Forbidden") and b"CSRF" in answer, answer[:300]
    assert not console_failures(daemon), console_failures(daemon)


async def test_uploads_read_at_once_are_bounded(
    daemon: DaemonProcess, browser: Console, chat: WebChat
) -> None:
    """Each chat message with files is held in memory whole while it is read (up to max_files x
    max_file_bytes: 50 MB by default, 1 GB at the settings' maximum), and any number were read at
    once. Two slow uploads hold the two slots; a third is told to send again, not read."""
    cookie = "; ".join(f"{c.key}={c.value}" for c in browser.http.cookie_jar).encode()
    head = (
        b"POST /console/chat/%s/send HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nOrigin: %s\r\nCookie: %s\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 1100000\r\n\r\n"
        % (chat.chat.encode(), daemon.port, browser.origin.encode(), cookie)
    )
    slow = []
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
        writer.write(
            head + b'--b\r\nContent-Disposition: form-data; name="files"; filename="x"\r\n\r\n' + b"x" * 1000
        )
        await writer.drain()
        slow.append((reader, writer))
    try:
        for _ in range(60):  # until both are being read (they wait for the rest of their bodies)
            status, body = await chat.send("a third", (("big.bin", b"y" * 300_000),))
            if status == 503:
                break
            await asyncio.sleep(0.5)
        assert status == 503 and isinstance(body, dict) and "send again" in body["error"], (status, body)
        status, body = await chat.send("no files, no wait")
        assert status == 200, body
    finally:
        for _, writer in slow:
            writer.close()
    # The slots are given back when the slow bodies end: read, then refused by its size.
    for _ in range(60):
        status, body = await chat.send("a big file now", (("small.txt", b"z" * 300_000),))
        if status != 503:
            break
        await asyncio.sleep(0.5)
    assert status == 400 and "larger than" in str(body), (status, body)
