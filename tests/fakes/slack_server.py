"""A fake Slack (Web API + Socket Mode) on 127.0.0.1 for driving the real slack_sdk / slack_bolt offline.

Point ``AsyncWebClient(base_url=fake.api_base_url)`` at it; ``apps.connections.open`` hands out a
``ws://`` URL on the same server. Wire facts follow docs/platforms.md (Slack). The fake records what a
user would see (the bot's messages with their current text, reactions, uploaded files) and which
envelopes the client acknowledged, and can break the connection in the ways real networks do.

It runs on whatever event loop starts it; a daemon under test may live in another process
(configure it with ``api_base_url``, ``bot_token`` and ``app_token`` from the fake).

Users: ``inject_mention`` (message + app_mention), ``inject_message``, ``inject_dm``,
``inject_thread_reply``, ``send_event``, ``redeliver``; ``add_file`` hosts a shared file. Events sent
while no live socket exists are queued and go out on the next connection.
Network: ``close_ws``, ``send_disconnect``, ``abort_ws``, ``stall``; ``fail(method, ...)`` for 429/5xx/
``ok: false`` answers. What users see: ``posts``, ``thread(channel, thread_ts)``, ``texts``,
``reactions``, ``uploads``; acks in ``acks`` / ``is_acked``; ``wait_for(predicate, timeout)``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import WSMsgType, web

from tests.fakes.slack_slash import declared_commands, slash_envelope

T = TypeVar("T")
ANY = object()
"""Sentinel for :meth:`FakeSlack.texts`: any thread."""


@dataclass
class Post:
    """A message the bot posted, as users see it now."""

    channel: str
    ts: str
    thread_ts: str | None
    text: str
    history: list[str] = field(default_factory=list)
    """Every text the message had, first to last (the post, then each chat.update)."""
    metadata: dict[str, Any] | None = None
    """Message metadata as posted ({"event_type", "event_payload"}); read back by conversations.*."""
    user: str | None = None
    """The user who posted it; None for the bot's own posts."""
    blocks: list[dict[str, Any]] | None = None
    """Block Kit blocks it shows now (chat.update keeps them unless it is given new ones)."""
    offered: list[dict[str, Any]] = field(default_factory=list)
    """Every button it was ever posted or updated with (a stale client can still press them)."""

    def buttons(self) -> list[str]:
        """Labels of the buttons it shows now."""
        return [b["text"]["text"] for b in _buttons(self.blocks)]


@dataclass
class Upload:
    file_id: str
    name: str
    title: str
    content: bytes
    channel: str | None = None
    thread_ts: str | None = None
    initial_comment: str | None = None


@dataclass
class Call:
    """One Web API call (the token is never recorded)."""

    method: str
    params: dict[str, Any]


@dataclass
class Injected:
    """A post by a (fake) user and the envelopes that carried it."""

    ts: str
    channel: str
    envelopes: list[dict[str, Any]]

    @property
    def envelope(self) -> dict[str, Any]:
        return self.envelopes[0]


@dataclass
class _Failure:
    status: int
    error: str
    retry_after: float | None
    times: int | None  # None: until cleared


