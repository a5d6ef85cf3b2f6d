"""A fake Matrix homeserver (Client-Server API paths matrix-nio 0.26 calls) on 127.0.0.1.

What it speaks: ``/_matrix/client/v3/account/whoami``, ``/sync`` (``since`` tokens, a ``timeout``
long poll, a timeline per joined room, invites), ``/rooms/{room}/send/{type}/{txnId}`` (a repeated
txnId answers the event it already made, as a real homeserver does), ``/rooms/{room}/event/{id}``,
``/rooms/{room}/joined_members``, ``/rooms/{room}/typing/{user}``, ``/join/{room}``,
``/profile/{user}[/displayname]``, media upload (``/_matrix/media/v3/upload``) and authenticated
download (``/_matrix/client/v1/media/download/{server}/{id}``).

What tests script: users' events (:meth:`inject_text` and friends), raw events for malformed input,
redelivery of an event, a dropped sync connection, a 429 with ``retry_after_ms``, a revoked token
(401 ``M_UNKNOWN_TOKEN``). What they read: the bot's messages as a user sees them (edits applied),
the raw events, the calls.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote

from aiohttp import web

from tests.fakes.polling import poll

T = TypeVar("T")
SERVER = "fake.test"


@dataclass
class Seen:
    """A bot message as a user sees it: its current content after edits."""

    event_id: str
    room_id: str
    content: dict[str, Any]
    edits: int = 0
    raw: list[dict[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return str(self.content.get("body", ""))

    @property
    def reply_to(self) -> str | None:
        rel = self.content.get("m.relates_to") or {}
        reply = rel.get("m.in_reply_to") or {}
        return reply.get("event_id")

    @property
    def thread(self) -> str | None:
        rel = self.content.get("m.relates_to") or {}
        return rel.get("event_id") if rel.get("rel_type") == "m.thread" else None


class FakeMatrix:
    platform = "matrix"

    def __init__(
        self, token: str = "syt_fake_matrix_access_token_0123456789", user_id: str = f"@chital:{SERVER}"
    ) -> None:
        self.token = token
        self.user_id = user_id
        self.display_name = "Chital"
        self.port = 0
        self.calls: list[tuple[str, str]] = []
        self._runner: web.AppRunner | None = None
        self._stream: list[tuple[int, str, dict[str, Any]]] = []  # (position, room, event)
        self._invites: dict[str, dict[str, Any]] = {}
        self._members: dict[str, set[str]] = {}
        self._joined_at: dict[str, int] = {}
        """Stream position at which the bot joined each room (0: before the test began)."""
        self._events: dict[str, tuple[str, dict[str, Any]]] = {}
        self._txns: dict[str, str] = {}
        self._media: dict[str, tuple[bytes, str]] = {}
        self.messages: dict[str, Seen] = {}
        self._ids = itertools.count(1)
        self._pos = 0
        self._changed = asyncio.Event()
        self._revoked = False
        self._fail: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self._drop_syncs = 0
        self._stalled = False
        self.syncs = 0
        self.syncing = 0
        """Sync requests being answered now (long polls in flight)."""
        self.most_syncing = 0
        """The most sync requests ever in flight at once: above 1, two clients synced the account."""
        self.timeline_cap: int | None = None
        """Serve at most this many timeline events per room and sync, whatever the filter asks (a
        homeserver may serve fewer): a longer gap is ``limited`` and must be paginated back."""
        self.paginations: list[dict[str, str]] = []
        """The query of every ``/rooms/{room}/messages`` call."""
        self.uploads: list[tuple[str, bytes]] = []
        """(file name, bytes) of every upload to the media repository."""
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        """(room, event type, content) of every event the bot sent."""

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def channel_settings(self) -> dict[str, Any]:
        return {"enabled": True, "homeserver": self.base_url, "user_id": self.user_id,
                "access_token": self.token, "sync_timeout": 2}  # fmt: skip

    async def start(self) -> FakeMatrix:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/_matrix/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[union-attr]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        self._bump()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- scripting -------------------------------------------------------------------------------
    def room(self, room_id: str, *members: str) -> str:
        """A room the bot is in with ``members`` (two people and the bot: a group)."""
        self._members[room_id] = {self.user_id, *members}
        self._joined_at[room_id] = 0
        return room_id

    def invite(self, room_id: str, inviter: str) -> None:
        self._invites[room_id] = {"invite_state": {"events": [
            {"type": "m.room.member", "state_key": self.user_id, "sender": inviter,
             "content": {"membership": "invite"}}]}}  # fmt: skip
        self._members.setdefault(room_id, {inviter})
        self._bump()

    def inject_event(self, room_id: str, event: Any) -> Any:
        """Append ``event`` (raw: any JSON, for malformed input) to ``room_id``'s timeline."""
        self._pos += 1
        self._stream.append((self._pos, room_id, event))
        if isinstance(event, dict) and isinstance(event.get("event_id"), str):
            self._events[event["event_id"]] = (room_id, event)
        self._bump()
        return event

    def inject_text(self, room_id: str, sender: str, body: str, **content: Any) -> dict[str, Any]:
        return self.inject_event(room_id, self.event(sender, {"msgtype": "m.text", "body": body, **content}))

    def event(self, sender: str, content: dict[str, Any], etype: str = "m.room.message") -> dict[str, Any]:
        return {"type": etype, "event_id": f"${next(self._ids)}-{time.time_ns()}:{SERVER}",
                "sender": sender, "origin_server_ts": int(time.time() * 1000), "content": content}  # fmt: skip

    def redeliver(self, event: dict[str, Any]) -> None:
        """The same event once more in a later batch (a homeserver replaying after a lost answer)."""
        self.inject_event(self.room_of(event["event_id"]), event)

    def add_media(self, data: bytes, mime: str = "application/octet-stream") -> str:
        media_id = f"m{next(self._ids)}"
        self._media[media_id] = (data, mime)
        return f"mxc://{SERVER}/{media_id}"

    def media(self, mxc: str) -> bytes:
        return self._media[mxc.rsplit("/", 1)[-1]][0]

    def fail_next(self, kind: str, status: int, **body: Any) -> None:
        """The next call of ``kind`` (``send``, ``sync``, ``upload``, ``messages``) answers ``status``."""
        self._fail.setdefault(kind, []).append((status, body))

    def drop_syncs(self, times: int = 1) -> None:
        """The next ``times`` sync requests have their connection closed without an answer."""
        self._drop_syncs += times

    def stall_syncs(self, stalled: bool = True) -> None:
        """Sync requests get no answer at all while stalled (a half-open connection)."""
        self._stalled = stalled
        self._bump()

    def revoke_token(self) -> None:
        self._revoked = True
        self._bump()

    # -- reading ---------------------------------------------------------------------------------
    def bot_messages(self, room_id: str) -> list[Seen]:
        return [m for m in self.messages.values() if m.room_id == room_id]

    def replies_to(self, room_id: str, event_id: str) -> list[Seen]:
        return [m for m in self.bot_messages(room_id) if m.reply_to == event_id]

    def edits(self) -> list[dict[str, Any]]:
        return [c for _, _, c in self.sent if (c.get("m.relates_to") or {}).get("rel_type") == "m.replace"]

    async def wait_for(self, check: Callable[[], T | None], timeout: float = 15, what: str = "") -> T:
        found: T = await poll(check, timeout, what, lambda: [c for _, _, c in self.sent][-5:], every=0.05)
        return found

    # -- server ----------------------------------------------------------------------------------
    def _bump(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def room_of(self, event_id: str) -> str:
        """The room an event was injected into."""
        return self._events[event_id][0]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = "/" + unquote(request.match_info["path"])
        self.calls.append((request.method, path))
        if self._revoked or request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        if "access_token" in request.query:
            return _error(400, "M_UNRECOGNIZED", "token in the query")  # nio moves it to the header
        parts = path.strip("/").split("/")
        if path.endswith("/account/whoami"):
            return web.json_response({"user_id": self.user_id, "device_id": "FAKEDEVICE"})
        if path.endswith("/sync"):
            return await self._sync(request)
        if "/profile/" in path:
            return web.json_response({"displayname": self.display_name})
        if "/join/" in path:
            room = parts[-1]
            self._invites.pop(room, None)
            self._members.setdefault(room, set()).add(self.user_id)
            member = self.event(self.user_id, {"membership": "join"}, "m.room.member")
            self.inject_event(room, {**member, "state_key": self.user_id})
            self._joined_at[room] = self._pos
            return web.json_response({"room_id": room})
        if path.startswith("/media/v3/upload"):
            return await self._upload(request)
        if path.startswith("/client/v1/media/download/"):
            media = self._media.get(parts[5] if len(parts) > 5 else "")
            if media is None:
                return _error(404, "M_NOT_FOUND", "no such media")
            return web.Response(body=media[0], content_type=media[1])
        if len(parts) >= 5 and parts[2] == "rooms":
            return await self._room(request, parts[3], parts[4:])
        return _error(404, "M_UNRECOGNIZED", "unknown path")

    async def _room(self, request: web.Request, room: str, rest: list[str]) -> web.StreamResponse:
        if rest[0] == "joined_members":
            return web.json_response({"joined": {m: {} for m in self._members.get(room, set())}})
        if rest[0] == "messages":
            return self._messages(request, room)
        if rest[0] == "typing":
            return web.json_response({})
        if rest[0] == "event":
            found = self._events.get(rest[1])
            return web.json_response(found[1]) if found else _error(404, "M_NOT_FOUND", "no event")
        if rest[0] == "send" and len(rest) == 3:
            failure = self._take("send")
            if failure:
                return failure
            etype, txn = rest[1], rest[2]
            if txn in self._txns:  # idempotent, like a homeserver: the same event again
                return web.json_response({"event_id": self._txns[txn]})
            content = await request.json()
            if len(json.dumps(content, ensure_ascii=False).encode()) > 65_536:  # the spec's event limit
                return _error(413, "M_TOO_LARGE", "event too large")
            event = self.event(self.user_id, content, etype)
            self._txns[txn] = event["event_id"]
            self.sent.append((room, etype, content))
            self._events[event["event_id"]] = (room, event)
            rel = content.get("m.relates_to") or {}
            if etype == "m.room.message" and rel.get("rel_type") == "m.replace":
                seen = self.messages.get(rel.get("event_id", ""))
                if seen is not None:
                    new = dict(content.get("m.new_content") or {})
                    new.setdefault("m.relates_to", seen.content.get("m.relates_to"))
                    seen.content, seen.edits = new, seen.edits + 1
                    seen.raw.append(content)
            elif etype == "m.room.message":
                self.messages[event["event_id"]] = Seen(event["event_id"], room, content, raw=[content])
            self.inject_event(room, event)  # the bot's own events come back in its sync, as on Matrix
            return web.json_response({"event_id": event["event_id"]})
        return _error(404, "M_UNRECOGNIZED", "unknown room path")

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        failure = self._take("upload")
        if failure:
            return failure
        data = await request.read()
        self.uploads.append((request.query.get("filename", ""), data))
        return web.json_response({"content_uri": self.add_media(data, request.content_type)})

    async def _sync(self, request: web.Request) -> web.StreamResponse:
        self.syncs += 1
        self.syncing += 1
        self.most_syncing = max(self.most_syncing, self.syncing)
        try:
            return await self._sync_answer(request)
        finally:
            self.syncing -= 1

    async def _sync_answer(self, request: web.Request) -> web.StreamResponse:
        if self._drop_syncs:
            self._drop_syncs -= 1
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        failure = self._take("sync")
        if failure:
            return failure
        while self._stalled:
            await asyncio.sleep(0.05)
        since = int(request.query.get("since", "0") or 0)
        timeout = int(request.query.get("timeout", "0") or 0) / 1000
        deadline = time.monotonic() + timeout
        while not self._revoked and not self._invites and not any(p > since for p, _, _ in self._stream):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                break
        if self._revoked:
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        picked: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for pos, room, event in self._stream:
            joined = self._joined_at.get(room)
            if joined is None:
                continue  # not a member: no timeline (an invite shows in "invite" only)
            # A room joined since the last batch comes with its recent history, as on a homeserver.
            if pos > since or joined > since:
                picked.setdefault(room, []).append((pos, event))
        limit = self._timeline_limit(request)
        rooms: dict[str, Any] = {}
        for room, events in picked.items():
            # The newest ``limit`` events; an older rest makes the timeline limited, with the
            # token (just before the first event served) to paginate back from.
            served = events[-limit:]
            timeline: dict[str, Any] = {"events": [e for _, e in served], "limited": len(events) > limit}
            timeline["prev_batch"] = str(served[0][0] - 1)
            rooms[room] = {"timeline": timeline}
        body = {"next_batch": str(self._pos), "rooms": {"join": rooms, "invite": dict(self._invites)}}
        return web.Response(text=json.dumps(body), content_type="application/json")

    def _timeline_limit(self, request: web.Request) -> int:
        """The sync filter's ``room.timeline.limit`` (10 without one, Synapse's default), capped
        by :attr:`timeline_cap`."""
        try:
            asked = json.loads(request.query.get("filter", "{}"))["room"]["timeline"]["limit"]
        except (ValueError, KeyError, TypeError):
            asked = 10
        limit = asked if isinstance(asked, int) and asked > 0 else 10
        return min(limit, self.timeline_cap) if self.timeline_cap else limit

    def _messages(self, request: web.Request, room: str) -> web.StreamResponse:
        """``GET /rooms/{room}/messages`` backwards (the only direction the bot uses): the room's
        events after ``to`` up to ``from``, newest first; ``end`` only while more remain."""
        query = dict(request.query)
        self.paginations.append(query)
        failure = self._take("messages")
        if failure:
            return failure
        if query.get("dir") != "b":
            return _error(400, "M_INVALID_PARAM", "only dir=b is served by this fake")
        try:
            start, stop = int(query["from"]), int(query.get("to", "0") or 0)
            limit = min(int(query.get("limit", "10")), self.timeline_cap or 1000)
        except (KeyError, ValueError):
            return _error(400, "M_INVALID_PARAM", "bad from/to/limit")
        inside = [(p, e) for p, r, e in self._stream if r == room and stop < p <= start]
        chunk = inside[::-1][:limit]
        body: dict[str, Any] = {"start": query["from"], "chunk": [e for _, e in chunk]}
        if chunk and len(inside) > len(chunk):
            body["end"] = str(chunk[-1][0] - 1)
        return web.json_response(body)

    def _take(self, kind: str) -> web.StreamResponse | None:
        queue = self._fail.get(kind)
        if not queue:
            return None
        status, body = queue.pop(0)
        return web.json_response({"errcode": body.pop("errcode", "M_UNKNOWN"), "error": "scripted", **body},
                                 status=status)  # fmt: skip


def _error(status: int, errcode: str, message: str) -> web.Response:
    return web.json_response({"errcode": errcode, "error": message}, status=status)
