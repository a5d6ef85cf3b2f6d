"""A fake Discord: REST API v10, gateway websocket and attachment CDN on 127.0.0.1, for discord.py.

One guild with a text channel (and a thread under it) plus DM channels made on demand. The gateway
keeps a per-session event log, so a RESUME replays what the bot missed (also events injected while it
was disconnected), exactly the behaviour the adapter relies on; a fresh IDENTIFY replays nothing, as on
the real service. Everything the bot posts or edits is recorded as a user would see it.

The fake only talks over TCP, so an end-to-end test can point a daemon subprocess at ``api_base_url``
and ``gateway_url``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from aiohttp import WSMsgType, web

from tests.fakes import discord_commands

T = TypeVar("T")
JSON_TYPE = "application/json"  # exact: discord.py returns a str for "...; charset=utf-8"
MAX_CONTENT = 2000
DISCORD_EPOCH_MS = 1_420_070_400_000


@dataclass
class PostedMessage:
    """A message the bot posted, as the user sees it now (edits applied)."""

    id: str
    channel_id: str
    content: str
    reply_to: str | None = None
    nonce: str | None = None
    files: list[tuple[str, bytes]] = field(default_factory=list)
    edits: int = 0


@dataclass
class _Failure:
    status: int
    method: str | None
    path_contains: str
    times: int
    retry_after: float
    code: int


@dataclass
class _Held:
    """An answer the fake holds back (:meth:`FakeDiscord.hold_answer`): the call took effect."""

    method: str
    when: Callable[[dict[str, Any]], bool]
    release: asyncio.Event
    waiting: bool = False
    used: bool = False


@dataclass
class _Session:
    id: str
    seq: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    conn: _Conn | None = None
    dead: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(eq=False)
class _Conn:
    ws: web.WebSocketResponse
    request: web.Request
    session: _Session | None = None
    stalled: bool = False


def _buttons(components: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The buttons of a message's component rows."""
    return [c for row in components for c in row.get("components", ()) if c.get("type") == 2]


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(), status=status, headers={"Content-Type": JSON_TYPE, **(headers or {})}
    )


def _error(status: int, code: int, message: str, errors: dict[str, Any] | None = None) -> web.Response:
    body: dict[str, Any] = {"message": message, "code": code}
    if errors:
        body["errors"] = errors
    return _json(body, status)