@dataclass
class _Conn:
    ws: web.WebSocketResponse
    transport: asyncio.BaseTransport | None
    stalled: bool = False
    hard_stalled: bool = False
    released: asyncio.Event = field(default_factory=asyncio.Event)
    pings: int = 0
    unacked: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Envelopes sent on this connection and not acknowledged yet (``spread`` mode)."""


def _blocks(raw: Any) -> list[dict[str, Any]] | None:
    blocks = json.loads(raw) if isinstance(raw, str) else raw
    return list(blocks) if isinstance(blocks, list) and blocks else None


def _buttons(blocks: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [
        e
        for b in blocks or ()
        if b.get("type") == "actions"
        for e in b.get("elements", ())
        if e.get("type") == "button"
    ]


def _channel_type(channel: str) -> str:
    return {"D": "im", "G": "group"}.get(channel[:1], "channel")


class FakeSlack:
    """The fake server. ``async with FakeSlack() as slack:`` starts and stops it."""

    platform = "slack"
    """The channel name in the config and in user ids (``slack:<id>``)."""

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-fake-bot-token",
        app_token: str = "xapp-fake-app-token",
        team_id: str = "T_TEAM",
        bot_user_id: str = "U_BOT",
        bot_id: str = "B_BOT",
        hello: bool = True,
        echo_bot_posts: bool = True,
        redeliver_unacked_on_reconnect: bool = False,
        max_text_len: int = 40_000,
    ) -> None:
        self.bot_token, self.app_token = bot_token, app_token
        self.team_id, self.bot_user_id, self.bot_id = team_id, bot_user_id, bot_id
        self.hello = hello
        self.echo_bot_posts = echo_bot_posts
        """Send the bot's own posts and edits back as ``message`` events, as Slack does."""
        self.redeliver_unacked_on_reconnect = redeliver_unacked_on_reconnect
        self.max_text_len = max_text_len

        self.posts: list[Post] = []
        self.reactions: dict[tuple[str, str], list[str]] = {}
        self.uploads: list[Upload] = []
        self.calls: list[Call] = []
        self.acks: list[str] = []
        self.spread = False
        """Send each event to one of the open connections in turn (several daemons), and re-send
        what a dropped connection never acknowledged to another, as Slack does."""
        self._turn = 0
        self.ack_payloads: dict[str, Any] = {}
        self.sent: list[dict[str, Any]] = []
        """Every envelope written to a socket, in order (redeliveries included)."""
        self.connections = 0
        """How many Socket Mode connections were accepted so far."""
        self.downloads = 0
        self.users: dict[str, dict[str, Any]] = {}
        self.ephemerals: list[dict[str, Any]] = []
        self.slash_commands = declared_commands()
        """The slash commands the app's manifest declares (the only ones Slack sends)."""
        """chat.postEphemeral calls (channel, user, text, thread_ts): notes only one user sees."""
        self.channels: dict[str, dict[str, Any]] = {}

        self._messages: dict[tuple[str, str], Post] = {}  # every message, users' too
        self._ts = itertools.count(1)
        self._ids = itertools.count(1)
        self._failures: dict[str, list[_Failure]] = {}
        self._tickets: set[str] = set()
        self._conns: list[_Conn] = []
        self._queue: list[dict[str, Any]] = []  # envelopes waiting for a live connection
        self._superseded: set[str] = set()  # unacked envelopes already redelivered
        self._files: dict[str, tuple[str, bytes]] = {}  # id -> (name, content) downloadable
        self._pending_uploads: dict[str, tuple[str, bytes | None]] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.after_call: Callable[[str, dict[str, Any]], None] | None = None
        """Called once a Web API call took effect, before its answer is sent (crash windows)."""

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> FakeSlack:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/api/{method}", self._api)
        app.router.add_get("/api/{method}", self._api)
        app.router.add_get("/link/", self._socket)
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/files-pri/{file_id}/{name}", self._download)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        for conn in list(self._conns):
            conn.released.set()
            if conn.transport is not None:
                conn.transport.abort()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base_url(self) -> str:
        return f"{self.url}/api/"

    def channel_settings(self, ping_interval: float = 0.5) -> dict[str, Any]:
        """``channels.slack`` of a config that talks to this fake: the one factory the tests share
        (its tokens, its API address, a short ping so a dropped socket is noticed quickly)."""
        return {
            "enabled": True,
            "bot_token": self.bot_token,
            "app_token": self.app_token,
            "api_base_url": self.api_base_url,
            "ping_interval": ping_interval,
        }

    # -- failure injection --------------------------------------------------------------------
    def fail(
        self,
        method: str,
        error: str = "internal_error",
        *,
        status: int = 200,
        retry_after: float | None = None,
        times: int | None = 1,
    ) -> None:
        """Make the next ``times`` calls of ``method`` fail (``times=None``: until cleared).

        ``status=429`` answers ``ratelimited`` with a Retry-After header; other statuses answer
        ``{"ok": false, "error": error}`` with that status."""
        if status == 429:
            error = "ratelimited"
            retry_after = 1 if retry_after is None else retry_after
        self._failures.setdefault(method, []).append(_Failure(status, error, retry_after, times))

    def clear_failures(self, method: str | None = None) -> None:
        if method is None:
            self._failures.clear()
        else:
            self._failures.pop(method, None)

    # -- inbound: what users do -----------------------------------------------------------------
    def next_ts(self) -> str:
        """A fresh, monotonically increasing Slack timestamp."""
        n = next(self._ts)
        return f"{1_700_000_000 + n // 1_000_000}.{n % 1_000_000:06d}"

    def add_file(
        self, name: str, content: bytes, mimetype: str = "text/plain", *, subtype: str | None = None
    ) -> dict[str, Any]:
        """Host a file a user shares; returns the ``files[]`` entry to put into a message event.
        ``subtype="slack_audio"`` makes it a clip recorded in Slack (a voice note)."""
        file_id = f"F{next(self._ids):08d}"
        self._files[file_id] = (name, content)
        url = f"{self.url}/files-pri/{file_id}/{name}"
        return {
            **({"subtype": subtype} if subtype else {}),
            "id": file_id,
            "name": name,
            "title": name,
            "mimetype": mimetype,
            "size": len(content),
            "url_private": url,
            "url_private_download": url + "?download=1",
        }

    async def inject_message(
        self,
        channel: str,
        user: str,
        text: str,
        *,
        thread_ts: str | None = None,
        files: list[dict[str, Any]] | None = None,
        subtype: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Injected:
        """A user posts ``text``: one ``message`` event (channel_type from the channel id)."""
        ts = self.next_ts()
        event = self._message_event(channel, user, text, ts, thread_ts, files, subtype)
        event.update(extra or {})
        self._remember(channel, ts, thread_ts, text, user)
        return Injected(ts, channel, [await self.send_event(event)])

    async def inject_mention(
        self,
        channel: str,
        user: str,
        text: str,
        thread_ts: str | None = None,
        files: list[dict[str, Any]] | None = None,
    ) -> Injected:
        """A user mentions the bot in a channel: Slack sends BOTH a ``message`` and an ``app_mention``
        event for the one post (same ts, different event ids). ``text`` gets ``<@BOT>`` in front
        unless it already contains it."""
        mention = f"<@{self.bot_user_id}>"
        if mention not in text:
            text = f"{mention} {text}"
        ts = self.next_ts()
        self._remember(channel, ts, thread_ts, text, user)
        message = self._message_event(channel, user, text, ts, thread_ts, files, None)
        app_mention = {k: v for k, v in message.items() if k != "channel_type"}
        app_mention["type"] = "app_mention"
        first = await self.send_event(message)
        second = await self.send_event(app_mention)
        return Injected(ts, channel, [first, second])

    async def inject_dm(
        self,
        channel: str,
        user: str,
        text: str,
        thread_ts: str | None = None,
        files: list[dict[str, Any]] | None = None,
    ) -> Injected:
        """A direct message (``channel`` should start with D)."""
        return await self.inject_message(channel, user, text, thread_ts=thread_ts, files=files)

    async def inject_thread_reply(
        self, channel: str, user: str, text: str, thread_ts: str, *, mention: bool = False
    ) -> Injected:
        """A reply in a thread; ``mention=True`` makes it an @-mention (two events)."""
        if mention:
            return await self.inject_mention(channel, user, text, thread_ts=thread_ts)
        return await self.inject_message(channel, user, text, thread_ts=thread_ts)

    async def send_event(self, event: dict[str, Any], *, retry_attempt: int = 0) -> dict[str, Any]:
        """Wrap ``event`` in an events_api envelope and deliver it (queued while no live socket)."""
        n = next(self._ids)
        envelope = {
            "envelope_id": f"env-{n:06d}-{uuid.uuid4().hex[:8]}",
            "type": "events_api",
            "accepts_response_payload": False,
            "retry_attempt": retry_attempt,
            "retry_reason": "timeout" if retry_attempt else "",
            "payload": {
                "token": "verification-token",
                "team_id": self.team_id,
                "api_app_id": "A_APP",
                "event": event,
                "type": "event_callback",
                "event_id": f"Ev{n:08d}",
                "event_time": int(time.time()),
                "authorizations": [
                    {
                        "enterprise_id": None,
                        "team_id": self.team_id,
                        "user_id": self.bot_user_id,
                        "is_bot": True,
                        "is_enterprise_install": False,
                    }
                ],
                "is_ext_shared_channel": False,
            },
        }
        await self._deliver(envelope)
        return envelope

    async def inject_slash(self, channel: str, user: str, command: str, text: str = "") -> dict[str, Any]:
        """``user`` runs the slash ``command`` with ``text`` in ``channel`` (tests/fakes/slack_slash.py).
        As on Slack, only a command the app manifest declares can be run."""
        if command not in self.slash_commands:
            raise AssertionError(f"{command} is not declared in the app manifest; Slack would not send it")
        envelope = slash_envelope(
            n=next(self._ids), port=self.port, team_id=self.team_id, channel=channel, user=user,
            command=command, text=text, user_name=user.lower(),
        )  # fmt: skip
        await self._deliver(envelope)
        return envelope

    async def send_envelope(self, envelope: dict[str, Any]) -> dict[str, Any]:
        """Deliver ``envelope`` exactly as given: malformed ones (no payload, a string for the event)
        included. Use :meth:`send_event` for a well-formed envelope around a malformed event."""
        await self._deliver(envelope)
        return envelope

    async def redeliver(self, envelope: dict[str, Any], retry_attempt: int = 1) -> dict[str, Any]:
        """Send the same event again as Slack's retry does: same event_id, new envelope id."""
        again = json.loads(json.dumps(envelope))
        again["envelope_id"] = f"env-retry-{uuid.uuid4().hex[:12]}"
        again["retry_attempt"] = retry_attempt
        again["retry_reason"] = "timeout"
        await self._deliver(again)
        return again

    # -- the socket ---------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._live() is not None

    async def wait_connected(self, count: int = 1, timeout: float = 10.0) -> None:
        """Wait until at least ``count`` connections were made and one is live."""
        await self.wait_for(lambda: self.connections >= count and self.connected, timeout)

    async def close_ws(self) -> None:
        """Close the live socket with a close frame (the client reconnects at once)."""
        conn = self._current()
        if conn is not None:
            await conn.ws.close(code=1001, message=b"going away")

    async def send_disconnect(self, reason: str = "refresh_requested") -> None:
        """Ask the client to reconnect, as Slack does every few hours."""
        conn = self._current()
        if conn is not None:
            await conn.ws.send_json(
                {"type": "disconnect", "reason": reason, "debug_info": {"host": "fake-applink"}}
            )

    def abort_ws(self) -> None:
        """Drop the TCP connection without a close frame."""
        conn = self._current()
        if conn is not None and conn.transport is not None:
            conn.transport.abort()

    def stall(self, *, hard: bool = False) -> None:
        """Stop answering pings and delivering events on the live socket (half-open).

        By default the socket still reads (and honours a close frame); ``hard=True`` stops reading
        altogether, like a peer that vanished. The client notices after ~1.5-2 × its ping interval."""
        conn = self._current()
        if conn is not None:
            conn.stalled = True
            conn.hard_stalled = hard

    def is_acked(self, envelope: dict[str, Any] | str) -> bool:
        eid = envelope if isinstance(envelope, str) else envelope["envelope_id"]
        return eid in self.acks

    # -- what the bot did ---------------------------------------------------------------------
    def texts(self, channel: str, thread_ts: Any = ANY) -> list[str]:
        """Current texts of the bot's messages in ``channel`` (one thread, or top level for
        ``None``, or all by default), oldest first."""
        return [
            p.text
            for p in self.posts
            if p.channel == channel and (thread_ts is ANY or p.thread_ts == thread_ts)
        ]

    def thread(self, channel: str, thread_ts: str | None) -> dict[str, str]:
        """The bot's messages in one thread: ts → current text."""
        return {p.ts: p.text for p in self.posts if p.channel == channel and p.thread_ts == thread_ts}

    def post(self, ts: str) -> Post | None:
        return next((p for p in self.posts if p.ts == ts), None)

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    async def wait_for(self, predicate: Callable[[], T], timeout: float = 5.0) -> T:
        """Poll ``predicate`` until it returns something truthy; return that, or fail after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout}s")
            await asyncio.sleep(0.02)

    # -- internals: socket ----------------------------------------------------------------------
    def _current(self) -> _Conn | None:
        open_conns = [c for c in self._conns if not c.ws.closed]
        if self.spread and open_conns:
            # Several apps' connections (several daemons): Slack sends each event to one of them.
            self._turn = (self._turn + 1) % len(open_conns)
            return open_conns[self._turn]
        return open_conns[-1] if open_conns else None

    def _live(self) -> _Conn | None:
        conn = self._current()
        return conn if conn is not None and not conn.stalled else None

    async def _deliver(self, envelope: dict[str, Any]) -> None:
        conn = self._live()
        if conn is None:
            self._queue.append(envelope)
            return
        try:
            await conn.ws.send_json(envelope)
            self.sent.append(envelope)
            if self.spread:
                conn.unacked[envelope["envelope_id"]] = envelope
        except (ConnectionError, RuntimeError):
            self._queue.append(envelope)

    async def _flush(self) -> None:
        if self.redeliver_unacked_on_reconnect:
            for env in list(self.sent):
                eid = env["envelope_id"]
                if eid not in self.acks and eid not in self._superseded:
                    self._superseded.add(eid)
                    retry = json.loads(json.dumps(env))
                    retry["envelope_id"] = f"env-retry-{uuid.uuid4().hex[:12]}"
                    retry["retry_attempt"] = env.get("retry_attempt", 0) + 1
                    retry["retry_reason"] = "timeout"
                    self._queue.append(retry)
        queued, self._queue = self._queue, []
        for envelope in queued:
            await self._deliver(envelope)

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            return web.Response(status=401, text="invalid ticket")
        self._tickets.discard(ticket)
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        conn = _Conn(ws, request.transport)
        self._conns.append(conn)
        self.connections += 1
        if self.hello:
            await ws.send_json(
                {
                    "type": "hello",
                    "num_connections": len([c for c in self._conns if not c.ws.closed]),
                    "debug_info": {"host": "fake-applink", "approximate_connection_time": 18060},
                    "connection_info": {"app_id": "A_APP"},
                }
            )
        await self._flush()
        try:
            while not ws.closed:
                msg = await ws.receive()
                if conn.hard_stalled:  # read nothing more until the fake stops
                    await conn.released.wait()
                    break
                if msg.type == WSMsgType.PING:
                    if not conn.stalled:
                        await ws.pong(msg.data)
                        conn.pings += 1
                elif msg.type == WSMsgType.TEXT:
                    self._on_client_text(msg.data)
                elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                    break
        finally:
            if conn in self._conns:
                self._conns.remove(conn)
            if self.spread:  # what the dead connection never acknowledged goes to another one
                for eid, env in conn.unacked.items():
                    if eid not in self.acks:
                        retry = json.loads(json.dumps(env))
                        retry["envelope_id"] = f"env-retry-{uuid.uuid4().hex[:12]}"
                        retry["retry_attempt"] = env.get("retry_attempt", 0) + 1
                        retry["retry_reason"] = "timeout"
                        self._queue.append(retry)
                conn.unacked.clear()
                await self._flush()
        return ws

    def _on_client_text(self, data: str) -> None:
        try:
            message = json.loads(data)
        except ValueError:
            return
        if isinstance(message, dict) and "envelope_id" in message:
            self.acks.append(message["envelope_id"])
            self.ack_payloads[message["envelope_id"]] = message.get("payload")

    # -- internals: events --------------------------------------------------------------------
    def _message_event(
        self,
        channel: str,
        user: str,
        text: str,
        ts: str,
        thread_ts: str | None,
        files: list[dict[str, Any]] | None,
        subtype: str | None,
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "type": "message",
            "user": user,
            "text": text,
            "ts": ts,
            "event_ts": ts,
            "channel": channel,
            "channel_type": _channel_type(channel),
            "team": self.team_id,
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        if files:
            event["files"] = files
            event["subtype"] = "file_share"
        if subtype:
            event["subtype"] = subtype
        if user in self.users:
            profile = self.users[user].get("profile", {})
            event["user_profile"] = {
                "display_name": profile.get("display_name", ""),
                "real_name": profile.get("real_name", ""),
                "name": self.users[user].get("name", ""),
            }
        return event

    def _remember(
        self, channel: str, ts: str, thread_ts: str | None, text: str, user: str | None = None
    ) -> Post:
        post = Post(channel, ts, thread_ts, text, [text], user=user)
        self._messages[(channel, ts)] = post
        return post

    async def _echo(self, event: dict[str, Any]) -> None:
        if self.echo_bot_posts:
            await self.send_event(event)

    # -- internals: Web API -------------------------------------------------------------------
    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params: dict[str, Any] = dict(request.query)
        if request.content_type == "application/json":
            body = await request.json()
            if isinstance(body, dict):
                params.update(body)
        elif request.can_read_body:
            form = await request.post()
            params.update({k: v for k, v in form.items() if isinstance(v, str)})
        token = params.pop("token", None)
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            token = auth[len("Bearer ") :]
        self.calls.append(Call(method, params))

        failures = self._failures.get(method)
        if failures:
            failure = failures[0]
            if failure.times is not None:
                failure.times -= 1
                if failure.times <= 0:
                    failures.pop(0)
            headers = {"Retry-After": f"{failure.retry_after:g}"} if failure.retry_after is not None else {}
            return web.json_response(
                {"ok": False, "error": failure.error}, status=failure.status, headers=headers
            )

        expected = self.app_token if method == "apps.connections.open" else self.bot_token
        if not token:
            return web.json_response({"ok": False, "error": "not_authed"})
        if token != expected:
            kind_ok = token.startswith("xapp-") == expected.startswith("xapp-")
            error = "invalid_auth" if kind_ok else "not_allowed_token_type"
            return web.json_response({"ok": False, "error": error})
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"})
        result: dict[str, Any] = await handler(params)
        if self.after_call is not None:
            self.after_call(method, params)  # e.g. kill the bot before it reads the answer
        if "ok" not in result:
            result = {"ok": True, **result}
        return web.json_response(result)

    async def _m_auth_test(self, p: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": "https://fake.slack.com/",
            "team": "Fake Team",
            "user": "chital",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    async def _m_apps_connections_open(self, p: dict[str, Any]) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        return {"url": f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}&app_id=A_APP"}

    async def _m_chat_postMessage(self, p: dict[str, Any]) -> dict[str, Any]:
        channel, text = p.get("channel"), p.get("text") or ""
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not text.strip() and not p.get("blocks"):
            return {"ok": False, "error": "no_text"}
        if len(text) > self.max_text_len:
            return {"ok": False, "error": "msg_too_long"}
        thread_ts = p.get("thread_ts") or None
        ts = self.next_ts()
        post = self._remember(channel, ts, thread_ts, text)
        meta = p.get("metadata")
        post.metadata = json.loads(meta) if isinstance(meta, str) else meta
        post.blocks = _blocks(p.get("blocks"))
        post.offered += _buttons(post.blocks)
        self.posts.append(post)
        message = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id, "text": text, "ts": ts}
        if thread_ts:
            message["thread_ts"] = thread_ts
        await self._echo({**message, "channel": channel, "channel_type": _channel_type(channel)})
        return {"channel": channel, "ts": ts, "message": message}

    def _history_item(self, post: Post, with_meta: bool) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id,
                                "text": post.text, "ts": post.ts}  # fmt: skip
        if post.user is not None:  # a person's post: no bot_id; the profile as Slack often includes it
            item = {"type": "message", "user": post.user, "text": post.text, "ts": post.ts}
            profile = self.users.get(post.user, {}).get("profile")
            if profile:
                item["user_profile"] = {"display_name": profile.get("display_name", ""),
                                        "real_name": profile.get("real_name", "")}  # fmt: skip
        if post.thread_ts:
            item["thread_ts"] = post.thread_ts
        if with_meta and post.metadata:
            item["metadata"] = post.metadata
        return item

    async def _m_conversations_history(self, p: dict[str, Any]) -> dict[str, Any]:
        """The bot's posts in the channel (top level), newest first; metadata only when asked."""
        channel = p.get("channel", "")
        oldest = float(p.get("oldest") or 0)
        with_meta = str(p.get("include_all_metadata", "")).lower() in ("1", "true")
        posts = [m for (c, _), m in self._messages.items() if c == channel and not m.thread_ts]
        posts = [m for m in posts if float(m.ts) > oldest]
        items = [
            self._history_item(m, with_meta) for m in sorted(posts, key=lambda m: float(m.ts), reverse=True)
        ]
        return {"messages": items[: int(p.get("limit") or 100)], "has_more": False}

    async def _m_conversations_replies(self, p: dict[str, Any]) -> dict[str, Any]:
        """One thread, oldest first: its parent, then every reply (people's and the bot's), within
        ``oldest``/``latest`` (``inclusive``), ``limit`` per page, paged by ``cursor`` (an offset
        here); metadata only when asked."""
        channel, ts = p.get("channel", ""), p.get("ts", "")
        if (channel, ts) not in self._messages and not any(
            c == channel and m.thread_ts == ts for (c, _), m in self._messages.items()
        ):
            return {"ok": False, "error": "thread_not_found"}
        with_meta = str(p.get("include_all_metadata", "")).lower() in ("1", "true")
        inclusive = str(p.get("inclusive", "")).lower() in ("1", "true")
        latest, oldest = float(p.get("latest") or "inf"), float(p.get("oldest") or 0)
        posts = [m for (c, t), m in self._messages.items() if c == channel and (m.thread_ts == ts or t == ts)]
        posts = [
            m for m in posts
            if (oldest <= float(m.ts) <= latest if inclusive else oldest < float(m.ts) < latest)
        ]  # fmt: skip
        items = [self._history_item(m, with_meta) for m in sorted(posts, key=lambda m: float(m.ts))]
        start, limit = int(p.get("cursor") or 0), int(p.get("limit") or 100)
        page, rest = items[start : start + limit], items[start + limit :]
        more = {"response_metadata": {"next_cursor": str(start + limit)}} if rest else {}
        return {"messages": page, "has_more": bool(rest), **more}

    async def _m_chat_update(self, p: dict[str, Any]) -> dict[str, Any]:
        channel, ts, text = p.get("channel", ""), p.get("ts", ""), p.get("text") or ""
        post = self._messages.get((channel, ts))
        if post is None:
            return {"ok": False, "error": "message_not_found"}
        if post not in self.posts:
            return {"ok": False, "error": "cant_update_message"}
        if len(text) > self.max_text_len:
            return {"ok": False, "error": "msg_too_long"}
        if not text.strip() and not p.get("blocks"):
            return {"ok": False, "error": "no_text"}
        post.text = text
        post.history.append(text)
        if "blocks" in p:  # without blocks Slack keeps the message's blocks
            post.blocks = _blocks(p.get("blocks"))
            post.offered += _buttons(post.blocks)
        await self._echo(
            {
                "type": "message",
                "subtype": "message_changed",
                "channel": channel,
                "channel_type": _channel_type(channel),
                "ts": self.next_ts(),
                "hidden": True,
                "message": {
                    "type": "message",
                    "user": self.bot_user_id,
                    "bot_id": self.bot_id,
                    "text": text,
                    "ts": ts,
                },
            }
        )
        return {"channel": channel, "ts": ts, "text": text}

    async def _m_chat_postEphemeral(self, p: dict[str, Any]) -> dict[str, Any]:
        if not p.get("channel") or not p.get("user"):
            return {
                "ok": False,
                "error": "channel_not_found" if not p.get("channel") else "user_not_in_channel",
            }
        self.ephemerals.append({k: p.get(k) for k in ("channel", "user", "text", "thread_ts")})
        return {"message_ts": self.next_ts()}

    async def press_button(
        self, channel: str, ts: str, user: str, label: str, *, name: str = ""
    ) -> dict[str, Any]:
        """``user`` presses the button labelled ``label`` (or containing it) under the bot's message
        ``ts``: a ``block_actions`` payload in an ``interactive`` envelope over the socket, shaped as
        Slack sends it. Returns the envelope (see :meth:`is_acked`)."""
        post = self._messages[(channel, ts)]
        button = next((b for b in post.offered if label in b["text"]["text"]), None)
        if button is None:
            raise AssertionError(f"no button {label!r} under {ts}")
        message: dict[str, Any] = {"type": "message", "user": self.bot_user_id, "bot_id": self.bot_id,
                                   "text": post.text, "ts": ts, "blocks": post.blocks or []}  # fmt: skip
        if post.thread_ts:
            message["thread_ts"] = post.thread_ts
        n = next(self._ids)
        envelope = {
            "envelope_id": f"env-{n:06d}-{uuid.uuid4().hex[:8]}",
            "type": "interactive",
            "accepts_response_payload": False,
            "payload": {
                "type": "block_actions",
                "user": {"id": user, "username": name or user, "name": name or user, "team_id": self.team_id},
                "api_app_id": "A_APP",
                "token": "verification-token",
                "container": {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": False},
                "trigger_id": f"{n}.{uuid.uuid4().hex[:8]}",
                "team": {"id": self.team_id, "domain": "fake"},
                "enterprise": None,
                "is_enterprise_install": False,
                "channel": {"id": channel, "name": channel.lower()},
                "message": message,
                "state": {"values": {}},
                "response_url": f"http://127.0.0.1:{self.port}/actions/{n}",
                "actions": [{
                    "action_id": button["action_id"], "block_id": "b1", "text": button["text"],
                    "value": button.get("value", ""), "type": "button", "action_ts": self.next_ts(),
                    **({"style": button["style"]} if "style" in button else {}),
                }],
            },
        }  # fmt: skip
        await self._deliver(envelope)
        return envelope

    async def _m_reactions_add(self, p: dict[str, Any]) -> dict[str, Any]:
        key = (p.get("channel", ""), p.get("timestamp", ""))
        if key not in self._messages:
            return {"ok": False, "error": "message_not_found"}
        names = self.reactions.setdefault(key, [])
        if p.get("name") in names:
            return {"ok": False, "error": "already_reacted"}
        names.append(str(p.get("name")))
        return {}

    async def _m_reactions_remove(self, p: dict[str, Any]) -> dict[str, Any]:
        names = self.reactions.get((p.get("channel", ""), p.get("timestamp", "")), [])
        if p.get("name") not in names:
            return {"ok": False, "error": "no_reaction"}
        names.remove(str(p.get("name")))
        return {}

    async def _m_users_info(self, p: dict[str, Any]) -> dict[str, Any]:
        user = self.users.get(p.get("user", ""))
        return {"user": user} if user else {"ok": False, "error": "user_not_found"}

    async def _m_conversations_info(self, p: dict[str, Any]) -> dict[str, Any]:
        cid = p.get("channel", "")
        info = self.channels.get(cid) or {"id": cid, "name": cid.lower(), "is_im": cid.startswith("D")}
        return {"channel": info}

    async def _m_files_getUploadURLExternal(self, p: dict[str, Any]) -> dict[str, Any]:
        if not p.get("filename") or not p.get("length"):
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F{next(self._ids):08d}"
        self._pending_uploads[file_id] = (str(p["filename"]), None)
        return {"upload_url": f"{self.url}/upload/{file_id}", "file_id": file_id}

    async def _m_files_completeUploadExternal(self, p: dict[str, Any]) -> dict[str, Any]:
        files = p.get("files")
        if isinstance(files, str):
            files = json.loads(files)
        done = []
        for f in files or []:
            name, content = self._pending_uploads.get(f.get("id"), ("", None))
            if content is None:
                return {"ok": False, "error": "file_not_found"}
            upload = Upload(
                f["id"],
                name,
                f.get("title") or name,
                content,
                p.get("channel_id"),
                p.get("thread_ts"),
                p.get("initial_comment"),
            )
            self.uploads.append(upload)
            done.append({"id": upload.file_id, "name": name, "title": upload.title, "size": len(content)})
        return {"files": done}

    async def _upload(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        if file_id not in self._pending_uploads:
            return web.Response(status=404, text="not found")
        name, _ = self._pending_uploads[file_id]
        content = await request.read()
        self._pending_uploads[file_id] = (name, content)
        return web.Response(text=f"OK - {len(content)}", content_type="text/plain")

    async def _download(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization", "") != f"Bearer {self.bot_token}":
            return web.Response(status=403, text="forbidden")
        entry = self._files.get(request.match_info["file_id"])
        if entry is None:
            return web.Response(status=404, text="not found")
        self.downloads += 1
        return web.Response(body=entry[1], content_type="application/octet-stream")
