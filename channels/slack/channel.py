"""Slack adapter: slack-bolt's AsyncApp over Socket Mode, slack_sdk's AsyncWebClient for replies.

Durability. The envelope of an event is acknowledged only after the sink has journaled it: the app runs
with ``process_before_response=True``, so bolt runs our listener to completion and acks afterwards; a
listener that raises makes bolt answer 500, and its Socket Mode adapter then sends no ack at all, so
Slack redelivers the event (``retry_attempt`` > 0). Redeliveries and the double delivery of a mention
(``message`` + ``app_mention`` with the same ``ts``) reach the sink with the same :attr:`Inbound.key`
(the message ``ts``); the journal makes them no-ops.

Malformed input. Every Socket Mode envelope is acknowledged unless our own listener asked for
redelivery (the sink failed): one bolt cannot route or parse (a null payload, a number for the user
id, a slash command, a shortcut), a post the adapter cannot read, a press it cannot read. Each is
counted, skipped through :meth:`Channel.skip_unreadable` or refused to the presser, and acked; Slack
would otherwise retry it, and after enough failures turn event delivery off for the app. The
routing lives in :mod:`channels.slack.envelopes`, parsing in :mod:`channels.slack.inbound`,
formatting in :mod:`channels.slack.render`, and the Web API's reads and failures (thread history, files,
error mapping) in :mod:`channels.slack.webapi`.

Authorization. We call ``auth.test`` ourselves before connecting (a revoked token becomes a
:class:`FatalChannelError` at once) and hand bolt the result through its ``authorize`` hook. Bolt's
default single-team authorization would call ``auth.test`` lazily on the first event and, should that
call fail, *ack the event* with an error text: a lost message.

Connection. The Socket Mode client reconnects by itself (close frame or ``disconnect``: at once; TCP
abort: ~``ping_interval``; half-open: ~1.5-2 × ``ping_interval``). ``run`` polls its public
``is_connected()`` to report the connection up or in trouble, and raises after a long outage so the
supervisor restarts the channel (that restart re-checks both tokens).

Limits. Slack accepts up to 40,000 characters but advises under 4,000 and truncates long ``text``
in places: parts are cut at 3,900. ``chat.update`` is Tier 3 (~50/min per workspace) and
``chat.postMessage`` about one per second per channel: edits every 1.2 s, sends 1 s apart.

Proxies. slack_sdk reads ``HTTPS_PROXY``/``HTTP_PROXY`` from the environment for both the Web API and
the websocket and ignores ``NO_PROXY``; clear them when ``api_base_url`` points at a local server.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aiohttp
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from channels import malformed
from channels.base import (
    Attachment,
    Button,
    Capabilities,
    Channel,
    ChannelError,
    ContextItem,
    Inbound,
    InboundSink,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
)
from channels.limits import check_size

from . import commands, envelopes, render, webapi
from .inbound import recover_ids
from .inbound import to_action as slack_action
from .inbound import to_inbound as event_to_inbound
from .settings import SlackSettings
from .webapi import REPLY_EVENT, map_api_error

log = logging.getLogger(__name__)

T = TypeVar("T")

# Reactions are named on Slack; the gateway may speak in Unicode.
EMOJI_NAMES = {
    "👀": "eyes",
    "👍": "+1",
    "👎": "-1",
    "✅": "white_check_mark",
    "❌": "x",
    "⏳": "hourglass_flowing_sand",
    "🤔": "thinking_face",
    "🔥": "fire",
    "🎉": "tada",
    "⚠️": "warning",
    "⚠": "warning",
    "🛑": "octagonal_sign",
    "❤️": "heart",
    "🙏": "pray",
    "💬": "speech_balloon",
    "🔄": "arrows_counterclockwise",
    "⏹️": "black_square_for_stop",
}
WORKING_REACTION = "eyes"
ACTION_ID = envelopes.ACTION_ID
SECTION_LEN = 3000
"""Characters a Block Kit section's text may have."""
DEFAULTS = SlackSettings()
__all__ = ["SlackChannel", "map_api_error"]