class FakeDiscord:
    """The fake service. ``await start()``, point discord.py at :attr:`api_base_url` and
    :attr:`gateway_url`, then inject user messages and inspect :attr:`posted`."""

    platform = "discord"
    """The channel name in the config and in user ids (``discord:<id>``)."""

    def __init__(self, token: str = "fake-discord-token", *, heartbeat_interval: float = 41.25) -> None:
        self.token = token
        self.heartbeat_interval = heartbeat_interval
        self._last_id = 0
        self.bot_id = self.new_id()
        self.application_id = self.new_id()
        self.guild_id = self.new_id()
        self.channel_id = self.new_id()
        self.thread_id = self.new_id()
        self.owner_id = self.new_id()
        self._threads: dict[str, str] = {self.thread_id: self.channel_id}  # thread -> parent
        self._dms: dict[str, str] = {}  # user id -> DM channel id
        self._messages: dict[str, dict[str, Any]] = {}
        self._nonces: dict[str, str] = {}
        self._cdn: dict[str, tuple[bytes, str]] = {}
        self._failures: list[_Failure] = []
        self._sessions: dict[str, _Session] = {}
        self._session: _Session | None = None
        self._conns: set[_Conn] = set()
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0
        # What the bot did, for assertions.
        self.posted: list[PostedMessage] = []
        self.typing: Counter[str] = Counter()
        self.reactions: list[tuple[str, str, str]] = []  # (channel, message, emoji)
        self.forbidden_channels: set[str] = set()
        self.no_history: set[str] = set()
        """Channels whose history the bot may not read (no Read Message History): 403 on GET."""
        self.identifies = 0
        self.max_open_sessions = 0
        """The most identified gateway connections open at one moment. Discord sends every event
        to each session of a bot (unsharded), so two would see each message twice; this fake keeps
        one session live (an IDENTIFY ends the previous one), and this counter tells the tests."""
        self.message_posts: Counter[str] = Counter()
        """POST /channels/{id}/messages per nonce, a deduplicated repeat included: a send cut and
        retried counts twice even when it is posted once."""
        self._held: list[_Held] = []
        self._ready_held: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.resumes = 0
        self.heartbeats = 0
        self.intents: int | None = None
        self.rest_calls: list[tuple[str, str]] = []
        self.interactions: dict[str, dict[str, Any]] = {}
        """Interactions dispatched (by id), for their tokens and the presser."""
        self.interaction_responses: dict[str, dict[str, Any]] = {}
        """The bot's answer to each interaction (POST .../callback payload), by interaction id."""
        self.global_commands: list[dict[str, Any]] = []
        """The application's global commands as the last bulk overwrite left them."""
        self.guild_commands: dict[str, list[dict[str, Any]]] = {}
        self.command_puts = 0
        self.originals: dict[str, str] = {}
        """Interaction id -> the message id of its response (a deferred one shows "thinking…")."""
        self._offered: dict[str, list[dict[str, Any]]] = {}
        """Every button a message was ever sent or edited with (a stale client can still press)."""

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        r = app.router
        api = "/api/v10"
        r.add_get(f"{api}/users/@me", self._me)
        r.add_get(f"{api}/oauth2/applications/@me", self._application)
        r.add_get(f"{api}/gateway/bot", self._gateway_bot)
        r.add_get(f"{api}/gateway", self._gateway_bot)
        r.add_post(f"{api}/channels/{{cid}}/messages", self._post_message)
        r.add_get(f"{api}/channels/{{cid}}/messages/{{mid}}", self._get_message)
        r.add_get(f"{api}/channels/{{cid}}/messages", self._list_messages)
        r.add_patch(f"{api}/channels/{{cid}}/messages/{{mid}}", self._patch_message)
        r.add_post(f"{api}/channels/{{cid}}/typing", self._typing)
        r.add_put(f"{api}/channels/{{cid}}/messages/{{mid}}/reactions/{{emoji}}/@me", self._react)
        r.add_post(f"{api}/interactions/{{iid}}/{{token}}/callback", self._interaction_callback)
        discord_commands.routes(self, r, api)
        r.add_get("/attachments/{cid}/{aid}/{name}", self._cdn_get)
        r.add_get("/gateway/", self._gateway)
        r.add_get("/gateway", self._gateway)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        for held in self._held:  # a test that failed mid-hold: its handlers end now
            held.release.set()
        if self._ready_held is not None:
            self._ready_held.set()
        for conn in list(self._conns):
            with contextlib.suppress(Exception):
                await conn.ws.close(code=1001)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeDiscord:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base_url(self) -> str:
        return f"{self.url}/api/v10"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway/"

    def channel_settings(self) -> dict[str, Any]:
        """``channels.discord`` of a config that talks to this fake: the one factory the tests share
        (its token, its REST and gateway addresses)."""
        return {
            "enabled": True,
            "token": self.token,
            "api_base_url": self.api_base_url,
            "gateway_url": self.gateway_url,
        }

    def new_id(self) -> str:
        """A real-looking snowflake (its timestamp is now), strictly increasing."""
        snowflake = (int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22
        self._last_id = max(snowflake, self._last_id + 1)
        return str(self._last_id)

    # -- observation --------------------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], T], timeout: float = 5.0) -> T:
        """Wait until ``predicate()`` is truthy and return its value; re-checked on every change
        of the fake and at least every 50 ms (for predicates over state outside the fake)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = predicate()
            if result:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"condition not met within {timeout}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.05))

    @property
    def connected(self) -> bool:
        """True while a live, identified or resumed gateway connection exists."""
        s = self._session
        return bool(s and not s.dead and s.conn is not None and not s.conn.stalled)

    async def wait_connected(self, timeout: float = 10.0) -> None:
        await self.wait_for(lambda: self.connected, timeout)

    def bot_messages(self, channel_id: str | None = None) -> list[PostedMessage]:
        return [m for m in self.posted if channel_id is None or m.channel_id == channel_id]

    def message(self, message_id: str) -> dict[str, Any]:
        return self._messages[message_id]

    # -- failure injection --------------------------------------------------------------------
    def fail_next(
        self,
        status: int,
        *,
        method: str | None = None,
        path_contains: str = "",
        times: int = 1,
        retry_after: float = 1.0,
        code: int = 0,
    ) -> None:
        """Answer the next ``times`` matching REST calls with ``status`` (429 carries retry_after in
        the body and X-RateLimit-* headers, like Discord's)."""
        self._failures.append(_Failure(status, method, path_contains, times, retry_after, code))

    def hold_answer(self, method: str, when: Callable[[dict[str, Any]], bool]) -> asyncio.Event:
        """The next message create (``POST``) or edit (``PATCH``) whose JSON payload satisfies
        ``when`` takes effect (the user sees it), but its answer is held until the returned event
        is set: the bot is caught between a call and its result for as long as the test needs."""
        held = _Held(method, when, asyncio.Event())
        self._held.append(held)
        return held.release

    def hold_ready(self) -> asyncio.Event:
        """An IDENTIFY starts its session but gets no READY until the returned event is set: the
        bot is caught in its handshake (identified, not yet told so)."""
        self._ready_held = asyncio.Event()
        return self._ready_held

    @property
    def holding(self) -> int:
        """How many answers are held back right now."""
        return sum(1 for h in self._held if h.waiting)

    async def _hold(self, method: str, payload: dict[str, Any]) -> None:
        held = next((h for h in self._held if not h.used and h.method == method and h.when(payload)), None)
        if held is None:
            return
        held.used = held.waiting = True
        self._notify()
        try:
            await held.release.wait()
        finally:
            held.waiting = False
            self._notify()

    @property
    def gateway_connections(self) -> int:
        """Gateway websockets open now, identified or not."""
        return len(self._conns)

    def open_sessions(self) -> int:
        """Identified (or resumed) gateway connections open now."""
        return sum(1 for c in self._conns if c.session is not None and not c.ws.closed)

    def _take_failure(self, request: web.Request) -> _Failure | None:
        for f in self._failures:
            if (f.method is None or f.method == request.method) and f.path_contains in request.path:
                f.times -= 1
                if f.times <= 0:
                    self._failures.remove(f)
                return f
        return None

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not request.path.startswith("/api/"):
            return await handler(request)
        self.rest_calls.append((request.method, request.path))
        # Interaction callbacks are authorized by the interaction's token in the path, no header.
        interaction = request.path.startswith(("/api/v10/interactions/", "/api/v10/webhooks/"))
        if not interaction and request.headers.get("Authorization") != f"Bot {self.token}":
            return _error(401, 0, "401: Unauthorized")
        failure = self._take_failure(request)
        if failure is None:
            return await handler(request)
        if failure.status == 429:
            ra = failure.retry_after
            headers = {
                "Retry-After": str(max(1, round(ra))),
                "X-RateLimit-Limit": "5",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": f"{time.time() + ra:.3f}",
                "X-RateLimit-Reset-After": f"{ra:.3f}",
                "X-RateLimit-Bucket": "fake-bucket",
                "X-RateLimit-Scope": "user",
                "Via": "1.1 google",  # discord.py treats a 429 without Via as a Cloudflare ban
            }
            body = {"message": "You are being rate limited.", "retry_after": ra, "global": False}
            return _json(body, 429, headers)
        return _error(failure.status, failure.code, f"{failure.status}: injected failure")

    # -- model helpers ------------------------------------------------------------------------
    def _user(self, user_id: str, *, bot: bool = False) -> dict[str, Any]:
        name = "chital" if user_id == self.bot_id else f"user{user_id[-4:]}"
        return {
            "id": user_id,
            "username": name,
            "global_name": name.title(),
            "discriminator": "0",
            "avatar": None,
            "bot": bot,
            "flags": 0,
            "public_flags": 0,
        }

    def _bot_user(self) -> dict[str, Any]:
        return {**self._user(self.bot_id, bot=True), "verified": True, "mfa_enabled": False}

    def _is_guild_channel(self, cid: str) -> bool:
        return cid == self.channel_id or cid in self._threads

    def _known_channel(self, cid: str) -> bool:
        return self._is_guild_channel(cid) or cid in self._dms.values()

    def _thread_data(self, tid: str) -> dict[str, Any]:
        return {
            "id": tid,
            "type": 11,
            "guild_id": self.guild_id,
            "parent_id": self._threads[tid],
            "owner_id": self.owner_id,
            "name": f"thread-{tid[-4:]}",
            "message_count": 0,
            "member_count": 1,
            "rate_limit_per_user": 0,
            "flags": 0,
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": 1440,
                "archive_timestamp": _now_iso(),
                "locked": False,
            },
        }

    def _guild_data(self) -> dict[str, Any]:
        everyone = {
            "id": self.guild_id,
            "name": "@everyone",
            "permissions": "1071698660929",
            "position": 0,
            "color": 0,
            "hoist": False,
            "managed": False,
            "mentionable": False,
            "flags": 0,
        }
        text = {
            "id": self.channel_id,
            "type": 0,
            "guild_id": self.guild_id,
            "name": "general",
            "position": 0,
            "permission_overwrites": [],
            "nsfw": False,
            "parent_id": None,
        }
        return {
            "id": self.guild_id,
            "name": "Fake Guild",
            "owner_id": self.owner_id,
            "unavailable": False,
            "member_count": 2,
            "large": False,
            "roles": [everyone],
            "emojis": [],
            "stickers": [],
            "features": [],
            "channels": [text],
            "members": [],
            "voice_states": [],
            "presences": [],
            "threads": [self._thread_data(t) for t in self._threads],
            "joined_at": _now_iso(),
            "preferred_locale": "en-US",
            "mfa_level": 0,
            "verification_level": 0,
            "premium_tier": 0,
            "system_channel_flags": 0,
        }

    def _message_data(self, cid: str, author_id: str, content: str, **extra: Any) -> dict[str, Any]:
        mid = self.new_id()
        data: dict[str, Any] = {
            "id": mid,
            "channel_id": cid,
            "type": 0,
            "content": content,
            "author": self._bot_user() if author_id == self.bot_id else self._user(author_id),
            "timestamp": _now_iso(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "flags": 0,
            "components": [],
        }
        if self._is_guild_channel(cid):
            data["guild_id"] = self.guild_id
            data["member"] = {"roles": [], "joined_at": _now_iso(), "deaf": False, "mute": False, "flags": 0}
        data.update(extra)
        self._messages[mid] = data
        return data

    def _add_cdn(self, cid: str, name: str, body: bytes, content_type: str) -> dict[str, Any]:
        aid = self.new_id()
        self._cdn[aid] = (body, content_type)
        url = f"{self.url}/attachments/{cid}/{aid}/{name}"
        return {
            "id": aid,
            "filename": name,
            "size": len(body),
            "url": url,
            "proxy_url": url,
            "content_type": content_type,
        }

    # -- user side ----------------------------------------------------------------------------
    async def inject_message(
        self,
        channel_id: str | None,
        author_id: str,
        content: str,
        *,
        guild: bool = True,
        mention_bot: bool = False,
        reply_to_message_id: str | None = None,
        thread: bool = False,
        attachments: Iterable[tuple[str, bytes, str]] | None = None,
        fields: dict[str, Any] | None = None,
        voice: bool = False,
    ) -> str:
        """A user posts a message; returns its id. ``channel_id=None`` means the guild text channel;
        ``thread=True`` posts into the thread under it; ``guild=False`` means a DM (see inject_dm).
        ``attachments`` are ``(filename, bytes, content_type)`` served from the fake CDN; ``fields``
        are merged into the payload last (``sticker_items``, ``embeds``, ``poll`` ...). ``voice``
        makes it a voice message as the app records one (flag 1 << 13; the attachment carries its
        duration and waveform)."""
        if not guild:
            cid = self._dms.setdefault(author_id, self.new_id())
        else:
            cid = channel_id or self.channel_id
            if thread and cid not in self._threads:
                existing = next((t for t, p in self._threads.items() if p == cid), None)
                cid = existing or await self._new_thread(cid)
        extra: dict[str, Any] = {}
        if mention_bot:
            content = f"<@{self.bot_id}> {content}"
            extra["mentions"] = [self._user(self.bot_id, bot=True)]
        if reply_to_message_id is not None:
            ref = self._messages.get(reply_to_message_id)
            extra["type"] = 19
            extra["message_reference"] = {
                "type": 0,
                "message_id": reply_to_message_id,
                "channel_id": cid,
                **({"guild_id": self.guild_id} if guild else {}),
            }
            extra["referenced_message"] = ref
        extra["attachments"] = [self._add_cdn(cid, n, b, t) for n, b, t in attachments or ()]
        if voice:
            extra["flags"] = 1 << 13  # IS_VOICE_MESSAGE
            for att in extra["attachments"]:
                att.update(duration_secs=2.5, waveform="AAAAAAAA")
        extra.update(fields or {})
        data = self._message_data(cid, author_id, content, **extra)
        await self._dispatch("MESSAGE_CREATE", data)
        return data["id"]

    async def inject_malformed(
        self,
        author_id: str,
        content: str = "secret words",
        *,
        guild: bool = False,
        drop: tuple[str, ...] = (),
        override: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Dispatch a MESSAGE_CREATE discord.py cannot parse: a normal payload with the keys in
        ``drop`` removed and ``override`` merged in. Returns the payload sent."""
        cid = self.channel_id if guild else self._dms.setdefault(author_id, self.new_id())
        data = self._message_data(cid, author_id, content)
        for key in drop:
            data.pop(key, None)
        data.update(override or {})
        await self._dispatch("MESSAGE_CREATE", data)
        return data

    def message_template(self, author_id: str, content: str) -> dict[str, Any]:
        """A well-formed DM MESSAGE_CREATE payload, not dispatched: for tests to break and send
        with :meth:`inject_raw`."""
        return copy.deepcopy(self._message_data(self.dm_channel(author_id), author_id, content))

    async def inject_raw(self, event: str, data: Any) -> None:
        """Dispatch ``event`` with ``data`` exactly as given (malformed payloads included)."""
        await self._dispatch(event, data)

    async def inject_dm(self, author_id: str, content: str, **kwargs: Any) -> str:
        return await self.inject_message(None, author_id, content, guild=False, **kwargs)

    async def redeliver(self, message_id: str) -> None:
        """Dispatch an earlier MESSAGE_CREATE again (new sequence number, same message)."""
        await self._dispatch("MESSAGE_CREATE", self._messages[message_id])

    def dm_channel(self, user_id: str) -> str:
        return self._dms.setdefault(user_id, self.new_id())

    async def _new_thread(self, parent: str) -> str:
        tid = self.new_id()
        self._threads[tid] = parent
        await self._dispatch("THREAD_CREATE", {**self._thread_data(tid), "newly_created": True})
        return tid

    # -- gateway ------------------------------------------------------------------------------
    async def _send(self, conn: _Conn, frame: dict[str, Any]) -> None:
        if conn.stalled or conn.ws.closed:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            await conn.ws.send_str(json.dumps(frame))

    async def _dispatch(self, event: str, data: dict[str, Any], session: _Session | None = None) -> None:
        """Log a dispatch in the session (for RESUME) and send it if the bot is connected. Events for
        a dead session are lost, as on Discord."""
        session = session or self._session
        if session is None:
            raise RuntimeError("the bot has not identified with the fake gateway yet")
        async with session.lock:
            session.seq += 1
            frame = {"op": 0, "t": event, "s": session.seq, "d": data}
            session.events.append(frame)
            if session.conn is not None and not session.dead:
                await self._send(session.conn, frame)
        self._notify()

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True, max_msg_size=0)
        await ws.prepare(request)
        conn = _Conn(ws=ws, request=request)
        self._conns.add(conn)
        self._notify()
        await self._send(
            conn,
            {
                "op": 10,
                "s": None,
                "t": None,
                "d": {"heartbeat_interval": int(self.heartbeat_interval * 1000)},
            },
        )
        try:
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    continue
                frame = json.loads(msg.data)
                op, d = frame.get("op"), frame.get("d")
                if op == 1:
                    self.heartbeats += 1
                    await self._send(conn, {"op": 11, "s": None, "t": None, "d": None})
                elif op == 2:
                    await self._identify(conn, d)
                elif op == 6:
                    await self._resume(conn, d)
                self._notify()
        finally:
            self._conns.discard(conn)
            if conn.session is not None and conn.session.conn is conn:
                conn.session.conn = None
            self._notify()
        return ws

    async def _identify(self, conn: _Conn, d: dict[str, Any]) -> None:
        if d.get("token") != self.token:
            await conn.ws.close(code=4004, message=b"Authentication failed.")
            return
        self.identifies += 1
        self.intents = d.get("intents")
        if self._session is not None:
            self._session.dead = True
        session = _Session(id=uuid.uuid4().hex)
        self._sessions[session.id] = session
        self._session, conn.session, session.conn = session, session, conn
        self.max_open_sessions = max(self.max_open_sessions, self.open_sessions())
        ready = {
            "v": 10,
            "user": self._bot_user(),
            "guilds": [{"id": self.guild_id, "unavailable": True}],
            "session_id": session.id,
            "session_type": "normal",
            "resume_gateway_url": self.gateway_url,
            "application": {"id": self.application_id, "flags": 0},
            "private_channels": [],
            "relationships": [],
        }
        if self._ready_held is None:
            await self._ready(session, ready)
        else:  # the read loop goes on meanwhile: a close from the bot ends the connection
            self._spawn(self._ready_later(self._ready_held, session, ready))

    async def _ready(self, session: _Session, ready: dict[str, Any]) -> None:
        await self._dispatch("READY", ready, session)
        await self._dispatch("GUILD_CREATE", self._guild_data(), session)

    async def _ready_later(self, held: asyncio.Event, session: _Session, ready: dict[str, Any]) -> None:
        await held.wait()
        if not session.dead and session.conn is not None and not session.conn.ws.closed:
            await self._ready(session, ready)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resume(self, conn: _Conn, d: dict[str, Any]) -> None:
        if d.get("token") != self.token:
            await conn.ws.close(code=4004, message=b"Authentication failed.")
            return
        session = self._sessions.get(d.get("session_id") or "")
        if session is None or session.dead:
            await self._send(conn, {"op": 9, "s": None, "t": None, "d": False})
            return
        after = d.get("seq") or 0
        async with session.lock:
            old = session.conn
            session.conn, conn.session = conn, session
            for frame in session.events:
                if frame["s"] > after:
                    await self._send(conn, frame)
        if old is not None and old is not conn:
            with contextlib.suppress(Exception):
                await old.ws.close(code=4000)
        self.resumes += 1
        self.max_open_sessions = max(self.max_open_sessions, self.open_sessions())
        await self._dispatch("RESUMED", {}, session)

    async def drop_connection(self, mode: Literal["close", "abort", "stall"] = "close") -> None:
        """Break the bot's live gateway connection: ``close`` (close frame 4000, resumable),
        ``abort`` (TCP reset, no close frame) or ``stall`` (half-open: the fake stops answering
        heartbeats and sending events, the bot notices only by its heartbeat timeout)."""
        session = self._session
        conn = session.conn if session else None
        if conn is None:
            raise RuntimeError("no live gateway connection")
        if mode == "stall":
            conn.stalled = True
        elif mode == "abort":
            if conn.request.transport is not None:
                conn.request.transport.abort()
        else:
            await conn.ws.close(code=4000, message=b"fake: reconnect")
        if session is not None and session.conn is conn:
            session.conn = None
        self._notify()

    async def invalidate_session(self) -> None:
        """Send op 9 (not resumable): the bot must IDENTIFY again and missed events are lost."""
        session = self._session
        if session is None:
            raise RuntimeError("no session")
        session.dead = True
        if session.conn is not None:
            await self._send(session.conn, {"op": 9, "s": None, "t": None, "d": False})
        self._notify()

    # -- REST ---------------------------------------------------------------------------------
    async def _me(self, request: web.Request) -> web.Response:
        return _json(self._bot_user())

    async def _application(self, request: web.Request) -> web.Response:
        return _json(
            {
                "id": self.application_id,
                "name": "Chital",
                "description": "",
                "icon": None,
                "bot_public": False,
                "bot_require_code_grant": False,
                "verify_key": "00" * 32,
                "owner": self._user(self.owner_id),
                "flags": 0,
                "rpc_origins": [],
                "summary": "",
                "team": None,
                "bot": self._bot_user(),
            }
        )

    async def _gateway_bot(self, request: web.Request) -> web.Response:
        return _json(
            {
                "url": self.gateway_url.rstrip("/"),
                "shards": 1,
                "session_start_limit": {
                    "total": 1000,
                    "remaining": 999,
                    "reset_after": 0,
                    "max_concurrency": 1,
                },
            }
        )

    def _check_channel(self, cid: str) -> web.Response | None:
        if not self._known_channel(cid):
            return _error(404, 10003, "Unknown Channel")
        if cid in self.forbidden_channels:
            return _error(403, 50013, "Missing Permissions")
        return None

    @staticmethod
    def _too_long() -> web.Response:
        errors = {
            "content": {
                "_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}]
            }
        }
        return _error(400, 50035, "Invalid Form Body", errors)

    async def _post_message(self, request: web.Request) -> web.Response:
        cid = request.match_info["cid"]
        if (bad := self._check_channel(cid)) is not None:
            return bad
        files: list[tuple[str, bytes, str]] = []
        if request.content_type.startswith("multipart/"):
            payload: dict[str, Any] = {}
            reader = await request.multipart()
            async for part in reader:
                if part.name == "payload_json":
                    payload = json.loads(await part.text())  # type: ignore[union-attr]
                elif part.name and part.name.startswith("files["):
                    body = bytes(await part.read())  # type: ignore[union-attr]
                    ctype = part.headers.get("Content-Type", "application/octet-stream")
                    files.append((part.filename or "file", body, ctype))  # type: ignore[union-attr]
        else:
            payload = await request.json()
        content = payload.get("content") or ""
        if len(content) > MAX_CONTENT:
            return self._too_long()
        if not content and not files and not payload.get("components"):
            return _error(400, 50006, "Cannot send an empty message")
        nonce = payload.get("nonce")
        self.message_posts[str(nonce)] += 1
        if nonce is not None and payload.get("enforce_nonce") and str(nonce) in self._nonces:
            return _json(self._messages[self._nonces[str(nonce)]])
        extra: dict[str, Any] = {"nonce": nonce} if nonce is not None else {}
        reply_to = None
        if ref := payload.get("message_reference"):
            reply_to = str(ref.get("message_id"))
            if reply_to in self._messages:
                extra.update(
                    type=19,
                    referenced_message=self._messages[reply_to],
                    message_reference={"type": 0, "message_id": reply_to, "channel_id": cid},
                )
            elif ref.get("fail_if_not_exists", True):
                return _error(
                    400,
                    50035,
                    "Invalid Form Body",
                    {"message_reference": {"_errors": [{"code": "REPLIES_UNKNOWN_MESSAGE"}]}},
                )
        extra["attachments"] = [self._add_cdn(cid, n, b, t) for n, b, t in files]
        extra["components"] = payload.get("components") or []
        data = self._message_data(cid, self.bot_id, content, **extra)
        self._offered[data["id"]] = _buttons(data["components"])
        if nonce is not None:
            self._nonces[str(nonce)] = data["id"]
        self.posted.append(
            PostedMessage(
                id=data["id"],
                channel_id=cid,
                content=content,
                reply_to=reply_to,
                nonce=None if nonce is None else str(nonce),
                files=[(n, b) for n, b, _ in files],
            )
        )
        if self._session is not None and not self._session.dead:
            await self._dispatch("MESSAGE_CREATE", data)  # Discord echoes the bot's own posts
        self._notify()
        await self._hold("POST", payload)
        return _json(data)

    async def _list_messages(self, request: web.Request) -> web.Response:
        """GET /channels/{id}/messages: newest first, ``before``/``after`` a message id, ``limit``
        1-100 (default 50), as Discord answers; 403 in a channel listed in ``no_history``."""
        cid = request.match_info["cid"]
        if (bad := self._check_channel(cid)) is not None:
            return bad
        if cid in self.no_history:
            return _error(403, 50001, "Missing Access")
        try:
            limit = int(request.query.get("limit", "50"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            return _error(
                400, 50035, "Invalid Form Body", {"limit": {"_errors": [{"code": "NUMBER_TYPE_MAX"}]}}
            )
        before, after = request.query.get("before"), request.query.get("after")
        found = [m for m in self._messages.values() if m["channel_id"] == cid]
        if before:
            found = [m for m in found if int(m["id"]) < int(before)]
        if after:
            found = [m for m in found if int(m["id"]) > int(after)]
        found.sort(key=lambda m: int(m["id"]), reverse=True)
        return _json(found[:limit])

    async def _get_message(self, request: web.Request) -> web.Response:
        data = self._messages.get(request.match_info["mid"])
        if data is None or data["channel_id"] != request.match_info["cid"]:
            return _error(404, 10008, "Unknown Message")
        return _json(data)

    async def _patch_message(self, request: web.Request) -> web.Response:
        cid, mid = request.match_info["cid"], request.match_info["mid"]
        data = self._messages.get(mid)
        if data is None or data["channel_id"] != cid:
            return _error(404, 10008, "Unknown Message")
        if data["author"]["id"] != self.bot_id:
            return _error(403, 50005, "Cannot edit a message authored by another user")
        payload = await request.json()
        if "content" in payload:
            content = payload["content"] or ""
            if len(content) > MAX_CONTENT:
                return self._too_long()
            data["content"] = content
            data["edited_timestamp"] = _now_iso()
            for m in self.posted:
                if m.id == mid:
                    m.content, m.edits = content, m.edits + 1
        if "components" in payload:  # absent: Discord keeps the message's components
            data["components"] = payload["components"] or []
            self._offered.setdefault(mid, []).extend(_buttons(data["components"]))
        self._notify()
        await self._hold("PATCH", payload)
        return _json(data)

    # -- components and interactions ----------------------------------------------------------
    def buttons(self, message_id: str) -> list[str]:
        """Labels of the buttons a message shows now."""
        return [b["label"] for b in _buttons(self._messages[message_id].get("components") or [])]

    def interaction(
        self, kind: int, channel_id: str, user_id: str, payload: dict[str, Any]
    ) -> dict[str, Any]:
        """An INTERACTION_CREATE body of ``kind`` (2: a command, 3: a component) from ``user_id`` in
        ``channel_id``, as Discord shapes it for a guild channel or thread (``member``) or a DM
        (``user``): the one builder the button presses and the command menus share."""
        iid = self.new_id()
        data: dict[str, Any] = {
            "id": iid, "application_id": self.application_id, "type": kind, "token": f"tok-{iid}", "version": 1,
            "data": payload, "channel_id": channel_id, "app_permissions": "0", "locale": "en-US",
            "entitlements": [], "attachment_size_limit": 10 * 1024 * 1024,
        }  # fmt: skip
        if self._is_guild_channel(channel_id):
            parent = self._threads.get(channel_id)
            data["guild_id"], data["guild_locale"], data["context"] = self.guild_id, "en-US", 0
            data["channel"] = {"id": channel_id, "type": 11 if parent else 0, "guild_id": self.guild_id,
                               "name": "thread" if parent else "general", "parent_id": parent,
                               "position": 0, "permission_overwrites": [], "nsfw": False}  # fmt: skip
            data["member"] = {"user": self._user(user_id), "roles": [], "joined_at": _now_iso(), "deaf": False,
                              "mute": False, "flags": 0, "permissions": "0"}  # fmt: skip
            data["authorizing_integration_owners"] = {"0": self.guild_id}
        else:
            data["channel"] = {"id": channel_id, "type": 1, "recipients": [self._user(user_id)]}
            data["user"], data["context"] = self._user(user_id), 1
            data["authorizing_integration_owners"] = {"1": user_id}
        return data

    async def press_button(self, message_id: str, user_id: str, label: str) -> str:
        """``user_id`` presses the button labelled ``label`` (or containing it) under a bot message:
        an INTERACTION_CREATE dispatch (type 3, message component) as Discord sends it. Returns the
        interaction id; the bot must answer on ``/interactions/{id}/{token}/callback``."""
        message = self._messages[message_id]
        button = next((b for b in self._offered.get(message_id, []) if label in b.get("label", "")), None)
        if button is None:
            raise AssertionError(f"no button {label!r} under message {message_id}")
        data = self.interaction(
            3, message["channel_id"], user_id, {"custom_id": button["custom_id"], "component_type": 2}
        )
        data["message"] = message
        iid = data["id"]
        self.interactions[iid] = data
        await self._dispatch("INTERACTION_CREATE", data)
        return iid

    def _record(self, data: dict[str, Any]) -> None:
        self.posted.append(
            PostedMessage(id=data["id"], channel_id=data["channel_id"], content=data["content"])
        )
        self._notify()

    async def run_command(
        self, user_id: str, name: str, args: str | None = None, *, channel_id: str | None = None
    ) -> str:
        """``user_id`` runs the application command ``name`` (with its one option ``args``) in
        ``channel_id`` (their DM by default): an INTERACTION_CREATE of type 2. Returns its id."""
        data = discord_commands.command_interaction(
            self, user_id, channel_id or self.dm_channel(user_id), name, args
        )
        await self.inject_interaction(data)
        return str(data["id"])

    def response_text(self, iid: str) -> str | None:
        """What the user sees as the response to interaction ``iid`` now (None: none yet)."""
        mid = self.originals.get(iid)
        return None if mid is None else str(self._messages[mid]["content"])

    async def inject_interaction(self, data: dict[str, Any]) -> None:
        """Dispatch an INTERACTION_CREATE exactly as given (malformed ones included); one with a
        string id and token can be answered on the callback route like any other."""
        if isinstance(data.get("id"), str) and isinstance(data.get("token"), str):
            self.interactions[data["id"]] = data
        await self._dispatch("INTERACTION_CREATE", data)

    def interaction_template(self, user_id: str, custom_id: str = "chital:approve:XXXX") -> dict[str, Any]:
        """A well-formed DM button press (type 3) on no message in particular, to break for tests."""
        iid = self.new_id()
        cid = self.dm_channel(user_id)
        return {
            "id": iid, "application_id": self.application_id, "type": 3, "token": f"tok-{iid}", "version": 1,
            "data": {"custom_id": custom_id, "component_type": 2}, "channel_id": cid,
            "channel": {"id": cid, "type": 1, "recipients": [self._user(user_id)]},
            "user": self._user(user_id), "context": 1, "app_permissions": "0", "locale": "en-US",
            "entitlements": [], "authorizing_integration_owners": {"1": user_id},
        }  # fmt: skip

    async def _interaction_callback(self, request: web.Request) -> web.Response:
        """POST /interactions/{id}/{token}/callback (``with_response``): once per interaction."""
        iid, token = request.match_info["iid"], request.match_info["token"]
        sent = self.interactions.get(iid)
        if sent is None or sent["token"] != token:
            return _error(404, 10062, "Unknown interaction")
        if iid in self.interaction_responses:
            return _error(400, 40060, "Interaction has already been acknowledged.")
        payload = await request.json()
        self.interaction_responses[iid] = payload
        self._notify()
        answer = payload.get("data") or {}
        flags = int(answer.get("flags") or 0)
        deferred = payload.get("type") == 5
        member = sent.get("member")
        presser = sent.get("user") or (member.get("user") if isinstance(member, dict) else None) or {}
        message = self._message_data(str(sent.get("channel_id") or "0"), self.bot_id, answer.get("content") or "",
                                     flags=flags | (128 if deferred else 0),
                                     interaction_metadata={"id": iid, "type": sent.get("type", 3), "user": presser,
                                                           "authorizing_integration_owners": {}})  # fmt: skip
        self.originals[iid] = message["id"]
        if deferred or sent.get("type") == 2:
            self._record(message)  # in the channel for everyone (ephemeral ones only for the user)
        return _json({
            "interaction": {"id": iid, "type": 3, "response_message_id": message["id"],
                            "response_message_loading": False, "response_message_ephemeral": bool(flags & 64)},
            "resource": {"type": payload.get("type", 4), "message": message},
        })  # fmt: skip

    async def _typing(self, request: web.Request) -> web.Response:
        cid = request.match_info["cid"]
        if (bad := self._check_channel(cid)) is not None:
            return bad
        self.typing[cid] += 1
        self._notify()
        return web.Response(status=204)

    async def _react(self, request: web.Request) -> web.Response:
        cid, mid = request.match_info["cid"], request.match_info["mid"]
        if mid not in self._messages:
            return _error(404, 10008, "Unknown Message")
        self.reactions.append((cid, mid, request.match_info["emoji"]))
        self._notify()
        return web.Response(status=204)

    async def _cdn_get(self, request: web.Request) -> web.Response:
        item = self._cdn.get(request.match_info["aid"])
        if item is None:
            return web.Response(status=404, text="Not Found")
        return web.Response(body=item[0], headers={"Content-Type": item[1]})
