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
:mod:`channels.discord.inbound`.

Imports are absolute, so ``import discord`` here always means discord.py, never this package.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import re
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

import aiohttp
import discord
import discord.gateway
import discord.http
import yarl
from markdown_it import MarkdownIt

from channels.base import (
    UNREADABLE,
    Attachment,
    Capabilities,
    Channel,
    ChannelError,
    ChannelState,
    FatalChannelError,
    InboundSink,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
)
from channels.textsplit import split_markdown

from .inbound import recover_ids, to_inbound

log = logging.getLogger(__name__)

DEFAULT_API_BASE_URL = "https://discord.com/api/v10"
DEFAULT_GATEWAY_URL = "wss://gateway.discord.gg/"
MAX_LEN = 2000
NONCE_LEN = 25  # Discord's limit for a string nonce

# Auth failed / invalid intents / privileged intents not enabled: a human must act.
_FATAL_CLOSE_CODES = {
    4004: "Discord rejected the bot token (gateway close 4004)",
    4013: "Discord refused the requested gateway intents (close 4013)",
    4014: "enable the Message Content intent for this bot in the Discord developer portal",
}
_USER_MESSAGE_TYPES = (discord.MessageType.default, discord.MessageType.reply)


def _nonce(idempotency_key: str) -> str:
    """A deterministic nonce: Discord returns the earlier message for a repeated nonce (enforce_nonce),
    so a retried or restarted send never posts twice. Discord caps nonces at 25 characters."""
    return hashlib.blake2b(idempotency_key.encode(), digest_size=12).hexdigest()[:NONCE_LEN]