class SlackChannel(Channel):
    """One Slack workspace through a bot token (xoxb-) and an app-level token (xapp-)."""

    name = "slack"
    capabilities = Capabilities(
        max_message_len=render.MAX_LEN,
        edit_interval=1.2,
        can_edit=True,
        min_send_interval=1.0,
        send_burst=3,
        max_upload_bytes=100 * 1024 * 1024,  # files_upload_v2 holds the file in memory
        picked_up_reaction="👀",
        done_reaction="✅",
        finds_orphans=True,  # reply metadata carries the key; see recover()
        buttons=True,  # Block Kit buttons; presses arrive as block_actions over the socket
    )

    def __init__(
        self,
        bot_token: str,
        app_token: str,
        *,
        api_base_url: str = DEFAULTS.api_base_url,
        ping_interval: float = DEFAULTS.ping_interval,
    ) -> None:
        super().__init__()
        self._bot_token = bot_token
        self._app_token = app_token
        self._base_url = api_base_url if api_base_url.endswith("/") else api_base_url + "/"
        self._ping_interval = ping_interval
        self._client = AsyncWebClient(token=bot_token, base_url=self._base_url)
        self._session: aiohttp.ClientSession | None = None
        self._handler: AsyncSocketModeHandler | None = None
        self._auth: AuthorizeResult | None = None
        self._sink: InboundSink | None = None
        self._sink_lock = asyncio.Lock()
        self._working: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self.refusals = malformed.Refusals()
        self.bot_user_id: str | None = None
        self.give_up_after = max(60.0, 12 * ping_interval)
        """Seconds without a connection after which ``run`` fails (the supervisor restarts it)."""

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        self._sink = sink
        self._http()
        auth = await self._call(self._client.auth_test(), "auth.test")
        self._auth = AuthorizeResult.from_auth_test_response(
            bot_token=self._bot_token, auth_test_response=auth
        )
        self.bot_user_id = auth.get("user_id")

        # Bolt injects listener arguments by parameter name and counts ``self`` as one: closures.
        async def authorize(enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
            return self._authorized()

        async def on_event(body: dict[str, Any], event: dict[str, Any]) -> None:
            await self._on_event(event, f"event {body.get('event_id', '?')}")

        app = AsyncApp(
            name="chital-slack",
            # No token on the app's client: with one, bolt would authorize by its own lazy auth.test.
            client=AsyncWebClient(base_url=self._base_url, session=self._session),
            authorize=authorize,
            process_before_response=True,  # ack only after our listener (the sink) returned
            request_verification_enabled=False,  # Socket Mode requests carry no signature
            logger=logging.getLogger("slack_bolt.chital"),  # under the library level set in gateway/logs
        )
        app.event(re.compile(".*"))(on_event)  # one listener: every event is acked or retried

        async def on_press(ack: Any, body: dict[str, Any]) -> None:
            await self._on_press(body)  # journaled before the ack, like an event
            await ack()

        app.action(re.compile(f"^{ACTION_ID}"))(on_press)
        handler = AsyncSocketModeHandler(
            app, self._app_token, web_client=self._client, ping_interval=self._ping_interval
        )
        self._handler = handler
        sm = handler.client

        async def on_frame(client: AsyncBaseSocketModeClient, message: dict[str, Any], raw: str) -> None:
            await envelopes.handle(self, app, client, message, raw)

        # Every frame goes through channels.slack.envelopes, which hands bolt what it can route.
        sm.message_listeners[:] = [on_frame]  # type: ignore[list-item]  # the SDK's alias is narrower than what it calls
        sm.socket_mode_request_listeners[:] = []
        try:
            # Fetch the first URL ourselves: the SDK's connect() retries every error forever,
            # which would hide a revoked app token.
            sm.wss_uri = await self._call(sm.issue_new_wss_url(), "apps.connections.open")
            try:  # connect() also retries forever when the socket URL does not answer
                async with asyncio.timeout(self.give_up_after):
                    await handler.connect_async()
            except TimeoutError:
                raise ChannelError("slack socket mode did not connect") from None
            self.report_connected()
            await self._watch()
        finally:
            self._handler = None
            try:
                await asyncio.shield(handler.close_async())
            except Exception as exc:  # closing a broken socket may fail; nothing to save
                log.debug("slack socket close: %s", type(exc).__name__)

    async def disconnect(self) -> None:
        """Only the socket: Web API calls in flight keep their HTTP session across a restart."""
        if self._handler is not None:
            handler, self._handler = self._handler, None
            await handler.close_async()

    async def close(self) -> None:
        await self.disconnect()
        if self._session is not None:
            session, self._session = self._session, None
            self._client.session = None
            await session.close()

    def _http(self) -> aiohttp.ClientSession:
        """One pooled HTTP session for all Web API calls (the SDK opens one per call otherwise)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
            self._client.session = self._session
        return self._session

    async def _watch(self) -> None:
        """Report the socket's health; give up (→ supervisor restart) after a long outage."""
        assert self._handler is not None
        sm = self._handler.client
        step = min(1.0, self._ping_interval / 2)
        down_since: float | None = None
        while True:
            await asyncio.sleep(step)
            if await sm.is_connected():
                down_since = None
                self.report_connected()
                continue
            now = time.monotonic()
            down_since = down_since or now
            self.report_trouble("socket mode connection lost")
            if now - down_since > self.give_up_after:
                raise ChannelError(f"slack socket mode not reconnected for {self.give_up_after:.0f}s")

    def _authorized(self) -> AuthorizeResult:
        if self._auth is None:  # cannot happen after run() started; never ack without it
            raise RuntimeError("slack channel not authorized yet")
        return self._auth

    # -- inbound --------------------------------------------------------------------------------
    async def _on_event(self, event: dict[str, Any], ref: str) -> None:
        """Bolt listener. Returning acks the envelope; raising leaves it unacked (Slack retries),
        which only a sink failure may do: an event we cannot read is skipped, not retried."""
        state = envelopes.reached()
        if self._sink is None:
            return
        async with self._sink_lock:  # journal in arrival order
            try:
                inbound = self.to_inbound(event)
            except Exception as exc:
                ids = recover_ids(ref, event, self.bot_user_id)
                await self._refusing(state, self.skip_unreadable(self._sink, exc, **ids))
                return
            if inbound is not None:
                await self._refusing(state, self.hand_over(self._sink, inbound, ref=ref))

    async def on_slash(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A slash command, journaled as the typed command it stands for (channels/slack/commands.py);
        returns the ack's payload: the invocation shown in the channel, or a refusal only the
        sender sees (Slack does not redeliver a slash command, so every outcome is an ack)."""
        refusal = {"text": malformed.COMMAND_UNKNOWN, "response_type": "ephemeral"}
        try:
            inbound = commands.to_inbound(payload, self._auth.team_id if self._auth else None)
        except (ValueError, TypeError) as exc:
            self.count_malformed(malformed.COMMAND)
            log.warning("slack: a slash command could not be read: %s", exc)
            return refusal
        if self._sink is None:
            return {**refusal, "text": malformed.COMMAND_LATER}
        async with self._sink_lock:
            try:
                await self.hand_over(self._sink, inbound, ref=f"slash command {inbound.message_id}")
            except ChannelError:  # shutting down: not journaled, and Slack will not send it again
                return {**refusal, "text": malformed.COMMAND_LATER}
        return {"response_type": "in_channel"}

    async def skip_envelope(self, kind: str, ids: Callable[[], dict[str, Any]], error: Exception) -> None:
        """An envelope with no readable event (channels/slack/envelopes.py): skipped in arrival
        order like an unreadable event, only counted while nothing receives."""
        sink = self._sink
        if sink is None:
            self.count_malformed(kind)
            return
        async with self._sink_lock:
            await self.skip_unreadable(sink, error, kind=kind, **ids())

    @staticmethod
    async def _refusing(state: envelopes.Dispatch, call: Awaitable[None]) -> None:
        """``call``; when it raises, the envelope is left unacknowledged for Slack to redeliver."""
        try:
            await call
        except BaseException:
            state.refused = True
            raise

    async def _on_press(self, body: dict[str, Any]) -> None:
        """A press of one of our buttons: to the gateway; a refusal is told to the presser alone
        (chat.postEphemeral). The decision itself shows as an edit of the buttons message."""
        state = envelopes.reached()
        action = slack_action(body)
        if action is None:
            self.count_malformed(malformed.ACTION)
            log.warning("slack: a block action without user, channel, message or value; refused")
            await envelopes.refuse(self, body, malformed.ACTION_UNREADABLE)
            return
        try:
            answer = await self.hand_action(action)
        except BaseException:
            state.refused = True  # the gateway is shutting down: Slack delivers the press again
            raise
        if answer.refused and answer.text:
            await self.ephemeral(action.chat_id, action.sender_id, answer.text, action.thread_id)

    async def ephemeral(self, channel: str, user: str, text: str, thread_ts: str | None) -> None:
        """A note only ``user`` sees (chat.postEphemeral)."""
        try:
            await self._call(
                self._client.chat_postEphemeral(channel=channel, user=user, text=text, thread_ts=thread_ts),
                "chat.postEphemeral",
            )
        except ChannelError as exc:  # the press was handled; only the note is lost
            log.warning("slack: could not tell the presser: %s", exc)

    def to_inbound(self, event: dict[str, Any]) -> Inbound | None:
        """An ``app_mention`` or ``message`` event as an :class:`Inbound`, or None to drop it
        (see :func:`channels.slack.inbound.to_inbound`; raises for a malformed post)."""
        return event_to_inbound(event, self.bot_user_id)

    # -- rendering ------------------------------------------------------------------------------
    def render(self, markdown: str) -> Sequence[Rendered]:
        return render.render(markdown)

    def render_stream(self, markdown: str) -> Rendered:
        return render.render_stream(markdown)

    # -- outbound -------------------------------------------------------------------------------
    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        # Slack has no idempotency key for posts; the key rides along as message metadata so a
        # restarted daemon can find a message whose ts a crash kept out of the outbox (recover).
        resp = await self._call(
            self._client.chat_postMessage(
                channel=target.chat_id,
                text=part.text,
                thread_ts=_thread_ts(target),
                mrkdwn=True,
                metadata={"event_type": REPLY_EVENT, "event_payload": {"key": idempotency_key}},
            ),
            "chat.postMessage",
        )
        return str(resp["ts"])

    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        """A section with the text and an actions block (Block Kit); ``text`` stays as the
        notification fallback, and the key rides along as metadata like every reply's."""
        elements = [
            {"type": "button", "text": {"type": "plain_text", "text": b.label[:75], "emoji": True},
             "action_id": f"{ACTION_ID}{i}", "value": b.value,
             **({"style": b.style} if b.style in ("primary", "danger") else {})}
            for i, b in enumerate(buttons)
        ]  # fmt: skip
        resp = await self._call(
            self._client.chat_postMessage(
                channel=target.chat_id,
                text=part.text,
                blocks=[_section(part.text), {"type": "actions", "elements": elements}],
                thread_ts=_thread_ts(target),
                metadata={"event_type": REPLY_EVENT, "event_payload": {"key": idempotency_key}},
            ),
            "chat.postMessage",
        )
        return str(resp["ts"])

    async def close_buttons(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        """chat.update keeps a message's blocks unless given new ones: the section alone."""
        await self._call(
            self._client.chat_update(
                channel=target.chat_id, ts=message_id, text=part.text, blocks=[_section(part.text)]
            ),
            "chat.update",
        )

    async def recover(self, target: ReplyTarget, idempotency_key: str) -> str | None:
        """The bot's recent message carrying ``idempotency_key`` in its metadata, if any: read
        from the thread (conversations.replies) or the channel (conversations.history)."""
        thread_ts = _thread_ts(target)
        self._http()  # the calls below use the pooled session
        return await webapi.find_reply(
            self._client, target.chat_id, thread_ts, _user_ts(target) or thread_ts, idempotency_key
        )

    async def thread_context(self, inbound: Inbound, limit: int, max_chars: int) -> Sequence[ContextItem]:
        """The thread's parent and its newest replies before this message (conversations.replies,
        oldest first, read for at most :data:`webapi.CONTEXT_PAGES` pages: Slack pages from the
        parent on, and apps outside the Marketplace get one call a minute). Nothing for a post
        that starts its thread, or a DM outside threads."""
        bot_id = self._auth.bot_id if self._auth is not None else None
        self._http()
        return await webapi.thread_context(self._client, inbound, limit, self.bot_user_id, bot_id)

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        await self._call(
            self._client.chat_update(channel=target.chat_id, ts=message_id, text=part.text), "chat.update"
        )

    async def typing(self, target: ReplyTarget) -> None:
        """Slack has no typing indicator for bots: the user's message gets :eyes: once instead."""
        ts = _user_ts(target)
        if not ts:
            return
        key = (target.chat_id, ts)
        if key in self._working:
            return
        await self.react(target, WORKING_REACTION)
        self._working[key] = None
        while len(self._working) > 1000:
            self._working.popitem(last=False)

    async def react(self, target: ReplyTarget, emoji: str) -> None:
        ts = _user_ts(target)
        if not ts:
            return
        name = EMOJI_NAMES.get(emoji, emoji).strip(":")
        try:
            await self._call(
                self._client.reactions_add(channel=target.chat_id, timestamp=ts, name=name),
                "reactions.add",
            )
        except PermanentSendError as exc:
            if "already_reacted" not in str(exc):
                raise

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        check_size(attachment.name, attachment.size, limit)
        return await webapi.download(
            self._http(), attachment.file_id, token=self._bot_token, api_base_url=self._base_url,
            proxy=self._client.proxy, name=attachment.name, limit=limit,
        )  # fmt: skip

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        check_size(file.name, file.size, self.capabilities.max_upload_bytes)
        resp = await self._call(
            self._client.files_upload_v2(
                channel=target.chat_id,
                thread_ts=_thread_ts(target),
                file=file.data,  # bytes, never a path: slack_sdk would open a str as one
                filename=file.name,
                title=file.name,
                initial_comment=caption or None,
            ),
            "files.upload",
        )
        files = resp.get("files") or [{}]
        return str(files[0].get("id", ""))

    # -- errors ---------------------------------------------------------------------------------
    async def _call(self, call: Awaitable[T], what: str) -> T:
        """Await one SDK call on the pooled session, its failures mapped (:func:`webapi.call`)."""
        self._http()  # the call has not started yet: it will use the pooled session
        return await webapi.call(call, what)


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:SECTION_LEN] or "…"}}


def _user_ts(target: ReplyTarget) -> str | None:
    """The ts of the user's post being answered; None for a slash command (no post exists)."""
    return None if target.extra.get(commands.SLASH) else target.reply_to


def _thread_ts(target: ReplyTarget) -> str | None:
    return target.thread_id or target.extra.get("thread_ts") or None
