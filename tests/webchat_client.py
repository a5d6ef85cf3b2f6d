"""A browser's side of the console's web chat for end-to-end tests: messages and files posted as the
page's script posts them (multipart, ``Accept: application/json``, the console's own Origin), and
the chat's Server-Sent Events read into a list as they come (docs/console.md, "Web chat")."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from tests.console_client import Console
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text

WAIT = 60.0
_NONCE = re.compile(r'name="nonce" value="([^"]+)"')


class WebChat:
    """One logged-in console ``browser`` in one chat."""

    def __init__(self, browser: Console, chat: str) -> None:
        self.browser = browser
        self.chat = chat
        self.events: list[dict[str, Any]] = []
        self._reader: asyncio.Task[None] | None = None
        self.stream_ended = asyncio.Event()

    @classmethod
    async def new(cls, browser: Console) -> WebChat:
        status, _, r = await browser.get("/chat?new=1")
        assert status == 303, status
        chat = r.headers["Location"].rsplit("/", 1)[1]
        assert re.fullmatch(r"admin~[0-9a-f]{12}", chat), chat
        return cls(browser, chat)

    @property
    def url(self) -> str:
        return f"{self.browser.origin}/console/chat/{self.chat}"

    async def send(
        self,
        text: str,
        files: tuple[tuple[str, bytes], ...] = (),
        *,
        nonce: str | None = None,
        csrf: str | None = None,
        origin: str | None = "",
    ) -> tuple[int, dict[str, Any] | str]:
        form = aiohttp.FormData(quote_fields=False)  # file names as a browser sends them
        form.add_field("csrf", csrf if csrf is not None else await self.browser.csrf())
        form.add_field("nonce", nonce or secrets.token_urlsafe(18))
        form.add_field("text", text)
        for name, data in files:
            form.add_field("files", data, filename=name, content_type="application/octet-stream")
        headers = {"Accept": "application/json"}
        if origin is not None:
            headers["Origin"] = origin or self.browser.origin
        async with self.browser.http.post(
            f"{self.url}/send", data=form, headers=headers, allow_redirects=False
        ) as r:
            body = await r.text()
            try:
                return r.status, json.loads(body)
            except ValueError:
                return r.status, body

    async def press(self, msg_id: str, value: str) -> tuple[int, dict[str, Any] | str]:
        data = {"csrf": await self.browser.csrf(), "msg": msg_id, "value": value}
        headers = {"Accept": "application/json", "Origin": self.browser.origin}
        async with self.browser.http.post(f"{self.url}/press", data=data, headers=headers) as r:
            body = await r.text()
            try:
                return r.status, json.loads(body)
            except ValueError:
                return r.status, body

    def listen(self, after: int = 0) -> None:
        """Read the chat's event stream in the background into :attr:`events`."""
        self._reader = asyncio.create_task(self._read(after))

    async def _read(self, after: int) -> None:
        try:
            async with self.browser.http.get(
                f"{self.url}/events?after={after}", timeout=aiohttp.ClientTimeout(total=None)
            ) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream"), r.status
                kind, data = "", ""
                async for raw in r.content:
                    line = raw.decode().rstrip("\n")
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif not line and kind == "msg":
                        self.events.append(json.loads(data))
                        kind, data = "", ""
        finally:
            self.stream_ended.set()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader

    def latest(self) -> dict[str, dict[str, Any]]:
        """Each message as its last event shows it (an edit comes again with a higher seq)."""
        out: dict[str, dict[str, Any]] = {}
        for e in self.events:
            out[e["id"]] = e
        return out

    def bot(self) -> list[dict[str, Any]]:
        return [m for m in self.latest().values() if m["role"] == "bot"]

    async def wait(self, check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; events: {self.events[-5:]}")

    async def answer(self, needle: str) -> dict[str, Any]:
        return dict(
            await self.wait(
                lambda: next((m for m in self.bot() if needle in m["text"]), None), f"answer {needle!r}"
            )
        )

    async def nonce(self) -> str:
        status, body, _ = await self.browser.get(f"/chat/{self.chat}")
        assert status == 200, status
        found = _NONCE.search(body)
        assert found, body
        return found.group(1)


REPORT = "/mnt/user-data/outputs/report.txt"


def brain(model: FakeOpenAI) -> None:
    """Echo; FILEME makes and presents a report; APPROVEME writes a file (an approval is asked)."""

    def answer(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        text = last_user_text(body)
        if last.get("role") == "tool":
            if "FILEME" in text and "present" not in str(body["messages"][-2]):
                return Reply(
                    tool_calls=[ToolCall("present_files", {"paths": [REPORT], "caption": "the report"})]
                )
            return Reply(text=f"Done: {str(last.get('content'))[:80]}")
        if "FILEME" in text:
            return Reply(tool_calls=[ToolCall("write_file", {"file_path": REPORT, "content": "all good\n"})])
        if "APPROVEME" in text:
            return Reply(
                tool_calls=[
                    ToolCall("write_file", {"file_path": "/mnt/user-data/outputs/x.txt", "content": "x"})
                ]
            )
        return Reply(text=f"echo: {text[-120:]}")

    model.add_rule(lambda _t: True, answer)


@contextlib.asynccontextmanager
async def logged_in(port: int) -> AsyncIterator[Console]:
    """A console browser logged in to the daemon on ``port`` (the web chat tests' ``browser``)."""
    console = Console(port)
    status, _, _ = await console.login()
    assert status == 303
    try:
        yield console
    finally:
        await console.close()


@contextlib.asynccontextmanager
async def new_chat(browser: Console) -> AsyncIterator[WebChat]:
    """A new chat of ``browser``'s person, its event stream read (the web chat tests' ``chat``)."""
    chat = await WebChat.new(browser)
    chat.listen()
    try:
        yield chat
    finally:
        await chat.close()
