"""The Matrix adapter: matrix-nio's ``AsyncClient`` for every call, our own sync loop.

Durability: a sync batch's events are each handed to ``sink`` (which journals them) before the
batch's ``next_batch`` token is written to disk (channels/matrix/api.py ``SyncToken``); after a
crash the homeserver serves the same events again from the older token and the journal drops the
duplicates (the key is the room id and the ``event_id``). Sends carry a transaction id derived
from the reply part's idempotency key: a homeserver answers a repeated ``PUT
/send/{type}/{txnId}`` with the event it already made, so a send whose answer was lost is simply
repeated (``dedupes_sends``).

Gating: an event is ``addressed`` in a DM (a room of at most two members), when it mentions the
bot (``m.mentions``, a pill, its user id or display name), replies to one of the bot's events, or
starts with ``/``. A thread (``m.thread``) is a conversation of its own.

Encrypted rooms are refused: nio without libolm cannot decrypt, so an ``m.room.encrypted`` event
becomes an ``unsupported`` message the gateway answers with a note (in a DM each time, in a room
the first one per room and process, so a busy encrypted room is not flooded).

Approvals: Matrix has no buttons (``capabilities.buttons`` False); the gateway's text fallback
(``approve CODE``) is what works.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import io
import logging
import time
import uuid
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from nio import Api, AsyncClient, AsyncClientConfig

from channels import malformed
from channels.base import (
    REPLIED_MAX_CHARS,
    Attachment,
    Capabilities,
    Channel,
    ChannelError,
    ContextItem,
    FatalChannelError,
    Inbound,
    InboundSink,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    TransientSendError,
    replied_extra,
    replied_item,
)
from channels.limits import check_size, read_capped

from . import api
from .api import Rejected, SyncToken, authorised, checked, get_json, send_error
from .backfill import fill_gaps
from .inbound import (
    ENCRYPTED,
    HANDLED,
    MEMBER,
    REPLY_FALLBACK,
    check_event,
    listed,
    obj,
    own_join,
    recover_ids,
    relation,
    to_inbound,
)
from .render import MAX_LEN, content, relates, render, render_stream, txn
from .settings import MatrixSettings

log = logging.getLogger(__name__)
DEFAULTS = MatrixSettings()
T = TypeVar("T")

UPLOAD_LIMIT = 50 * 1024 * 1024
"""Synapse's default ``max_upload_size``; a homeserver with a lower one answers 413."""
TIMELINE_LIMIT = 100
"""Events per room one sync returns; more while the daemon was down makes the timeline
``limited``, and the gap is read back page by page before the batch is delivered (backfill.py)."""
SYNC_FILTER = {
    "room": {"timeline": {"limit": TIMELINE_LIMIT}, "ephemeral": {"types": []}},
    "presence": {"types": []},
    "account_data": {"types": []},
}
HANDOVER_WINDOW = 24 * 3600.0
"""Seconds back a new leader's first sync answers what came during the handover (see
:meth:`MatrixChannel._in_handover`)."""
RETRY_CAP = 10.0
OWN_EVENTS = 2048


