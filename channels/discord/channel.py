"""Discord adapter: discord.py's gateway client in, REST replies out.

Conversation keys: ``chat_id`` is the channel the user wrote in, except in a thread, where ``chat_id`` is
the thread's parent channel and ``thread_id`` the thread (a Discord thread is a channel of its own, and
its own conversation). Replies go to ``thread_id or chat_id``. This matches Slack (channel + thread ts)
and Telegram (chat + topic), so per-chat access policy set on a channel covers its threads.

Durability: Discord has no acknowledgement; a RESUME replays what a dropped connection missed (same
message ids, so the gateway journal drops the duplicates), and nothing replays after a fresh IDENTIFY.
The journal is all there is, so the sink is awaited in arrival order all the same.

Malformed events: discord.py parses each dispatch inside its websocket's receive loop, so a payload
it cannot parse (a MESSAGE_CREATE without an author or content) would tear the connection down, and
with it whatever else was in flight. Every parser but READY/RESUMED is guarded: a failure is skipped
through :meth:`Channel.skip_unreadable` (counted, logged without content, the sender told when the
raw payload names them), in order with the messages around it. Parsing of a person's post lives in
:mod:`channels.discord.inbound`, formatting in :mod:`channels.discord.render`.

Retries: discord.py's HTTP client retries a call itself (429s up to ``max_ratelimit_timeout``, 500,
502, 504 and 524 five times); what it gave up on reaches delivery marked ``retried``, so the pacer
does not retry it once more (docs/channels.md).

Imports are absolute, so ``import discord`` here always means discord.py, never this package.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import discord

from channels import malformed
from channels.base import (
    UNREADABLE,
    Attachment,
    Button,
    Capabilities,
    Channel,
    ChannelError,
    ContextItem,
    FatalChannelError,
    Inbound,
    InboundSink,
    Menu,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    TransientSendError,
    replied_item,
)
from channels.limits import check_size

from . import appcommands, interactions, render, sdk
from .errors import raise_mapped as _raise_mapped
from .inbound import context_item, recover_ids, to_action, to_inbound
from .render import MAX_LEN
from .settings import DiscordSettings

log = logging.getLogger(__name__)

DEFAULTS = DiscordSettings()
DEFAULT_GATEWAY_URL = "wss://gateway.discord.gg/"
NONCE_LEN = 25  # Discord's limit for a string nonce

# Auth failed / invalid intents / privileged intents not enabled: a human must act.
_FATAL_CLOSE_CODES = {
    4004: "Discord rejected the bot token (gateway close 4004)",
    4013: "Discord refused the requested gateway intents (close 4013)",
    4014: "enable the Message Content intent for this bot in the Discord developer portal",
}
_USER_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)


_BUTTON_STYLES = {"primary": discord.ButtonStyle.success, "danger": discord.ButtonStyle.danger}


def _nonce(idempotency_key: str) -> str:
    """A deterministic nonce: Discord returns the earlier message for a repeated nonce (enforce_nonce),
    so a retried or restarted send never posts twice. Discord caps nonces at 25 characters."""
    return hashlib.blake2b(idempotency_key.encode(), digest_size=12).hexdigest()[:NONCE_LEN]


@dataclass(frozen=True, slots=True)
class _Events:
    """What the client forwards to its adapter (bound methods: the client needs nothing else)."""

    live: Callable[[], None]
    lost: Callable[[], None]
    message: Callable[[discord.Message], Awaitable[None]]
    interaction: Callable[[discord.Interaction[Any]], Awaitable[None]]


class _Client(discord.Client):
    """discord.py dispatches to ``on_*`` methods; this forwards them to the adapter."""

    def __init__(self, events: _Events, **options: Any) -> None:
        super().__init__(**options)
        self.events = events

    async def on_connect(self) -> None:  # READY (a fresh session)
        self.events.live()

    async def on_resumed(self) -> None:
        self.events.live()

    async def on_disconnect(self) -> None:
        self.events.lost()

    async def on_message(self, message: discord.Message) -> None:
        await self.events.message(message)

    async def on_interaction(self, interaction: discord.Interaction[Any]) -> None:
        await self.events.interaction(interaction)


class DiscordChannel(Channel):
    """One bot account on Discord (guild channels, threads and DMs)."""

    name = "discord"
    capabilities = Capabilities(
        max_message_len=MAX_LEN,
        edit_interval=1.2,  # Discord allows about 5 message edits per 5 s per channel
        min_send_interval=1.0,  # and about 5 new messages per 5 s per channel
        send_burst=5,
        max_upload_bytes=10 * 1024 * 1024,  # the default upload limit of a non-boosted server
        dedupes_sends=True,  # enforce_nonce: a repeated nonce returns the earlier message
        buttons=True,  # message components; presses arrive as INTERACTION_CREATE
    )
    can_send_only = True

    def __init__(
        self,
        token: str,
        *,
        api_base_url: str = DEFAULTS.api_base_url,
        gateway_url: str | None = DEFAULTS.gateway_url,
        heartbeat_timeout: float = DEFAULTS.heartbeat_timeout,
    ) -> None:
        super().__init__()
        self._token = token
        self._api_base_url = api_base_url.rstrip("/")
        self._gateway_url = gateway_url or DEFAULT_GATEWAY_URL
        self._heartbeat_timeout = heartbeat_timeout
        self._client: _Client | None = None
        self._sink: InboundSink | None = None
        self._sink_lock = asyncio.Lock()
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.pending = appcommands.Pending()  # deferred application commands (appcommands.py)

    def __repr__(self) -> str:  # never show the token
        return f"DiscordChannel(api_base_url={self._api_base_url!r}, state={self.state.value})"

    # -- lifecycle ----------------------------------------------------------------------------
    def _guarded(self, event: str, parse: Callable[[Any], None]) -> Callable[[Any], None]:
        def guarded(data: Any) -> None:
            try:
                parse(data)
            except Exception as exc:
                self._spawn(self._skip(event, data, exc))

        return guarded

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _skip(self, event: str, data: Any, exc: Exception) -> None:
        """Report one dispatch that could not be parsed; queued on the sink lock like a message."""
        if event == "INTERACTION_CREATE" and self._client is not None:
            kind = await interactions.refuse_raw(self._client.http, data)
            self.count_malformed(kind)
            log.critical("discord: skipped unreadable interaction: %s", type(exc).__name__)
            return
        if self._sink is None:
            self.count_malformed(malformed.MESSAGE if event == "MESSAGE_CREATE" else malformed.ENVELOPE)
            return
        async with self._sink_lock:
            me = self._client.user.id if self._client and self._client.user else 0
            ids = recover_ids(data, me) if event == "MESSAGE_CREATE" else {"ref": event}
            kind = malformed.MESSAGE if event == "MESSAGE_CREATE" else malformed.ENVELOPE
            await self._report_unreadable(exc, {**ids, "kind": kind})

    def _make_client(self) -> _Client:
        # We never use voice: silence discord.py's one-time "voice will NOT be supported" warnings.
        sdk.quiet_voice_warnings()
        intents = discord.Intents.none()
        intents.guilds = True
        intents.guild_messages = True
        intents.dm_messages = True
        intents.message_content = True  # privileged: must be enabled in the developer portal
        client = _Client(
            _Events(self._live, self._lost, self._on_message, self._on_interaction),
            intents=intents,
            max_ratelimit_timeout=30.0,  # discord.py's minimum; longer waits surface as RetryAfter
            heartbeat_timeout=self._heartbeat_timeout,
            chunk_guilds_at_startup=False,
            member_cache_flags=discord.MemberCacheFlags.none(),
            allowed_mentions=discord.AllowedMentions(
                everyone=False, users=False, roles=False, replied_user=True
            ),
        )
        # Every dispatch parser but READY/RESUMED guarded (see the module docstring; sdk.py).
        sdk.guard_parsers(client, self._guarded, keep=("READY", "RESUMED"))
        return client

    async def _logged_in(self) -> _Client:
        """This daemon's one client, logged in (REST): kept across runs, so a leadership change or a
        gateway restart leaves the HTTP session that sends and edits go over (docs/scale-out.md). A
        new one only when the last was closed (shutdown, or discord.py closing it on a close code
        it does not reconnect after)."""
        client = self._client
        if client is not None and not client.is_closed() and client.user is not None:
            return client
        if client is not None and not client.is_closed():  # a login that failed half-way
            await client.close()
        client = self._client = self._make_client()
        try:
            await client.login(self._token)
        except BaseException:
            await client.close()
            raise
        return client

    async def run(self, sink: InboundSink) -> None:
        self._sink, self._stopping = sink, False
        sdk.set_endpoints(self._api_base_url, self._gateway_url)
        try:
            client = await self._logged_in()
            if not self.receive:  # a standby daemon: REST only (sends, edits); the leader holds the gateway
                self.report_connected()
                await asyncio.Event().wait()
            await client.connect(reconnect=True)  # the gateway session (the leader, or one daemon)
        except discord.LoginFailure:
            raise FatalChannelError("Discord rejected the bot token (401 Unauthorized)") from None
        except discord.PrivilegedIntentsRequired:
            raise FatalChannelError(_FATAL_CLOSE_CODES[4014]) from None
        except discord.HTTPException as exc:  # login's 5xx after discord.py's own retries: transient
            raise ChannelError(f"Discord login failed: HTTP {exc.status}") from None
        except discord.ConnectionClosed as exc:
            if exc.code in _FATAL_CLOSE_CODES:
                raise FatalChannelError(_FATAL_CLOSE_CODES[exc.code]) from None
            raise ChannelError(f"Discord gateway closed (code {exc.code})") from None
        except asyncio.CancelledError:
            self._stopping = True
            raise
        raise ChannelError("Discord client stopped unexpectedly")

    def _live(self) -> None:
        if not self._stopping:
            self.report_connected()

    def _lost(self) -> None:
        if not self._stopping:
            self.report_trouble("gateway connection lost")

    async def close(self) -> None:
        self._stopping = True
        if self._client is not None and not self._client.is_closed():
            await self._client.close()

    async def disconnect(self) -> None:
        """Only the gateway websocket (the supervisor's restart, a leadership change): sends and
        edits under way keep the client's HTTP session, and the next run reuses its login."""
        self._stopping = True
        if self._client is not None and not self._client.is_closed():
            await sdk.close_gateway(self._client)

    # -- inbound ------------------------------------------------------------------------------
    async def _on_message(self, message: discord.Message) -> None:
        client = self._client
        me = client.user if client else None
        if me is None or self._sink is None:
            return
        # Tasks start in dispatch order and reach this FIFO lock before their first await, so the
        # sink sees messages in arrival order.
        async with self._sink_lock:
            try:
                if message.author.id == me.id or message.author.bot:
                    return
                if message.type not in _USER_MESSAGE_TYPES:
                    return  # joins, pins, thread-created notices ...
                inbound = to_inbound(message, me.id)
            except Exception as exc:  # a field discord.py let through missing or mistyped
                await self._report_unreadable(exc, _ids_of(message))
                return
            if inbound is None:
                return
            try:
                await self.hand_over(self._sink, inbound, ref=f"message {message.id}")
            except Exception as exc:  # no redelivery on Discord: the journal is all there is
                log.error("discord: sink failed for message %s: %s", inbound.key, type(exc).__name__)

    async def _on_interaction(self, interaction: discord.Interaction[Any]) -> None:
        """A press of one of our buttons: to the gateway, then the interaction answered with an
        ephemeral reply only the presser sees (Discord wants an answer within 3 s, or the client
        shows "interaction failed"; the gateway answers from one database write)."""
        if interaction.type is discord.InteractionType.application_command:
            return await appcommands.receive(self, interaction, self._sink, self._sink_lock)
        action = to_action(interaction)
        if action is None:  # not a press of ours, or one we cannot read: counted and refused
            self.count_malformed(interactions.kind_of(interaction.type.value))
            await interactions.refuse(interaction)
            return
        answer = await self.hand_action(action)
        try:
            await interaction.response.send_message(answer.text or "OK", ephemeral=True)
        except discord.HTTPException as exc:  # the press counted; only the note is lost
            log.warning("discord: could not answer interaction %s: HTTP %s", interaction.id, exc.status)

    async def _report_unreadable(self, exc: Exception, ids: dict[str, Any]) -> None:
        """Skip one unreadable event; call with the sink lock held."""
        if self._sink is None:
            return
        try:
            await self.skip_unreadable(self._sink, exc, **ids)
        except ChannelError as err:  # shutting down: Discord has no redelivery to wait for
            log.warning("discord: unreadable %s not reported: %s", ids["ref"], err)

    # -- rendering ----------------------------------------------------------------------------
    def render(self, markdown: str) -> Sequence[Rendered]:
        return render.render(markdown)

    def render_stream(self, markdown: str) -> Rendered:
        return render.render_stream(markdown)

    # -- outbound -----------------------------------------------------------------------------
    def _channel(self, target: ReplyTarget) -> discord.PartialMessageable:
        client = self._client
        if client is None or client.is_closed() or client.user is None:
            raise TransientSendError("Discord is not connected")
        return client.get_partial_messageable(int(target.thread_id or target.chat_id))

    @staticmethod
    def _reference(target: ReplyTarget, channel_id: int) -> discord.MessageReference | None:
        # Discord echoes the referenced message in the answer and discord.py parses it: a reply
        # quoting a message discord.py could not read would fail after it was posted.
        if not target.reply_to or target.extra.get(UNREADABLE) or target.extra.get(appcommands.INTERACTION):
            return None
        return discord.MessageReference(
            message_id=int(target.reply_to), channel_id=channel_id, fail_if_not_exists=False
        )

    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        channel = self._channel(target)
        ref = self._reference(target, channel.id) if part.payload.get("part", 0) == 0 else None
        try:
            if (answered := await self.pending.send(target, part)) is not None:
                return answered  # the deferred response of an application command, edited
            msg = await channel.send(part.text, nonce=_nonce(idempotency_key), reference=ref)  # type: ignore[arg-type]  # None is accepted at run time (discord.py's stub is narrower)
        except Exception as exc:
            _raise_mapped(exc, "send")
        return str(msg.id)

    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        """The message with one row of buttons (components). Presses arrive as interactions and
        are read from their ``custom_id`` (our value), so they work after a restart too: the view
        is only the components' builder, stopped before it is sent so discord.py keeps no state."""
        channel = self._channel(target)
        view = discord.ui.View(timeout=None)
        for b in buttons:
            style = _BUTTON_STYLES.get(b.style, discord.ButtonStyle.secondary)
            view.add_item(discord.ui.Button(label=b.label[:80], custom_id=b.value[:100], style=style))
        view.stop()
        try:
            msg = await channel.send(part.text, nonce=_nonce(idempotency_key), view=view)
        except Exception as exc:
            _raise_mapped(exc, "send")
        return str(msg.id)

    async def close_buttons(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        channel = self._channel(target)
        try:
            await channel.get_partial_message(int(message_id)).edit(content=part.text, view=None)
        except Exception as exc:
            _raise_mapped(exc, "edit")

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        channel = self._channel(target)
        try:
            if not await self.pending.edit(message_id, part):
                await channel.get_partial_message(int(message_id)).edit(content=part.text)
        except Exception as exc:
            _raise_mapped(exc, "edit")

    async def register_commands(self, menu: Menu) -> str:
        """Global application commands (channels/discord/appcommands.py)."""
        if self._client is None or self._client.is_closed():
            raise TransientSendError("Discord is not connected")
        return await appcommands.publish(self._client, menu)

    async def typing(self, target: ReplyTarget) -> None:
        """One typing signal (shows ~10 s); the delivery loop repeats it while the turn works."""
        channel = self._channel(target)
        try:
            await channel.typing()
        except Exception as exc:
            _raise_mapped(exc, "typing")

    async def react(self, target: ReplyTarget, emoji: str) -> None:
        if not target.reply_to:
            return
        channel = self._channel(target)
        try:
            await channel.get_partial_message(int(target.reply_to)).add_reaction(emoji)
        except Exception as exc:
            _raise_mapped(exc, "reaction")

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        check_size(attachment.name, attachment.size, limit)
        if not attachment.file_id.startswith(("https://", "http://")):
            raise PermanentSendError("not a Discord attachment URL")
        client = self._client
        if client is None or client.is_closed():
            raise TransientSendError("Discord is not connected")
        try:
            # The SDK's own CDN fetch (same session, proxy settings); Discord states the size up front.
            data = await client.http.get_from_cdn(attachment.file_id)
        except Exception as exc:
            _raise_mapped(exc, "download")
        check_size(attachment.name, len(data), limit)
        return data

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        check_size(file.name, file.size, self.capabilities.max_upload_bytes)
        channel = self._channel(target)
        try:
            msg = await channel.send(
                caption[:MAX_LEN] or None,
                nonce=_nonce(idempotency_key),
                file=discord.File(io.BytesIO(file.data), filename=file.name),
                reference=self._reference(target, channel.id),  # type: ignore[arg-type]  # None is fine at run time
            )
        except Exception as exc:
            _raise_mapped(exc, "file upload")
        return str(msg.id)

    # -- thread context -----------------------------------------------------------------------
    async def thread_context(self, inbound: Inbound, limit: int, max_chars: int) -> Sequence[ContextItem]:
        """The message replied to (carried in the payload) and, in a thread, the messages before
        this one (GET /channels/{thread}/messages?before=, which needs Read Message History)."""
        replied = replied_item(inbound)
        items: list[ContextItem] = []
        client = self._client
        if inbound.thread_id and limit > 0 and client is not None and client.user is not None:
            channel = self._channel(inbound.target)
            before = discord.Object(id=int(inbound.message_id))
            try:
                history = [m async for m in channel.history(limit=limit, before=before)]
            except Exception as exc:
                _raise_mapped(exc, "history")
            for message in reversed(history):  # oldest first
                if message.type not in _USER_MESSAGE_TYPES:
                    continue
                is_replied = replied is not None and str(message.id) == replied.message_id
                items.append(replied if is_replied and replied else context_item(message, client.user.id))
        if limit <= 0:
            return []
        if replied is not None and replied not in items:  # older than the history read, or no thread
            return [replied, *items[len(items) - limit + 1 :]] if limit > 1 else [replied]
        return items


# -- helpers ----------------------------------------------------------------------------------


def _ids_of(message: discord.Message) -> dict[str, Any]:
    """What a parsed but unusable message still tells (attributes may be missing)."""
    author = getattr(message, "author", None)
    channel = getattr(message, "channel", None)
    person = author is not None and not getattr(author, "bot", True)
    return {
        "ref": f"message {getattr(message, 'id', '?')}",
        "chat_id": str(channel.id) if channel is not None else "",
        "sender_id": str(getattr(author, "id", "")) if person else "",
        "message_id": str(getattr(message, "id", "")),
        "is_direct": getattr(message, "guild", True) is None,
    }
