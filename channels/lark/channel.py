"""The Feishu/Lark adapter: lark-oapi's long connection in, its im.v1 API out (see package docstring).

The requests it sends are built in :mod:`channels.lark.im`; this module runs them and maps failures."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import lark_oapi as lark
import requests
from lark_oapi.api.im.v1 import P2ImMessageReceiveV1
from lark_oapi.core.enum import AccessTokenType, HttpMethod, LogLevel
from lark_oapi.core.exception import ObtainAccessTokenException
from lark_oapi.core.json import JSON
from lark_oapi.core.model import BaseRequest
from lark_oapi.event.callback.model.p2_card_action_trigger import (
    P2CardActionTrigger,
    P2CardActionTriggerResponse,
)

from channels import malformed
from channels.base import (
    ActionAnswer,
    Attachment,
    Button,
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
    RetryAfter,
    TransientSendError,
)
from channels.limits import check_size, header, retry_after

from . import im, menu, render
from ._ws import WsRunner, refusal_toast
from .inbound import context_item, recover_ids, to_action, to_inbound
from .settings import LarkSettings

log = logging.getLogger(__name__)
# lark-oapi attaches a stdout handler of its own at import: its lines would bypass the daemon's
# handler (gateway/ops/logs.py) and print twice.
logging.getLogger("Lark").handlers.clear()
R = TypeVar("R")
DEFAULTS = LarkSettings()
CARD_ANSWER_WITHIN = 2.5
"""Seconds a card press waits for the gateway before its toast is sent (Lark allows 3)."""

DOMAINS = {"feishu": lark.FEISHU_DOMAIN, "lark": lark.LARK_DOMAIN}
# Token endpoint answers for a wrong app id / secret: nothing but a human can fix those.
_BAD_CREDENTIAL_CODES = {10003, 10012, 10014, 1000040344}
_RATE_LIMIT_CODES = {99991400, 230020}  # app frequency limit; per-chat/message frequency limit
_WITHDRAWN_CODES = {230011}  # replying to a message the user withdrew: post into the chat instead


class LarkConnectionError(ChannelError):
    """The long connection is dead, half-open or could not start; the supervisor restarts us."""


class LarkChannel(Channel):
    name = "lark"
    capabilities = Capabilities(
        max_message_len=render.MAX_PART_CHARS,
        # A card accepts 5 updates/s, the app 50/s and 1000/min: 1 s per streamed card leaves room
        # for ~15 conversations streaming at once.
        edit_interval=1.0,
        # 5 messages/s into one chat, a budget the group's bots share: stay well inside it.
        min_send_interval=0.25,
        send_burst=3,
        max_upload_bytes=30 * 1024 * 1024,
        dedupes_sends=True,  # the uuid of a create/reply is deduplicated for about an hour
        buttons=True,  # card buttons; presses arrive as card.action.trigger on the long connection
    )

    def __init__(
        self,
        app_id: str,
        app_secret: str,
        *,
        domain: str = DEFAULTS.domain,
        liveness_timeout: float = DEFAULTS.liveness_timeout,
    ) -> None:
        super().__init__()
        self.app_id = app_id
        self._app_secret = app_secret
        self.domain = DOMAINS.get(domain, domain).rstrip("/")
        self.liveness_timeout = liveness_timeout
        self.bot_open_id: str | None = None
        self.dm_chats = menu.DmChats()  # whom a menu event's answer goes to (channels/lark/menu.py)
        self._api = (
            lark.Client.builder()
            .app_id(app_id)
            .app_secret(app_secret)
            .domain(self.domain)
            .timeout(30)
            .log_level(LogLevel.WARNING)
            .build()
        )
        # Blocking SDK calls (requests, and the token fetch even in its a* methods) run here.
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sink: InboundSink | None = None
        self._runner: WsRunner | None = None
        self._wake: asyncio.Event | None = None

    def __repr__(self) -> str:  # never the secret
        return f"LarkChannel(app_id={self.app_id!r}, domain={self.domain!r})"

    # -- lifecycle ----------------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        self._loop, self._sink = asyncio.get_running_loop(), sink
        self._wake = asyncio.Event()
        self.bot_open_id = await self._fetch_bot_open_id()
        runner = WsRunner(
            self.app_id,
            self._app_secret,
            self.domain,
            self._on_receive,
            on_unreadable=self._on_unreadable,
            on_card_action=self._on_card_action,
            ping_every=max(0.5, self.liveness_timeout / 3),
            notify=lambda kind: self._from_sdk_thread(runner, kind),
            on_malformed=self.count_malformed,
            on_menu=self._on_menu,
        )
        self._runner = runner
        runner.start()
        check_every = min(1.0, self.liveness_timeout / 4)
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(check_every):
                        await self._wake.wait()
                self._wake.clear()
                problem = runner.problem(self.liveness_timeout)
                if problem:
                    log.warning("lark channel restarting: %s", problem)
                    raise LarkConnectionError(problem)
        finally:
            await asyncio.to_thread(runner.stop, 5.0)

    async def close(self) -> None:
        if self._runner is not None:
            await asyncio.to_thread(self._runner.stop, 5.0)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _from_sdk_thread(self, runner: WsRunner, kind: str) -> None:
        """Runner news from the SDK thread, handed to the daemon's loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._runner_news, runner, kind)

    def _runner_news(self, runner: WsRunner, kind: str) -> None:
        if runner is not self._runner:  # a stopped client winding down: not our state any more
            return
        if kind == "frame" and runner.connected:
            self.report_connected()
        elif kind == "reconnecting":
            self.report_trouble("connection lost; lark-oapi reconnecting")
        if kind != "frame" and self._wake is not None:
            self._wake.set()

    async def _fetch_bot_open_id(self) -> str:
        """The bot's open_id (group messages address it by mention). Also proves the credentials."""
        req = (
            BaseRequest.builder()
            .http_method(HttpMethod.GET)
            .uri("/open-apis/bot/v3/info")
            .token_types({AccessTokenType.TENANT})
            .build()
        )
        try:
            resp = await self._blocking(self._api.request, req)
        except ObtainAccessTokenException as e:
            if e.code in _BAD_CREDENTIAL_CODES:
                raise FatalChannelError(
                    f"Lark rejected the app credentials: code {e.code}: {e.msg}"
                ) from None
            raise LarkConnectionError(f"Lark token request failed: code {e.code}: {e.msg}") from None
        except (requests.RequestException, OSError, ValueError) as e:
            raise LarkConnectionError(f"Lark bot info request failed: {type(e).__name__}") from None
        try:
            body = json.loads(resp.raw.content) if resp.raw is not None else {}
        except ValueError:
            body = {}
        open_id = (body.get("bot") or (body.get("data") or {}).get("bot") or {}).get("open_id")
        if resp.code != 0 or not open_id:
            status = resp.raw.status_code if resp.raw is not None else 0
            if status >= 500 or resp.code in _RATE_LIMIT_CODES:
                raise LarkConnectionError(f"Lark bot info failed: HTTP {status}, code {resp.code}")
            raise FatalChannelError(
                f"Lark bot info failed (is the bot capability enabled?): code {resp.code}: {resp.msg}"
            )
        return str(open_id)

    # -- inbound (runs on the SDK's thread) -----------------------------------------------------
    def _on_receive(self, runner: WsRunner, data: P2ImMessageReceiveV1) -> None:
        """Deliver one message and block until the sink has journaled it, so that the SDK acks the
        frame only afterwards. Raising makes the SDK ack 500 and the platform redeliver: only for a
        client that is stopping or a sink that failed. A message we cannot read is skipped (and
        acked) instead, or it would come back again and again."""
        sink = self._live_sink(runner)
        try:
            inbound = to_inbound(data, self.bot_open_id)
        except Exception as exc:
            try:
                ids = recover_ids(JSON.marshal(data), self.bot_open_id)
            except Exception:
                ids = {"ref": "event ?"}
            self._block_on(runner, self.skip_unreadable(sink, exc, **ids))
            return
        if inbound is not None:
            if inbound.is_direct:
                self.dm_chats.learn(inbound.sender_id, inbound.chat_id)
            self._block_on(runner, self.hand_over(sink, inbound, ref=f"message {inbound.message_id}"))

    def _on_menu(self, runner: WsRunner, data: Any) -> None:
        """A pick from the bot's custom menu (SDK thread): journaled as the command it names, then
        acked; one that cannot be read is counted and its sender, when named, told."""
        sink = self._live_sink(runner)
        try:
            inbound = menu.to_inbound(data, self.dm_chats, self.app_id)
        except (ValueError, TypeError, AttributeError) as exc:
            ids = menu.recover_ids(data, self.dm_chats)
            self._block_on(runner, self.skip_unreadable(sink, exc, kind=malformed.COMMAND, **ids))
            return
        self._block_on(runner, self.hand_over(sink, inbound, ref=f"menu event {inbound.message_id}"))

    def _on_unreadable(self, runner: WsRunner, payload: bytes, exc: Exception) -> None:
        """An event frame the SDK itself could not parse (not JSON, no header): skip and ack it."""
        sink = self._live_sink(runner)
        self._block_on(runner, self.skip_unreadable(sink, exc, **recover_ids(payload, self.bot_open_id)))

    def _on_card_action(
        self, runner: WsRunner, data: P2CardActionTrigger
    ) -> P2CardActionTriggerResponse | None:
        """A press of one of our card buttons (SDK thread): to the gateway on the daemon's loop,
        and its answer back as the callback's toast. Lark wants the answer within 3 s; if the
        gateway takes longer the press still counts and the toast only says so."""
        action = to_action(data)
        if action is None:  # not one of our buttons, or its payload cannot be read
            self._live_sink(runner)
            self.count_malformed(malformed.ACTION)
            log.warning("lark: a card press without its value, presser, message or chat; refused")
            return refusal_toast(malformed.ACTION_UNREADABLE)
        self._live_sink(runner)  # raises while stopping: answered 500, pressed again later
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self.hand_action(action), self._loop)
        try:
            answer = future.result(timeout=CARD_ANSWER_WITHIN)
        except concurrent.futures.TimeoutError:
            answer = ActionAnswer("Received; the card shows the decision in a moment.")
        kind = "error" if answer.refused else "success"
        return P2CardActionTriggerResponse({"toast": {"type": kind, "content": answer.text or "OK"}})

    def _live_sink(self, runner: WsRunner) -> InboundSink:
        if self._loop is None or self._sink is None or runner is not self._runner or runner.stopping.is_set():
            raise LarkConnectionError("this Lark client is stopping")
        return self._sink

    def _block_on(self, runner: WsRunner, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the daemon's loop and wait for it on this SDK thread; its exception,
        if any, becomes the SDK's 500 ack."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        runner.busy += 1
        try:
            while not concurrent.futures.wait([future], timeout=0.25).done:
                if runner.stopping.is_set():
                    future.cancel()
                    raise LarkConnectionError("stopped before the message was journaled")
            future.result()
        finally:
            runner.busy -= 1
            runner.last_frame = time.monotonic()

    # -- rendering -----------------------------------------------------------------------------
    def render(self, markdown: str) -> Sequence[Rendered]:
        return render.render(markdown)

    def render_stream(self, markdown: str) -> Rendered:
        return render.render_stream(markdown)

    # -- outbound ------------------------------------------------------------------------------
    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        msg_type, content = im.payload(part)
        # The platform de-duplicates creates and replies on uuid (<= 50 chars) for about an hour.
        uuid = hashlib.sha256(idempotency_key.encode()).hexdigest()[:40]
        if target.reply_to and not target.extra.get(menu.MENU):
            try:
                return await self._reply(target, msg_type, content, uuid)
            except _LarkApiError as e:
                if e.code not in _WITHDRAWN_CODES:
                    raise e.mapped() from None
        try:
            return await self._create(target.chat_id, msg_type, content, uuid)
        except _LarkApiError as e:
            raise e.mapped() from None

    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        """A card with the text and one row of callback buttons (JSON 2.0 ``behaviors``); the
        decision replaces the whole card (a PATCH without the buttons: the default close)."""
        payload = im.buttons_part(part, buttons)
        return await self.send(target, payload, idempotency_key=idempotency_key)

    async def _reply(self, target: ReplyTarget, msg_type: str, content: str, uuid: str | None) -> str:
        req = im.reply_request(target.reply_to, msg_type, content, uuid, in_thread=bool(target.thread_id))
        resp = await self._call("reply", self._api.im.v1.message.reply, req, raw=True)
        return str(resp.data.message_id)

    async def _create(self, chat_id: str, msg_type: str, content: str, uuid: str | None) -> str:
        req = im.create_request(chat_id, msg_type, content, uuid)
        resp = await self._call("send", self._api.im.v1.message.create, req)
        return str(resp.data.message_id)

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        msg_type, content = im.payload(part)
        if msg_type != "interactive":
            raise PermanentSendError("only cards can be edited on Lark by this adapter")
        await self._call("edit", self._api.im.v1.message.patch, im.patch_request(message_id, content))

    async def react(self, target: ReplyTarget, emoji: str) -> None:
        if not target.reply_to or target.extra.get(menu.MENU):
            return
        req = im.reaction_request(target.reply_to, emoji)
        try:
            await self._call("react", self._api.im.v1.message_reaction.create, req)
        except (ChannelError, _LarkApiError) as e:  # a missing reaction is cosmetic
            log.debug("lark reaction failed: %s", e)

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        check_size(attachment.name, attachment.size, limit)
        req = im.resource_request(attachment.file_id)
        # The SDK reads the whole body; Lark caps a message's file at 100 MB.
        resp = await self._call("download", self._api.im.v1.message_resource.get, req)
        data = resp.file.read() if resp.file is not None else b""
        check_size(attachment.name, len(data), limit)
        return data

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        size = file.size
        check_size(file.name, size, self.capabilities.max_upload_bytes, "Lark's upload limit is 30 MB")
        # The same file of the same reply again within the platform's dedupe hour: one message.
        key = idempotency_key
        data = io.BytesIO(file.data)
        if caption:
            await self.send(target, render.rendered_card(caption), idempotency_key=f"caption:{key}")
        kind, req = im.upload_request(file, data)
        upload = self._api.im.v1.image.create if kind == "image" else self._api.im.v1.file.create
        resp = await self._call("upload", upload, req)
        part = im.uploaded_part(file, kind, resp)
        return await self.send(target, part, idempotency_key=f"file:{key}")

    # -- thread context --------------------------------------------------------------------------
    async def thread_context(self, inbound: Inbound, limit: int, max_chars: int) -> Sequence[ContextItem]:
        """In a thread: its messages before this one (GET im/v1/messages, container_id_type
        thread, newest first); for a reply: the message replied to (GET im/v1/messages/:id).
        Both need the ``im:message`` read scopes (docs/setup/lark.md)."""
        if limit <= 0:
            return ()
        parent_id = inbound.extra.get("parent_id")
        items: list[ContextItem] = []
        if inbound.thread_id:
            items = await self._thread_messages(inbound, limit)
        if isinstance(parent_id, str) and parent_id and all(i.message_id != parent_id for i in items):
            resp = await self._call("context", self._api.im.v1.message.get, im.message_request(parent_id))
            found = (resp.data.items or [None])[0] if resp.data is not None else None
            parent = context_item(found, self.app_id, self.bot_open_id or "")
            if parent is not None:
                items = [parent, *items[len(items) - limit + 1 :]] if limit > 1 else [parent]
        return [dataclasses.replace(i, replied_to=i.message_id == parent_id) for i in items]

    async def _thread_messages(self, inbound: Inbound, limit: int) -> list[ContextItem]:
        before = _int(inbound.extra.get("create_time"))
        req = im.thread_request(str(inbound.thread_id), limit)
        resp = await self._call("context", self._api.im.v1.message.list, req)
        items: list[ContextItem] = []
        for message in (resp.data.items if resp.data is not None else None) or []:
            if message.message_id == inbound.message_id or (before and _int(message.create_time) > before):
                continue  # the message itself, or one posted after it
            item = context_item(message, self.app_id, self.bot_open_id or "")
            if item is not None:
                items.append(item)
        return items[:limit][::-1]  # oldest first

    # -- plumbing ------------------------------------------------------------------------------
    async def _blocking(self, fn: Callable[..., R], *args: Any) -> R:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="lark-api")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _call(self, what: str, fn: Callable[[Any], Any], req: Any, *, raw: bool = False) -> Any:
        """Run one SDK call; map failures to the contract's errors (or :class:`_LarkApiError` when
        ``raw``, for callers that look at the code first)."""
        try:
            resp = await self._blocking(fn, req)
        except ObtainAccessTokenException as e:
            if e.code in _BAD_CREDENTIAL_CODES:
                raise FatalChannelError(f"Lark rejected the app credentials: code {e.code}") from None
            raise TransientSendError(f"Lark {what}: token request failed: code {e.code}") from None
        except (requests.RequestException, OSError) as e:
            raise TransientSendError(f"Lark {what}: {type(e).__name__}") from None
        except ValueError:  # a non-JSON answer (proxy error page, 502 from a gateway)
            raise TransientSendError(f"Lark {what}: unreadable answer") from None
        if resp.code == 0:
            return resp
        status = resp.raw.status_code if resp.raw is not None else 0
        headers = resp.raw.headers if resp.raw is not None and resp.raw.headers else {}
        error = _LarkApiError(what, status, int(resp.code or 0), resp.msg or "", headers)
        if raw:
            raise error
        raise error.mapped()


class _LarkApiError(Exception):
    def __init__(self, what: str, status: int, code: int, msg: str, headers: dict[str, str]) -> None:
        super().__init__(f"Lark {what} failed: HTTP {status}, code {code}: {msg}")
        self.status, self.code, self.headers = status, code, headers

    def mapped(self) -> ChannelError:
        if self.status == 429 or self.code in _RATE_LIMIT_CODES:
            seconds = retry_after(header(self.headers, "x-ogw-ratelimit-reset"), minimum=0.5)
            return RetryAfter(seconds, str(self))
        if self.status >= 500 or self.code in (1, 99991663, 99991661):  # busy; token expired early
            return TransientSendError(str(self))
        return PermanentSendError(str(self))


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