class MatrixChannel(Channel):
    """Matrix Client-Server API over sync long polling (docs/setup/matrix.md)."""

    name = "matrix"
    capabilities = Capabilities(
        max_message_len=MAX_LEN,
        edit_interval=1.5,
        can_edit=True,
        max_upload_bytes=UPLOAD_LIMIT,
        dedupes_sends=True,
        buttons=False,
    )
    can_send_only = True

    def __init__(
        self,
        homeserver: str,
        user_id: str,
        access_token: str,
        *,
        device_id: str = DEFAULTS.device_id,
        sync_timeout: int = DEFAULTS.sync_timeout,
        display_name: str = DEFAULTS.display_name,
        state_dir: str = "",
        sync_grace: float = 15.0,
    ) -> None:
        super().__init__()
        self._token = access_token
        self.user_id = user_id
        self.display_name = display_name
        self._sync_timeout = sync_timeout
        self._sync_grace = sync_grace
        """Seconds past the long poll's own timeout before a silent sync counts as stalled (a
        half-open connection): the request is then abandoned and made again."""
        config = AsyncClientConfig(max_limit_exceeded=0, max_timeouts=0, request_timeout=30.0)
        self._client = AsyncClient(
            homeserver.rstrip("/"), user_id, device_id=device_id or None, config=config
        )
        self._client.access_token = access_token
        path = Path(state_dir) / "matrix-sync.json" if state_dir else None
        self._since = SyncToken(path, homeserver, user_id)
        self._direct: dict[str, bool] = {}
        self._own: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._told_encrypted: set[str] = set()
        self._standby_from: int | None = None
        """When this daemon began as a standby (ms since the epoch), None if it never was one. A
        standby that becomes the leader has no sync token of its own (the leader's lives in the
        leader's data directory), so its first sync is the rooms' recent timeline: what was sent
        from this moment on is the handover's backlog, answered (the shared journal drops what
        the old leader had), not history."""

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        await self._whoami()
        self.report_connected()
        if not self.receive:  # a standby daemon sends only; the leader syncs
            if self._standby_from is None:
                self._standby_from = int(time.time() * 1000)
            await asyncio.Event().wait()
        since = self._since.load()
        delay = 0.0
        while True:
            try:
                body = await self._sync(since)
                await fill_gaps(self._client, self._token, body, since)
            except Rejected as exc:
                if exc.token:
                    await self._whoami()  # raises FatalChannelError when the token is really gone
                if exc.status == 429 or exc.errcode == "M_LIMIT_EXCEEDED":
                    delay = min(float(getattr(exc, "retry_after", None) or 5.0), 120.0)
                else:
                    delay = 1.0 if delay == 0 else min(RETRY_CAP, delay * 1.5)
                self.report_trouble(f"Matrix sync failed: {exc}")
            except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
                delay = 1.0 if delay == 0 else min(RETRY_CAP, delay * 1.5)
                self.report_trouble(f"Matrix sync failed: {type(exc).__name__}")
            else:
                delay = 0.0
                self.report_connected()
                await self._deliver(body, sink, first=since is None)
                since = body["next_batch"]
                self._since.save(since)
            if delay:
                await asyncio.sleep(delay)

    async def close(self) -> None:
        await self._client.close()

    async def disconnect(self) -> None:
        """Nothing to drop: the sync is one HTTP request, ended when ``run`` is cancelled, and
        replies in flight share the client's session, which a restart must not cut."""

    async def _whoami(self) -> None:
        """Check the token. A 401 is asked once more before it is believed (a proxy being
        redeployed can answer 401 for a moment); then :class:`FatalChannelError`."""
        path = Api.whoami(self._token)[1]
        for attempt in range(2):
            try:
                body = await get_json(self._client, path, self._token, wait=30)
            except Rejected as exc:
                if not exc.token:
                    raise ConnectionError(f"Matrix whoami failed: {exc}") from None
                if attempt == 0:
                    self.report_trouble("Matrix answered 401; checking the token again")
                    await asyncio.sleep(1.0)
                    continue
                raise FatalChannelError(
                    f"Matrix refused the access token ({exc.errcode or exc.status}) twice in a row; "
                    "it is revoked or wrong, set a valid one"
                ) from None
            if body.get("user_id") != self.user_id:
                raise FatalChannelError(
                    "the access token belongs to another user than channels.matrix.user_id"
                )
            break
        if not self.display_name:
            try:
                resp = await self._client.get_displayname(self.user_id)
                name = getattr(resp, "displayname", None)
                self.display_name = name if isinstance(name, str) else ""
            except (aiohttp.ClientError, TimeoutError):
                pass
        log.info("matrix: connected as %s", self.user_id)

    async def _sync(self, since: str | None) -> dict[str, Any]:
        timeout_ms = self._sync_timeout * 1000 if since else 0
        path = Api.sync(self._token, since=since, timeout=timeout_ms or None, filter=SYNC_FILTER)[1]
        body = await get_json(self._client, path, self._token, wait=self._sync_timeout + self._sync_grace)
        if not isinstance(body.get("next_batch"), str) or not body["next_batch"]:
            raise ConnectionError("a sync answer without next_batch")
        return body

    # -- inbound ------------------------------------------------------------------------------
    async def _deliver(self, body: dict[str, Any], sink: InboundSink, *, first: bool) -> None:
        """Each timeline event of each joined room, in order, to ``sink``; invites joined. On the
        very first sync (no token yet) the timeline is the rooms' history: not answered, but for
        what was sent since this daemon began as a standby (:meth:`_in_handover`)."""
        rooms = obj(body.get("rooms"))
        invites = obj(rooms.get("invite"))
        for room_id in list(invites)[:50]:
            if malformed.is_id(room_id):
                await self._join(room_id)
        joined = obj(rooms.get("join"))
        skipped = 0
        for room_id, room in joined.items():
            if not malformed.is_id(room_id) or not isinstance(room, dict):
                self.count_malformed(malformed.ENVELOPE)
                log.critical("matrix: skipped a joined room entry that cannot be read")
                continue
            self._note_members(room_id, room)
            timeline = obj(room.get("timeline"))
            events = listed(timeline.get("events"))
            if first:
                recent = [e for e in events if self._in_handover(e)]
                skipped += len(events) - len(recent)
                for event in recent:
                    await self._event(room_id, event, sink)
                continue
            joined_at = next((i for i, e in enumerate(events) if own_join(e, self.user_id)), None)
            if joined_at is not None and not await self._is_direct(room_id):
                skipped += joined_at  # a room just joined comes with its history: not answered
                events = events[joined_at:]
            for event in events:
                await self._event(room_id, event, sink)
        if skipped:
            log.info(
                "matrix: first sync; %d earlier events in joined rooms are history, not answered", skipped
            )

    def _in_handover(self, event: Any) -> bool:
        """Whether a first sync's ``event`` was sent since this daemon began as a standby, and
        within :data:`HANDOVER_WINDOW` (the homeserver's timestamp against this host's clock). The
        window keeps a standby that waited for weeks from answering old events the journal has
        already forgotten (it keeps finished entries ``storage.retention_days``, 7 by default)."""
        ts = event.get("origin_server_ts") if isinstance(event, dict) else None
        if self._standby_from is None or not isinstance(ts, int):
            return False
        return ts >= max(self._standby_from, int((time.time() - HANDOVER_WINDOW) * 1000))

    async def _event(self, room_id: str, event: Any, sink: InboundSink) -> None:
        try:
            etype, event_id, sender, body = check_event(event)
        except (TypeError, ValueError) as exc:
            await self._unreadable(sink, room_id, event, exc)
            return
        if etype == MEMBER:
            self._direct.pop(room_id, None)
        if sender == self.user_id or etype not in HANDLED:
            return
        try:
            direct = await self._is_direct(room_id)
            _, _, replied = relation(body)
            quoted = await self._replied(room_id, replied) if replied else None
            to_me = replied is not None and (replied in self._own or (quoted is not None and quoted.is_self))
            inbound = to_inbound(room_id, event, me=self.user_id, display_name=self.display_name,
                                 is_direct=direct, replies_to_me=to_me)  # fmt: skip
            if inbound is not None and quoted is not None:
                inbound = dataclasses.replace(inbound, extra={**inbound.extra, **replied_extra(quoted)})
        except (TypeError, ValueError, KeyError) as exc:
            await self._unreadable(sink, room_id, event, exc)
            return
        if inbound is None:
            return
        if etype == ENCRYPTED and not direct:
            if room_id in self._told_encrypted:
                return
            self._told_encrypted.add(room_id)
            log.warning("matrix: room %s is end-to-end encrypted; this bot cannot read it", room_id)
            inbound = _addressed(inbound)
        await self.hand_over(sink, inbound, ref=f"event {event_id}")

    async def _unreadable(self, sink: InboundSink, room_id: str, event: Any, exc: Exception) -> None:
        ids = recover_ids(room_id, event)
        direct = bool(self._direct.get(room_id))
        await self.skip_unreadable(sink, exc, is_direct=direct, **ids)

    def _note_members(self, room_id: str, room: dict[str, Any]) -> None:
        """Membership changes make the DM judgement stale; a summary gives it for free."""
        summary = room.get("summary")
        if isinstance(summary, dict):
            joined, invited = summary.get("m.joined_member_count"), summary.get("m.invited_member_count")
            if isinstance(joined, int):
                self._direct[room_id] = joined + (invited if isinstance(invited, int) else 0) <= 2
                return
        state = obj(room.get("state"))
        events = listed(state.get("events"))
        if any(isinstance(e, dict) and e.get("type") == MEMBER for e in events):
            self._direct.pop(room_id, None)

    async def _is_direct(self, room_id: str) -> bool:
        """A room of at most two members (the bot and one person) is a DM, whatever ``m.direct``
        says (only the inviter's client sets that flag, and a DM turned group stays flagged)."""
        known = self._direct.get(room_id)
        if known is not None:
            return known
        path = Api.joined_members(self._token, room_id)[1]
        try:
            body = await get_json(self._client, path, self._token, wait=30)
        except Rejected as exc:
            if exc.token:
                raise send_error(exc) from None
            # Refused (the bot left, a 403): a group then, where only an address is answered; an
            # error here must not stop the batch, or the event would come back forever.
            log.warning("matrix: joined_members of %s refused (%s); treating it as a group", room_id, exc)
            body = {}
        members = body.get("joined")
        self._direct[room_id] = isinstance(members, dict) and len(members) <= 2
        return self._direct[room_id]

    async def _replied(self, room_id: str, event_id: str) -> ContextItem | None:
        """The replied-to event as context (journaled with the message, so a resumed turn sees the
        same): fetched raw, so an event of any shape costs the context and never the message;
        best effort, None when it cannot be had."""
        path = Api.room_get_event(self._token, room_id, event_id)[1]
        try:
            event = await get_json(self._client, path, self._token, wait=15)
        except (Rejected, aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            log.info("matrix: the replied-to event could not be read: %s", type(exc).__name__)
            return None
        sender, content = event.get("sender"), obj(event.get("content"))
        body = content.get("body")
        if not isinstance(sender, str) or not isinstance(body, str):
            return None
        text = REPLY_FALLBACK.sub("", body, count=1) if "m.relates_to" in content else body
        return ContextItem(sender[:200], text[:REPLIED_MAX_CHARS], event_id, is_self=sender == self.user_id,
                           is_bot=content.get("msgtype") == "m.notice", replied_to=True)  # fmt: skip

    async def thread_context(self, inbound: Inbound, limit: int, max_chars: int) -> Sequence[ContextItem]:
        """The message replied to, as read when the event arrived (a thread's history is not
        fetched: ``/relations`` paging is left for later)."""
        item = replied_item(inbound)
        return (item,) if item is not None and limit > 0 else ()

    async def _join(self, room_id: str) -> None:
        """Accept an invite. Anyone may invite the bot; who gets answered is the access policy's
        (a stranger's DM gets the pairing path)."""
        try:
            resp = await self._client.join(room_id)
            checked(resp, self._token)
            log.info("matrix: joined %s", room_id)
        except FatalChannelError:
            raise
        except (ChannelError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("matrix: could not join %s: %s", room_id, type(exc).__name__)

    # -- rendering ------------------------------------------------------------------------------
    def render(self, markdown: str) -> list[Rendered]:
        return render(markdown)

    def render_stream(self, markdown: str) -> Rendered:
        return render_stream(markdown)

    # -- outbound -------------------------------------------------------------------------------
    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        body = dict(part.payload) if part.payload.get("body") else content(part.text or "…")
        body.update(relates(target))
        return await self._send_event(target.chat_id, body, txn(idempotency_key))

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        """An ``m.replace`` event whose ``m.new_content`` is the new text (the ``* `` body is what
        clients without edit support show)."""
        new = dict(part.payload) if part.payload.get("body") else content(part.text or "…")
        new.pop("m.relates_to", None)
        body = {**new, "body": f"* {new['body']}", "m.new_content": new,
                "m.relates_to": {"rel_type": "m.replace", "event_id": message_id}}  # fmt: skip
        body.pop("formatted_body", None)  # the fallback is plain: the event stays small
        body.pop("format", None)
        await self._send_event(target.chat_id, body, f"chital-edit-{uuid.uuid4().hex}")

    async def typing(self, target: ReplyTarget) -> None:
        """Best effort: a missing typing notice must never fail a turn."""
        try:
            await self._client.room_typing(target.chat_id, True, timeout=10_000)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("matrix: typing failed: %s", type(exc).__name__)

    async def react(self, target: ReplyTarget, emoji: str) -> None:
        """An ``m.annotation`` on the user's event; best effort."""
        if not target.reply_to:
            return
        rel = {"m.relates_to": {"rel_type": "m.annotation", "event_id": target.reply_to, "key": emoji}}
        try:
            await self._call(self._client.room_send(target.chat_id, "m.reaction", rel))
        except ChannelError as exc:
            log.debug("matrix: reaction failed: %s", exc)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """Streams the media (authenticated media, ``/_matrix/client/v1/media/download``) and
        stops at ``limit``: a server that announced less than it sends is cut off."""
        check_size(attachment.name, attachment.size, limit, "")
        server, _, media_id = attachment.file_id.removeprefix("mxc://").partition("/")
        if not server or not media_id or "/" in media_id:
            raise PermanentSendError(f"{attachment.name}: not a media uri")
        path, headers = authorised(Api.download(server, media_id)[1], self._token)
        try:
            resp = await self._client.send("GET", path, headers=headers, timeout=120)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientSendError(f"{attachment.name}: download failed ({type(exc).__name__})") from None
        try:
            if resp.status >= 400:
                raise send_error(api.error_of(resp.status, None, self._token))
            data = await read_capped(resp, limit)
        finally:
            resp.release()
        check_size(attachment.name, len(data), limit, "")
        return bytes(data)

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        """Upload to the media repository, then an ``m.image`` or ``m.file`` event pointing at
        it. The upload has no idempotency key (a repeat leaves an unused upload); the event has."""
        check_size(file.name, file.size, UPLOAD_LIMIT, "the homeserver takes at most 50 MB")
        image = file.suffix in (".png", ".jpg", ".jpeg", ".gif", ".webp")
        mime = f"image/{file.suffix[1:].replace('jpg', 'jpeg')}" if image else "application/octet-stream"
        up, _ = await self._call(self._client.upload(io.BytesIO(file.data), content_type=mime,
                                                      filename=file.name, filesize=file.size))  # fmt: skip
        uri = getattr(checked(up, self._token), "content_uri", None)
        if not isinstance(uri, str):
            raise TransientSendError("the upload answered without a content uri")
        info = {"size": file.size, "mimetype": mime}
        kind = "m.image" if image else "m.file"
        body: dict[str, Any] = {"msgtype": kind, "body": caption or file.name, "filename": file.name,
                                "url": uri, "info": info, "m.mentions": {}}  # fmt: skip
        body.update(relates(target))
        return await self._send_event(target.chat_id, body, txn(idempotency_key))

    # -- helpers --------------------------------------------------------------------------------
    async def _send_event(self, room_id: str, body: dict[str, Any], txn: str) -> str:
        resp = await self._call(self._client.room_send(room_id, "m.room.message", body, tx_id=txn))
        event_id = getattr(checked(resp, self._token), "event_id", "")
        if isinstance(event_id, str) and event_id:
            self._own[event_id] = None
            while len(self._own) > OWN_EVENTS:
                self._own.popitem(last=False)
        return str(event_id or "")

    async def _call(self, call: Awaitable[T]) -> T:
        """Await an nio call; a lost connection is transient (the txn id makes a repeat safe)."""
        try:
            result = await call
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientSendError(
                f"Matrix request failed: {type(exc).__name__}", maybe_sent=True
            ) from None
        if isinstance(result, tuple):
            checked(result[0], self._token)
        return checked(result, self._token) if not isinstance(result, tuple) else result


def _addressed(inbound: Inbound) -> Inbound:
    return dataclasses.replace(inbound, addressed=True)


__all__ = ["MatrixChannel"]