class _Client(discord.Client):
    """discord.py dispatches to ``on_*`` methods; this forwards them to the adapter."""

    def __init__(self, adapter: DiscordChannel, **options: Any) -> None:
        super().__init__(**options)
        self._adapter = adapter

    async def on_connect(self) -> None:  # READY (a fresh session)
        self._adapter._live()

    async def on_resumed(self) -> None:
        self._adapter._live()

    async def on_disconnect(self) -> None:
        if not self._adapter._stopping:
            self._adapter.set_state(ChannelState.RECONNECTING, "gateway connection lost")

    async def on_socket_raw_receive(self, _msg: str) -> None:  # every frame, heartbeat ACKs included
        self._adapter.touch()

    async def on_message(self, message: discord.Message) -> None:
        await self._adapter._on_message(message)


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
    )

    def __init__(
        self,
        token: str,
        *,
        api_base_url: str = DEFAULT_API_BASE_URL,
        gateway_url: str | None = None,
        heartbeat_timeout: float = 60.0,
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

    def __repr__(self) -> str:  # never show the token
        return f"DiscordChannel(api_base_url={self._api_base_url!r}, state={self.state.value})"

    # -- lifecycle ----------------------------------------------------------------------------
    def _apply_endpoints(self) -> None:
        """discord.py has no per-client base URL: both are process-wide class attributes, read when
        a request or a websocket is made. Set them before login; one Discord bot per process.
        (``discord.http._set_api_version()`` would reset Route.BASE; we never call it.)"""
        discord.http.Route.BASE = self._api_base_url
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(self._gateway_url)

    def _guard_parsers(self, client: _Client) -> None:
        """Wrap discord.py's dispatch parsers (see the module docstring). ``parsers`` is the one
        dict every websocket of this client reads (``ws._discord_parsers``): private, pinned 2.7."""
        parsers: dict[str, Callable[[Any], None]] = client._connection.parsers
        for event, parse in list(parsers.items()):
            if event not in ("READY", "RESUMED"):
                parsers[event] = self._guarded(event, parse)

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
        if self._sink is None:
            return
        async with self._sink_lock:
            me = self._client.user.id if self._client and self._client.user else 0
            await self._report(exc, recover_ids(data, me) if event == "MESSAGE_CREATE" else {"ref": event})

    def _make_client(self) -> _Client:
        # We never use voice: silence discord.py's one-time "voice will NOT be supported" warnings.
        discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False
        intents = discord.Intents.none()
        intents.guilds = True
        intents.guild_messages = True
        intents.dm_messages = True
        intents.message_content = True  # privileged: must be enabled in the developer portal
        client = _Client(
            self,
            intents=intents,
            enable_debug_events=True,  # gives on_socket_raw_receive, our liveness signal
            max_ratelimit_timeout=30.0,  # longer waits surface as RetryAfter for delivery to pace
            heartbeat_timeout=self._heartbeat_timeout,
            chunk_guilds_at_startup=False,
            member_cache_flags=discord.MemberCacheFlags.none(),
            allowed_mentions=discord.AllowedMentions(
                everyone=False, users=False, roles=False, replied_user=True
            ),
        )
        self._guard_parsers(client)
        return client

    async def run(self, sink: InboundSink) -> None:
        self._sink, self._stopping = sink, False
        self.set_state(ChannelState.STARTING)
        self._apply_endpoints()
        client = self._client = self._make_client()
        try:
            await client.start(self._token, reconnect=True)
        except discord.LoginFailure:
            self._fail("Discord rejected the bot token (401 Unauthorized)")
        except discord.PrivilegedIntentsRequired:
            self._fail(_FATAL_CLOSE_CODES[4014])
        except discord.HTTPException as exc:  # login's 5xx after discord.py's own retries: transient
            raise ChannelError(f"Discord login failed: HTTP {exc.status}") from None
        except discord.ConnectionClosed as exc:
            if exc.code in _FATAL_CLOSE_CODES:
                self._fail(_FATAL_CLOSE_CODES[exc.code])
            raise ChannelError(f"Discord gateway closed (code {exc.code})") from None
        except asyncio.CancelledError:
            self._stopping = True
            self.set_state(ChannelState.STOPPED)
            raise
        finally:
            if not client.is_closed():
                await client.close()
        raise ChannelError("Discord client stopped unexpectedly")

    def _fail(self, reason: str) -> NoReturn:
        self.set_state(ChannelState.FAILED, reason)
        raise FatalChannelError(reason) from None

    def _live(self) -> None:
        self.touch()
        if not self._stopping:
            self.set_state(ChannelState.CONNECTED)

    async def close(self) -> None:
        self._stopping = True
        if self._client is not None and not self._client.is_closed():
            await self._client.close()

    # -- inbound ------------------------------------------------------------------------------
    async def _on_message(self, message: discord.Message) -> None:
        self.touch()
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
                await self._report(exc, _ids_of(message))
                return
            if inbound is None:
                return
            try:
                await self.hand_over(self._sink, inbound, ref=f"message {message.id}")
            except Exception as exc:  # no redelivery on Discord: the journal is all there is
                log.error("discord: sink failed for message %s: %s", inbound.key, type(exc).__name__)

    async def _report(self, exc: Exception, ids: dict[str, Any]) -> None:
        """Skip one unreadable event; call with the sink lock held."""
        if self._sink is None:
            return
        try:
            await self.skip_unreadable(self._sink, exc, **ids)
        except ChannelError as err:  # shutting down: Discord has no redelivery to wait for
            log.warning("discord: unreadable %s not reported: %s", ids["ref"], err)

    # -- rendering ----------------------------------------------------------------------------
    def render(self, markdown: str) -> Sequence[Rendered]:
        parts = split_markdown(to_discord_markdown(markdown), MAX_LEN)
        if not parts:
            return [Rendered(text="…")]
        # Only the first part is a visible reply; the rest follow it without repeating the quote.
        return [Rendered(text=p, payload={"part": i}) for i, p in enumerate(parts)]

    def render_stream(self, markdown: str) -> Rendered:
        text = to_discord_markdown(markdown)
        text = text if len(text) <= MAX_LEN else text[: MAX_LEN - 5] + "…"
        if text.count("```") % 2:
            text += "\n```"  # keep a half-streamed code block from swallowing the message
        return Rendered(text=text)

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
        if not target.reply_to or target.extra.get(UNREADABLE):
            return None
        return discord.MessageReference(
            message_id=int(target.reply_to), channel_id=channel_id, fail_if_not_exists=False
        )

    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        channel = self._channel(target)
        ref = self._reference(target, channel.id) if part.payload.get("part", 0) == 0 else None
        try:
            msg = await channel.send(part.text, nonce=_nonce(idempotency_key), reference=ref)
        except Exception as exc:
            _raise_mapped(exc, "send")
        return str(msg.id)

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        channel = self._channel(target)
        try:
            await channel.get_partial_message(int(message_id)).edit(content=part.text)
        except Exception as exc:
            _raise_mapped(exc, "edit")

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
        if attachment.size is not None and attachment.size > limit:
            raise PermanentSendError(f"attachment {attachment.name!r} is larger than {limit} bytes")
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
        if len(data) > limit:
            raise PermanentSendError(f"attachment {attachment.name!r} is larger than {limit} bytes")
        return data

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        if file.size > self.capabilities.max_upload_bytes:
            raise PermanentSendError(f"{file.name} is too large for Discord ({file.size} bytes)")
        channel = self._channel(target)
        try:
            msg = await channel.send(caption[:MAX_LEN] or None, nonce=_nonce(idempotency_key),
                                     file=discord.File(io.BytesIO(file.data), filename=file.name),
                                     reference=self._reference(target, channel.id))
        except Exception as exc:
            _raise_mapped(exc, "file upload")
        return str(msg.id)


# -- helpers ----------------------------------------------------------------------------------


def _ids_of(message: discord.Message) -> dict[str, Any]:
    """What a parsed but unusable message still tells (attributes may be missing)."""
    author = getattr(message, "author", None)
    channel = getattr(message, "channel", None)
    person = author is not None and not getattr(author, "bot", True)
    return {
        "ref": f"message {getattr(message, 'id', '?')}",
        "chat_id": str(channel.id) if channel is not None else "",
        "sender_id": str(author.id) if person else "",
        "message_id": str(getattr(message, "id", "")),
        "is_direct": getattr(message, "guild", True) is None,
    }


def _raise_mapped(exc: BaseException, what: str) -> NoReturn:
    """Translate discord.py / transport errors into the channel contract's errors.

    discord.py already retries short 429s (sleeping retry_after) and 500/502/504; what reaches us is a
    429 longer than ``max_ratelimit_timeout`` (RateLimited), or what its retries could not fix."""
    if isinstance(exc, ChannelError):
        raise exc
    if isinstance(exc, discord.RateLimited):
        raise RetryAfter(exc.retry_after, f"Discord {what} rate limited") from exc
    if isinstance(exc, discord.HTTPException):
        detail = f"Discord {what} failed: {exc.status} (code {exc.code}) {exc.text}".strip()
        if exc.status == 429:
            try:
                seconds = float(exc.response.headers.get("Retry-After", "1"))
            except (AttributeError, ValueError):
                seconds = 1.0
            raise RetryAfter(seconds, f"Discord {what} rate limited") from exc
        if exc.status >= 500:
            raise TransientSendError(detail) from exc
        raise PermanentSendError(detail) from exc  # 400 (50035 ...), 403 Forbidden, 404 NotFound
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        raise TransientSendError(f"Discord {what} failed: {type(exc).__name__}") from exc
    raise exc


# -- Markdown → Discord markdown ----------------------------------------------------------------
# Discord renders most Markdown natively (bold, italics, code, fences, lists, quotes, links, # to ###).
# It lacks tables, setext and level 4-6 headings, rules and inline images: those are rewritten here,
# located with markdown-it's block map so that code blocks are never touched.

_MD = MarkdownIt("commonmark").enable("table")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CELL_MARKUP = re.compile(r"\*\*|__|`")
_CODE_SPAN = re.compile(r"(`+[^`]*`+)")


def to_discord_markdown(markdown: str) -> str:
    """Rewrite what Discord cannot show: tables → aligned code blocks, h4-h6 and setext headings →
    bold or ``#`` headings, ``---`` rules → a line, images → links."""
    text = markdown.replace("\r\n", "\n")
    lines = text.split("\n")
    tokens = _MD.parse(text)
    replace: dict[int, tuple[int, list[str]]] = {}  # start line -> (end line, new lines)
    code: set[int] = set()
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.map is None:
            i += 1
            continue
        start, end = tok.map
        if tok.type in ("fence", "code_block"):
            code.update(range(start, end))
        elif tok.level > 0:
            pass  # inside a list or quote: rewriting would lose the prefix; Discord shows it as text
        elif tok.type == "table_open":
            rows: list[list[str]] = []
            while tokens[i].type != "table_close":
                t = tokens[i]
                if t.type == "tr_open":
                    rows.append([])
                elif t.type == "inline" and rows:
                    rows[-1].append(_CELL_MARKUP.sub("", t.content).strip())
                i += 1
            replace[start] = (end, _table_block(rows))
        elif tok.type == "heading_open":
            title, level = tokens[i + 1].content, int(tok.tag[1])
            if level > 3 or not tok.markup.startswith("#"):  # Discord knows only ATX # to ###
                replace[start] = (end, [f"{'#' * level} {title}" if level <= 3 else f"**{title}**"])
        elif tok.type == "hr":
            replace[start] = (end, ["──────────"])
        i += 1
    out: list[str] = []
    n = 0
    while n < len(lines):
        if n in replace:
            end, new = replace[n]
            out.extend(new)
            n = max(end, n + 1)
            continue
        out.append(lines[n] if n in code else _images_to_links(lines[n]))
        n += 1
    return "\n".join(out)


def _images_to_links(line: str) -> str:
    """Discord shows no inline images: keep them as links (outside inline code spans)."""
    pieces = _CODE_SPAN.split(line)
    for k in range(0, len(pieces), 2):
        pieces[k] = _IMAGE.sub(lambda m: f"[{m[1].strip()}]({m[2]})" if m[1].strip() else m[2], pieces[k])
    return "".join(pieces)


def _table_block(rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    cols = max(len(r) for r in rows)
    rows = [r + [""] * (cols - len(r)) for r in rows]
    widths = [max(len(r[c]) for r in rows) for c in range(cols)]

    def fmt(row: list[str]) -> str:
        return " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()

    body = [fmt(rows[0]), "-+-".join("-" * w for w in widths)] + [fmt(r) for r in rows[1:]]
    return ["```", *body, "```"]
