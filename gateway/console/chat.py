"""The console's web chat (docs/console.md, "Web chat"): a logged-in person talks to the agent through
the web channel (channels/web/), the same gateway path as every chat app.

Routes (below ``/console``), all behind the console's gate (session; for posts, Origin and CSRF):

- ``GET /chat``: the person's chats; ``GET /chat?new=1`` opens a new one.
- ``GET /chat/{chat}``: the chat page (works without script: the form posts and the page reloads).
- ``POST /chat/{chat}/send``: a message with files (multipart); ``POST /chat/{chat}/press``: a button.
- ``GET /chat/{chat}/events``: Server-Sent Events, one per message written or edited, so the
  answer streams into the page as the gateway edits it (static/chat.js reads them).
- ``GET /chat/{chat}/file/{file}``: a file of the chat, always as a download (never rendered here).

A chat id names its person (``admin~…``): every route refuses a chat that is not the session's.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import markupsafe
from aiohttp import web
from multidict import MultiDictProxy

from channels.base import ChannelError
from channels.web.channel import PERSON, Refused, Upload, WebChannel, new_chat_id, owner_of
from channels.web.room import WebMessage
from gateway.console.auth import PATH, SECURITY_HEADERS
from gateway.console.forms import form_of
from gateway.console.markdown import new_pool, rendered
from gateway.console.pages import render
from gateway.console.request import GUARD_KEY, HOST_KEY, session_of
from gateway.console.text import one_line, shown

log = logging.getLogger(__name__)

SHOWN = 200
"""Messages a chat page shows when it loads (the newest); the stream adds the rest as they come."""
CHATS_LISTED = 50
FIRST_CHARS = 120
"""Characters of a chat's first message the list of chats shows."""
FILE_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")
SEQ = re.compile(r"[0-9]{1,18}")
"""A ``seq`` the page or the browser names (``after``, ``Last-Event-ID``); anything else is 0."""
STREAM_SECONDS = 300.0
"""An event stream is closed after this (the browser reconnects at once, from the last event it
saw): a stream outlives neither a logout nor a session's expiry by more than this."""
HEARTBEAT_SECONDS = 15.0
"""A comment line this often keeps proxies from closing an idle stream."""
MESSAGE_CHARS = 20_000
"""Longest text one message shows (a bot message is at most 8,000; a person's at most their limit)."""


class Streams:
    """The event streams open on this daemon: past ``max_streams`` the oldest is told to close."""

    def __init__(self) -> None:
        self.open: collections.OrderedDict[int, asyncio.Event] = collections.OrderedDict()
        self._next = 0

    def add(self, limit: int) -> tuple[int, asyncio.Event]:
        while len(self.open) >= limit:
            _, stop = self.open.popitem(last=False)
            stop.set()
        self._next += 1
        stop = asyncio.Event()
        self.open[self._next] = stop
        return self._next, stop

    def remove(self, number: int) -> None:
        self.open.pop(number, None)


STREAMS_KEY: web.AppKey[Streams] = web.AppKey("console_chat_streams", Streams)
RENDER_KEY: web.AppKey[ThreadPoolExecutor] = web.AppKey("console_chat_render", ThreadPoolExecutor)


def person_of(request: web.Request) -> str:
    """The session's person (``console:admin`` → ``admin``): their chats are ``admin~…``."""
    person = session_of(request).actor.rpartition(":")[2]
    if not PERSON.fullmatch(person):
        raise web.HTTPForbidden(text="This console account has no web chat.")
    return person


def channel_of(request: web.Request) -> WebChannel:
    channel = request.app[HOST_KEY].web()
    if channel is None or channel.room is None:
        why = "The web chat is not running (the daemon is starting, or channels.web is off)."
        raise web.HTTPServiceUnavailable(text=why)
    return channel


def chat_of(request: web.Request) -> str:
    """The route's chat, only if it is the session person's (anything else is "no such chat")."""
    chat = request.match_info["chat"]
    if owner_of(chat) != person_of(request):
        raise web.HTTPNotFound(text="No such chat.")
    return chat


