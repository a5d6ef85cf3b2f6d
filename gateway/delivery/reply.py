"""Delivery: one state machine for every platform.

placeholder (queued / resuming sign) → throttled edits of one message while text streams → the final
answer rendered and split for the platform. Every message id we create goes to the outbox before
anything else happens, so a retry or a restart edits the same messages instead of posting new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable

from channels.base import (
    Channel,
    ChannelError,
    NotModified,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    TransientSendError,
)
from gateway.delivery.pacing import ChatPacer
from gateway.ops.metrics import Metrics
from gateway.store.journal import Store

log = logging.getLogger(__name__)

SENDING = ""
"""Outbox marker written just before a new message is sent: if the process dies before the real id
is recorded, the next run knows the send may have happened (see :meth:`Reply.load`)."""
SUPERSEDES = "↪️ _My earlier reply to this message was cut off; this one replaces it._\n\n"


class Reply:
    """The bot's reply to one journaled message."""

    def __init__(
        self,
        channel: Channel,
        target: ReplyTarget,
        key: str,
        store: Store,
        pacer: ChatPacer,
        metrics: Metrics,
        *,
        stream: bool = True,
        first_delay: float = 0.6,
    ) -> None:
        self.channel = channel
        self.target = target
        self.key = key
        self._store = store
        self._pacer = pacer
        self._metrics = metrics
        self._stream = stream and channel.capabilities.can_edit
        self._first_delay = first_delay
        self._parts: dict[int, str] = {}
        self._shown = ""
        self._pending: str | None = None
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._closing = False
        self._started = time.monotonic()
        self._last_edit = 0.0
        self._put_lock = asyncio.Lock()  # one creator of each part, however many tasks share the reply
        self._loading: asyncio.Task[None] | None = None
        self._latest = ""
        """The last text offered to :meth:`stream` (what :meth:`materialise` shows)."""
        self._replaces = False
        """Part 0 was sent by this reply after :attr:`supersedes` was known: the final says so."""
        self._mark_sends = not channel.capabilities.dedupes_sends
        self._drafts = True
        self.supersedes = False
        """A previous run may have left a partial message we could not find: the final says it
        replaces it."""

    async def load(self) -> None:
        """Pick up message ids sent for this key before a restart (once per reply).

        A part marked :data:`SENDING` was being sent when the last run died: the channel is asked
        to find it (Slack searches its metadata); found, it is edited like any other part; not
        found on a platform that cannot dedupe a repeated send, the final answer says it
        supersedes whatever partial message may be in the chat.

        One read per reply, shared by every caller and shielded from their cancellation: a turn
        stopped while it loads still finds the messages of the run before (gateway/turns/stopping.py)."""
        loading = self._loading
        if loading is None or (loading.done() and (loading.cancelled() or loading.exception())):
            loading = self._loading = asyncio.create_task(self._load(), name=f"load:{self.key}")
            loading.add_done_callback(_retrieve)  # a failure is raised to the callers, not logged
        await asyncio.shield(loading)

    async def _load(self) -> None:
        stored = await self._store.outbox_get(self.key)
        known = {p: mid for p, mid in stored.items() if mid != SENDING}
        for part_no in sorted(set(stored) - set(known)):
            found = None
            try:
                found = await self.channel.recover(self.target, f"{self.key}#{part_no}")
            except Exception as exc:  # finding the orphan is best effort
                log.info("could not look for the orphan of %s part %d: %s", self.key, part_no, exc)
            if found:
                known[part_no] = found
                await self._store.outbox_put(self.key, part_no, found)
            elif part_no == 0 and self._mark_sends and not self.channel.capabilities.finds_orphans:
                self.supersedes = True
        # Parts sent by this process while the read was in flight win over the older rows.
        self._parts = {**known, **self._parts}

    @property
    def has_message(self) -> bool:
        return 0 in self._parts

    @property
    def partial(self) -> str:
        """The text streamed so far (what an interrupted answer keeps above its note)."""
        return self._latest

    # -- low level ------------------------------------------------------------------------------
    async def _put(self, part_no: int, part: Rendered) -> None:
        """Send part ``part_no`` or edit it if it already exists."""
        async with self._put_lock:
            await self._put_locked(part_no, part)

    async def _put_locked(self, part_no: int, part: Rendered) -> None:
        existing = self._parts.get(part_no)
        channel = self.channel
        if existing is not None:
            try:
                await self._pacer.call(lambda: channel.edit(self.target, existing, part), is_send=False)
                self._metrics.edits.labels(channel.name).inc()
                return
            except NotModified:
                return
            except PermanentSendError as exc:
                # The message is gone (deleted by a user, too old to edit): post a new one.
                log.info("edit of %s part %d failed (%s); sending anew", self.key, part_no, exc)
        idem = f"{self.key}#{part_no}" if existing is None else f"{self.key}#{part_no}r"
        if self._mark_sends:
            await self._store.outbox_put(self.key, part_no, SENDING)
        try:
            message_id = await self._pacer.call(
                lambda: channel.send(self.target, part, idempotency_key=idem), is_send=True
            )
        except ChannelError as exc:
            if isinstance(exc, TransientSendError) and exc.maybe_sent:
                # Its answer was lost: the message may be in the chat, and nothing can tell (docs/
                # durability.md). The mark stays for a restart; a part 0 sent again from here on
                # says that it replaces a cut-off one, unless the platform can find the orphan.
                if part_no == 0 and self._mark_sends and not self.channel.capabilities.finds_orphans:
                    self.supersedes = True
                raise
            # The platform (or the network) said no: nothing was sent, so no orphan to look for.
            if self._mark_sends:
                await self._store.outbox_drop(self.key, part_no)
            raise
        answered = time.monotonic()
        await self._record(part_no, message_id)
        # The crash window that remains: from the platform's answer to the id on disk (the
        # request's own flight back adds to it). bench/bench_crash_window.py reads this line.
        log.debug("outbox: %s part %d recorded %.2f ms after the platform answered",
                  self.key, part_no, (time.monotonic() - answered) * 1000)  # fmt: skip

    async def _record(self, part_no: int, message_id: str) -> None:
        """A part went out: remember its id here and in the outbox, and count it."""
        self._parts[part_no] = message_id
        self._replaces = self._replaces or (part_no == 0 and self.supersedes)
        await self._store.outbox_put(self.key, part_no, message_id)
        self._metrics.messages_out.labels(self.channel.name).inc()

    def sent(self, part_no: int) -> bool:
        """Whether part ``part_no`` already went out (in this process or before a restart)."""
        return part_no in self._parts

    async def send_file(self, part_no: int, file: OutFile, caption: str) -> None:
        """Upload a file as part ``part_no`` unless the outbox says it went out already; paced
        like every other send into the chat, recorded like every other part."""
        async with self._put_lock:
            if part_no in self._parts:
                return
            channel, idem = self.channel, f"{self.key}#{part_no}"
            message_id = await self._pacer.call(
                lambda: channel.send_file(self.target, file, caption, idempotency_key=idem), is_send=True
            )
            await self._record(part_no, message_id)

    async def show(self, part_no: int, markdown: str) -> None:
        """A message of its own beside the answer (the plan's checklist, gateway/delivery/plan.py):
        sent once, then edited in place; its id is in the outbox like every part's, so a restarted
        turn edits the same message. One message: what does not fit the first part is left out."""
        await self._put(part_no, self.channel.render(markdown)[0])

    async def note(self, part_no: int, text: str) -> None:
        """A separate message after the answer (e.g. files that could not be sent), sent once."""
        for i, part in enumerate(self.channel.render(text)):
            if not self.sent(part_no + i):
                await self._put(part_no + i, part)

    # -- streaming ------------------------------------------------------------------------------
    async def status(self, text: str) -> None:
        """Show a short sign now (queued, resuming) in the reply's first message."""
        await self._put(0, Rendered(text=text))
        self._shown = text

    async def sign(self, text: str, still: Callable[[], bool]) -> bool:
        """Post ``text`` as the reply's first message (the queued sign) unless the reply has one
        already or ``still()`` turned false (the turn started, or was stopped); checked under the
        lock every creator of part 0 takes, so the sign never lands on top of what replaced it."""
        async with self._put_lock:
            if 0 in self._parts or not still():
                return False
            await self._put_locked(0, Rendered(text=text))
            self._shown = text
            return True

    async def materialise(self, placeholder: str) -> bool:
        """Make sure the reply has a real first message in the chat now, so that whatever is posted
        after it reads below it (a queued sign for the next message: gateway/daemon/gateway.py). Without
        one yet (a Telegram DM streaming drafts, an edit not yet due, no streaming at all), the text
        so far is posted, else ``placeholder``; from then on the answer streams by editing it
        (drafts end). False when there is none and the platform cannot edit one into the answer."""
        async with self._put_lock:
            if 0 in self._parts:
                return True
            if not self.channel.capabilities.can_edit:
                return False
            self._drafts = False
            latest = self._latest
            if latest.strip() and self._stream:
                part = self.channel.render_stream(latest)
            else:
                latest, part = placeholder, Rendered(text=placeholder)
            await self._put_locked(0, part)
            self._shown = latest
            return True

    def stream(self, text: str) -> None:
        """Offer the text so far; it is shown when pacing allows. Never blocks the turn."""
        if not self._stream or self._closing or not text.strip():
            return
        self._latest = text
        self._pending = text
        self._wake.set()
        if self._flusher is None:
            # The first edit is timed from the first text, not from the turn's start: a turn slowed
            # by load whose answer arrives at once still goes out as one message.
            self._started = time.monotonic()
            self._flusher = asyncio.create_task(self._flush_loop(), name=f"stream:{self.key}")

    async def _flush_loop(self) -> None:
        interval = self.channel.capabilities.edit_interval
        while not self._closing:
            first = not self._last_edit and not self.has_message
            due = self._started + self._first_delay if first else self._last_edit + interval
            delay = due - time.monotonic()
            if delay > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                continue  # re-check: closing, or simply due now
            text, self._pending = self._pending, None
            if text is None or text == self._shown:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                rendered = self.channel.render_stream(text)
                # Under the lock: a draft never lands after :meth:`materialise` posted the message.
                async with self._put_lock:
                    await self._show_locked(rendered)
                self._shown = text
            except Exception as exc:  # streaming is best effort; the final answer is not
                log.warning("streaming edit failed for %s: %s", self.key, exc)
            self._last_edit = time.monotonic()

    async def _show_locked(self, rendered: Rendered) -> None:
        if 0 not in self._parts and self._drafts and self.channel.can_preview(self.target):
            # An ephemeral draft: a crash now leaves nothing half-written in the chat.
            try:
                await self._pacer.call(functools.partial(self._preview, rendered), is_send=False)
                return
            except PermanentSendError as exc:
                # A server without drafts (an older self-hosted Bot API): stream edits.
                log.info("draft previews refused for %s (%s); streaming edits", self.key, exc)
                self._drafts = False
        await self._put_locked(0, rendered)

    def _preview(self, rendered: Rendered) -> Awaitable[None]:
        return self.channel.preview(self.target, self.key, rendered)

    def abandon(self) -> None:
        """Send nothing more from here (another daemon took the entry over: gateway/daemon/cluster.py); a
        send already under way completes and is recorded."""
        self._closing = True
        self._wake.set()

    async def _stop_stream(self) -> None:
        self._closing = True
        self._wake.set()
        if self._flusher is not None:
            # Never cancel mid-send: a message sent but not recorded would be posted twice.
            await asyncio.shield(self._flusher)
            self._flusher = None

    # -- final ----------------------------------------------------------------------------------
    async def finish(self, markdown: str) -> None:
        """Deliver the final answer: part 0 edited in place, further parts sent after it."""
        await self._stop_stream()
        if self.supersedes and (0 not in self._parts or self._replaces):
            markdown = SUPERSEDES + markdown
        parts = list(self.channel.render(markdown)) if markdown.strip() else []
        if not parts:
            parts = [Rendered(text="(empty answer)")]
        for i, part in enumerate(parts):
            await self._put(i, part)

    async def finish_plain(self, text: str) -> None:
        """Deliver a fixed notice (errors, command output) as plain rendered text."""
        await self.finish(text)


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a finished load's exception as seen: its callers got it (or were cancelled)."""
    if not task.cancelled():
        task.exception()