def wants_json(request: web.Request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def shown_text(request: web.Request, text: str) -> str:
    """A message as the page shows it: masked by the daemon's secrets (the channel's egress masked
    the bot's already; a person may paste one), control and format characters made visible."""
    return str(shown(text, request.app[HOST_KEY].redact, MESSAGE_CHARS))


def as_event(request: web.Request, chat: str, m: WebMessage) -> dict[str, Any]:
    files = [
        {"id": f.file_id, "name": shown_text(request, f.name), "size": f.size,
         "url": f"{PATH}/chat/{chat}/file/{quote(f.file_id)}"}
        for f in m.files
    ]  # fmt: skip
    buttons = [{"label": shown_text(request, b.label), "value": b.value, "style": b.style} for b in m.buttons]
    text = shown_text(request, m.text)
    event = {
        "seq": m.seq, "id": m.msg_id, "role": m.role, "author": shown_text(request, m.author),
        "text": text, "files": files, "buttons": buttons,
        "time": time.strftime("%H:%M:%S", time.localtime(m.created)),
    }  # fmt: skip
    if m.role == "bot":  # the agent writes Markdown; a person's text is shown as they typed it
        page = rendered(text, request.app[HOST_KEY].redact)
        if page is not None:
            event["html"] = page
    return event


async def as_events(request: web.Request, chat: str, messages: list[WebMessage]) -> list[dict[str, Any]]:
    """:func:`as_event` of each message, on the Markdown renderer's own thread: a page of long
    answers is a second of rendering (200 messages of up to 8,000 characters), which on the loop
    would hold up every chat the daemon serves meanwhile, and in the default pool the store's
    and the sandbox's work queued behind it."""
    if not any(m.role == "bot" for m in messages):
        return [as_event(request, chat, m) for m in messages]
    pool = request.app[RENDER_KEY]
    return await asyncio.get_running_loop().run_in_executor(
        pool, lambda: [as_event(request, chat, m) for m in messages]
    )


async def chats(request: web.Request) -> web.StreamResponse:
    person = person_of(request)
    if request.query.get("new"):
        raise web.HTTPSeeOther(f"{PATH}/chat/{new_chat_id(person)}")
    channel = request.app[HOST_KEY].web()
    found = await channel.room.web_chats(person, CHATS_LISTED) if channel and channel.room else []
    # Masked, then cut: cut first, a secret across the cut would show its head unmasked.
    redact = request.app[HOST_KEY].redact
    found = [dataclasses.replace(c, first_text=str(shown(c.first_text, redact, FIRST_CHARS))) for c in found]
    return render(request, "chats.html", "chat", chats=found, running=channel is not None)


async def chat_page(request: web.Request) -> web.StreamResponse:
    chat = chat_of(request)
    channel = channel_of(request)
    assert channel.room is not None
    recent, after = await channel.room.web_recent(chat, SHOWN)
    events = []
    for event in await as_events(request, chat, recent):
        # Masked and cut by as_event: escaped here, so the template does not cut again.
        event["text"] = markupsafe.escape(event["text"])
        if "html" in event:  # rendered from the masked text by gateway/console/markdown.py
            event["html"] = markupsafe.Markup(event["html"])
        events.append(event)
    return render(
        request, "chat.html", "chat", chat=chat, messages=events, after=after, nonce=new_nonce(),
        limits=channel,
    )  # fmt: skip


def new_nonce() -> str:
    return secrets.token_urlsafe(18)


def uploads_of(form: MultiDictProxy[Any]) -> list[Upload]:
    out = []
    for field in form.getall("files", []):
        if isinstance(field, web.FileField) and field.filename:
            out.append(Upload(field.filename, field.content_type or "", field.file.read()))
    return out


async def send(request: web.Request) -> web.StreamResponse:
    chat = chat_of(request)
    channel = channel_of(request)
    form = form_of(request)
    text, nonce = form.get("text", ""), form.get("nonce", "")
    try:
        if not isinstance(text, str) or not isinstance(nonce, str):
            raise Refused("The form is out of date: reload the page.")
        msg_id = await channel.post(chat, person_of(request), nonce, text, uploads_of(form))
    except Refused as exc:
        return answer(request, chat, 400, {"ok": False, "error": str(exc)})
    except ChannelError as exc:
        log.warning("console: web chat message not taken: %s", type(exc).__name__)
        why = "The daemon could not take that message right now; send it again."
        return answer(request, chat, 503, {"ok": False, "error": why})
    return answer(request, chat, 200, {"ok": True, "id": msg_id, "nonce": new_nonce()})


async def press(request: web.Request) -> web.StreamResponse:
    chat = chat_of(request)
    channel = channel_of(request)
    form = form_of(request)
    msg_id, value = form.get("msg", ""), form.get("value", "")
    if not isinstance(msg_id, str) or not isinstance(value, str):
        return answer(request, chat, 400, {"ok": False, "error": "That button is no longer there."})
    try:
        result = await channel.press(chat, person_of(request), msg_id[:200], value[:200])
    except Refused as exc:
        return answer(request, chat, 400, {"ok": False, "error": str(exc)})
    body = {"ok": not result.refused, "text": shown_text(request, result.text)}
    return answer(request, chat, 200, body)


def answer(request: web.Request, chat: str, status: int, body: dict[str, Any]) -> web.StreamResponse:
    """JSON for the page's script; without script, back to the chat with a notice. An error may
    quote what the person sent (a file's name): masked like every text the page shows."""
    if isinstance(body.get("error"), str):
        body = {**body, "error": shown_text(request, body["error"])}
    if wants_json(request):
        return web.json_response(body, status=status)
    note = body.get("error") or body.get("text")
    if note:
        session_of(request).notice = str(note)
    raise web.HTTPSeeOther(f"{PATH}/chat/{chat}")


async def events(request: web.Request) -> web.StreamResponse:
    """Every message of the chat written or edited after ``after`` (or the browser's
    ``Last-Event-ID``), then each new write as it happens, until the stream's time is up, the
    session ends or a newer stream pushes this one out."""
    chat = chat_of(request)
    channel = channel_of(request)
    room = channel.room
    assert room is not None
    after = 0
    for raw in (request.headers.get("Last-Event-ID", ""), request.query.get("after", "")):
        if SEQ.fullmatch(raw):  # not str.isdigit: "²" is a digit to it, and int() refuses it (a 500)
            after = max(after, int(raw))
    if request.method == "HEAD":
        # The headers only: streamed, a HEAD held one of max_streams for minutes, and the bytes
        # written after them came to the client as the start of its next response.
        return web.Response(content_type="text/event-stream", headers={"X-Accel-Buffering": "no"})
    guard = request.app[GUARD_KEY]
    streams = request.app[STREAMS_KEY]
    number, stop = streams.add(channel.max_streams)
    response = web.StreamResponse(
        headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
    )
    try:
        await response.prepare(request)
        await response.write(b"retry: 1000\n\n")
        ends = time.monotonic() + STREAM_SECONDS
        beat = time.monotonic() + HEARTBEAT_SECONDS
        while (
            not stop.is_set()
            and channel.taking
            and time.monotonic() < ends
            and guard.session_of(request) is not None
        ):
            batch = await room.web_since(chat, after, 100)
            for m, event in zip(batch, await as_events(request, chat, batch), strict=True):
                data = json.dumps(event, ensure_ascii=True)
                await response.write(f"id: {m.seq}\nevent: msg\ndata: {data}\n\n".encode())
                after = m.seq
            if batch:
                continue
            if time.monotonic() >= beat:
                await response.write(b": beat\n\n")
                beat = time.monotonic() + HEARTBEAT_SECONDS
            await channel.bell.wait(channel.poll_seconds)
        if stop.is_set():  # pushed out: without this the browser reconnects in a second, pushing
            # out the next oldest, round and round; the page waits until it is looked at again
            await response.write(b"event: closed\ndata: {}\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the page went away
    except Exception as exc:  # the database went away mid-stream: the headers are sent, so no 500
        # can follow; end the stream (the browser reconnects and is told what is wrong then)
        log.error(
            "console: a web chat's event stream ended: %s: %s",
            type(exc).__name__,
            one_line(str(exc), redact=request.app[HOST_KEY].redact),
        )
    finally:
        streams.remove(number)
    return response


async def download(request: web.Request) -> web.StreamResponse:
    chat = chat_of(request)
    file_id = request.match_info["file"]
    if not FILE_ID.fullmatch(file_id):
        raise web.HTTPNotFound(text="No such file.")
    room = channel_of(request).room
    assert room is not None
    found = await room.web_file_get(chat, file_id)
    if found is None:
        raise web.HTTPNotFound(text="No such file.")
    name = request.app[HOST_KEY].redact(found.name)  # a secret as a file name: masked here too
    plain = "".join(c if c.isascii() and c.isprintable() and c not in '"\\;' else "_" for c in name)
    disposition = f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(name, safe='')}"
    # Always a download of opaque bytes: a file a person or the agent made is never a page here.
    headers = {"Content-Disposition": disposition, "Content-Type": "application/octet-stream"}
    # The agent's files were masked on their way in (the channel's egress); a person's upload was
    # stored as sent: masked here, as every egress masks a file's bytes (each secret overwritten
    # by as many "*": the length and the format's structure stay).
    return web.Response(body=request.app[HOST_KEY].redact.data(found.data), headers=headers)


def add_routes(app: web.Application) -> None:
    app[STREAMS_KEY] = Streams()
    app[RENDER_KEY] = new_pool()
    app.on_cleanup.append(_stop_rendering)
    app.router.add_get("/chat", chats, name="chats")
    app.router.add_get("/chat/{chat}", chat_page, name="chat")
    app.router.add_post("/chat/{chat}/send", send, name="chat_send")
    app.router.add_post("/chat/{chat}/press", press, name="chat_press")
    app.router.add_get("/chat/{chat}/events", events, name="chat_events")
    app.router.add_get("/chat/{chat}/file/{file}", download, name="chat_file")


async def _stop_rendering(app: web.Application) -> None:
    """The renderer's thread ends with the console: a daemon's stop leaves no thread behind (a page
    being rendered is dropped; its request is gone by now anyway)."""
    app[RENDER_KEY].shutdown(wait=False, cancel_futures=True)
