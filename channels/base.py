"""The one small contract every platform adapter implements.

An adapter turns its SDK's events into :class:`Inbound` values and carries replies back. It knows no
agent, no store and no other platform. The gateway owns policy (who may talk, journaling, ordering,
pacing); the adapter owns the platform's facts (its limits, its formatting, its wire quirks).
"""

from __future__ import annotations

import abc
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from channels import malformed
from channels.egress import NO_EGRESS, Egress, guard_outbound
from channels.errors import (
    ChannelError,
    FatalChannelError,
    NotModified,
    PermanentSendError,
    RetryAfter,
    TransientSendError,
    scrub,
)
from channels.menus import Menu, MenuCommand
from channels.messages import (
    FORWARDED,
    REPLIED,
    REPLIED_FILE,
    REPLIED_MAX_CHARS,
    UNREADABLE,
    Action,
    ActionAnswer,
    ActionSink,
    Attachment,
    Button,
    Capabilities,
    ContextItem,
    Inbound,
    OutFile,
    Rendered,
    ReplyTarget,
    clean_text,
    replied_extra,
    replied_file,
    replied_file_extra,
    replied_item,
)
from channels.status import ChannelState, ChannelStatus, Report, StatusListener
from channels.textsplit import stream_text
from channels.webroute import WebRoute

log = logging.getLogger(__name__)

__all__ = [
    "FORWARDED",
    "REPLIED",
    "REPLIED_FILE",
    "REPLIED_MAX_CHARS",
    "UNREADABLE",
    "Action",
    "ActionAnswer",
    "ActionSink",
    "Attachment",
    "Button",
    "Capabilities",
    "Channel",
    "ChannelError",
    "ContextItem",
    "FatalChannelError",
    "Inbound",
    "InboundSink",
    "Menu",
    "MenuCommand",
    "NotModified",
    "OutFile",
    "PermanentSendError",
    "Rendered",
    "ReplyTarget",
    "RetryAfter",
    "TransientSendError",
    "WebRoute",
    "clean_text",
    "replied_extra",
    "replied_file",
    "replied_file_extra",
    "replied_item",
    "scrub",
]

_CONTENT_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
                   RecursionError)  # fmt: skip
"""What a message's own content can make the gateway raise (UnicodeError is a ValueError)."""


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


InboundSink = Callable[[Inbound], Awaitable[None]]
"""Called by an adapter for each inbound message. It returns once the message is durably journaled
(or deliberately dropped); only then may the adapter acknowledge the event to the platform."""


class Channel(abc.ABC):
    """A platform adapter. Subclasses implement the abstract methods; shared bookkeeping lives here."""

    name: str
    capabilities: Capabilities
    can_send_only = False
    """The adapter can run connected for sending only (:attr:`receive` False): a standby daemon
    of a platform that allows one inbound connection per bot still delivers replies."""
    egress: Egress = NO_EGRESS
    """Masks the daemon's secrets in everything this channel sends (channels/egress.py); the
    gateway sets it when it attaches the channel."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        guard_outbound(cls)  # every adapter's outbound methods mask what they send

    def __init__(self) -> None:
        self.status = ChannelStatus(self)
        self.unreadable_events: int = 0
        """Malformed events and presses seen (:meth:`count_malformed`; ``dropped`` not included)."""
        self._malformed: Callable[[str], None] | None = None
        self._reporter: Report = self._unsupervised
        self._actions: ActionSink | None = None
        self.receive = True
        """False: :meth:`run` connects for sending only and takes in nothing (another daemon
        receives for this bot); only for adapters with :attr:`can_send_only`."""
        self.notice: str | None = None
        """Something the operator should know that is not a connection state (WhatsApp: a reply
        refused outside the 24-hour window); /readyz and ``chital status`` show it."""

    # -- status (read here, written by the supervisor) ------------------------------------------
    @property
    def state(self) -> ChannelState:
        return self.status.state

    @property
    def reason(self) -> str | None:
        return self.status.reason

    @property
    def state_since(self) -> float:
        return self.status.since

    def add_status_listener(self, listener: StatusListener) -> None:
        self.status.add_listener(listener)

    def supervise(self, report: Report) -> None:
        """Route this adapter's reports to ``report`` (the supervisor's, installed once)."""
        self._reporter = report

    def report_connected(self) -> None:
        """The connection is live (again). Cheap: repeating it changes nothing."""
        self._reporter(None)

    def report_trouble(self, reason: str) -> None:
        """The connection is down and the adapter is getting it back by itself (``reason`` says
        why, without a token). To give up instead, raise from :meth:`run`."""
        self._reporter(reason)

    def _unsupervised(self, trouble: str | None) -> None:
        """Reports of an adapter run alone (a test, a benchmark) apply as they come."""
        if trouble is None:
            self.status.set(ChannelState.CONNECTED)
        else:
            self.status.set(ChannelState.RECONNECTING, trouble)

    # -- malformed input (channels/malformed.py) ----------------------------------------------
    def on_malformed(self, count: Callable[[str], None]) -> None:
        """Route :meth:`count_malformed` to ``count`` (the gateway's metric, installed once)."""
        self._malformed = count

    def count_malformed(self, kind: str) -> None:
        """Count one malformed event of ``kind`` (:data:`channels.malformed.KINDS`), whether or not
        it ever reaches the sink: the count happens where the input is refused, at the boundary."""
        if kind != malformed.DROPPED:
            self.unreadable_events += 1
        if self._malformed is not None:
            try:
                self._malformed(kind)
            except Exception as exc:  # a metric must never stop an ack
                log.debug("%s: malformed count failed: %s", self.name, type(exc).__name__)

    # -- button presses -------------------------------------------------------------------------
    def on_action(self, sink: ActionSink) -> None:
        """Route button presses to ``sink`` (the gateway's, installed once)."""
        self._actions = sink

    async def hand_action(self, action: Action) -> ActionAnswer:
        """Give a press to the gateway; the adapter then answers the platform with the result.

        Never raises for the press's own sake: a press nobody can handle is refused with a note,
        so the platform's spinner stops instead of the button failing silently."""
        if self._actions is None:
            return ActionAnswer("This button is not active right now.", refused=True)
        try:
            answer = await self._actions(action)
            return replace(answer, text=self.egress(answer.text)) if answer.text else answer
        except ChannelError:
            raise
        except Exception as exc:
            log.error("%s: a button press could not be handled: %s", self.name, type(exc).__name__)
            return ActionAnswer("⚠️ That did not work; please try again.", refused=True)

    # -- events that cannot be read ----------------------------------------------------------
    async def skip_unreadable(
        self,
        sink: InboundSink,
        error: BaseException,
        *,
        ref: str,
        chat_id: str = "",
        sender_id: str = "",
        message_id: str = "",
        is_direct: bool = False,
        addressed: bool = False,
        thread_id: str | None = None,
        extra: dict[str, Any] | None = None,
        kind: str = malformed.MESSAGE,
    ) -> None:
        """Skip one event that could not be parsed, so that it never wedges the channel.

        Why: a platform redelivers what we do not acknowledge, so raising on a malformed event
        blocks every chat behind it, across restarts. Instead it is counted, logged at CRITICAL with
        ids and the exception type only (never the payload: it is someone's message), and handed to
        ``sink`` as a marker :class:`Inbound` (``unsupported=UNREADABLE``, empty text) carrying the
        ids the adapter recovered from the raw event; its ``extra`` (and so the reply target's)
        holds ``{"unreadable": True}``, so an adapter whose SDK parses the quoted original in a
        reply's answer can reply without quoting it. The gateway counts it in its metrics and, when
        chat, sender and message id are known and the sender may talk to the bot, answers through
        its journaled notice path. The caller then acknowledges the event. A :class:`ChannelError`
        from the sink (the gateway is shutting down) propagates so the event comes again; any
        other failure of the sink counts the event as ``dropped`` (it is acknowledged all the same).
        Ids that are not usable (:func:`channels.malformed.is_id`: too long, control characters)
        are left out, so they never reach a log line or a journal key."""
        self.count_malformed(kind)
        chat_id, sender_id, message_id = (
            v if malformed.is_id(v) else "" for v in (chat_id, sender_id, message_id)
        )
        thread_id = thread_id if malformed.is_id(thread_id) else None
        ref = ref if len(ref) <= 2 * malformed.MAX_ID_LEN and ref.isprintable() else "event ?"
        log.critical(
            "%s: skipped unreadable %s (chat %s, message %s): %s",
            self.name, ref or "event ?", chat_id or "?", message_id or "?", type(error).__name__,
        )  # fmt: skip
        marker = Inbound(
            platform=self.name,
            chat_id=chat_id,
            message_id=message_id,
            sender_id=sender_id,
            text="",
            is_direct=is_direct,
            addressed=addressed or is_direct,
            thread_id=thread_id,
            extra={**(extra if extra and _json_safe(extra) else {}), UNREADABLE: True},
            unsupported=UNREADABLE,
        )
        try:
            await sink(marker)
        except ChannelError:
            raise
        except Exception as exc:  # the event is unreadable whatever happens: never let it wedge us
            self.count_malformed(malformed.DROPPED)
            log.critical("%s: could not report unreadable event %s: %s", self.name, ref, type(exc).__name__)

    async def hand_over(self, sink: InboundSink, inbound: Inbound, *, ref: str) -> None:
        """``sink(inbound)``, except that a message the gateway refuses for its content is skipped.

        A data error (``ValueError``, ``TypeError``, ``KeyError`` ...: e.g. a string the journal
        cannot encode) would fail again on every redelivery. It counts as this message's fault only
        if the gateway then accepts a bare marker for the same message (same key, no text); if even
        that fails the store itself is down, and the original error propagates so the platform
        redelivers later. Infrastructure errors (``ChannelError``, SQLite's OperationalError, disk
        full) always propagate. A message whose ids are not usable (too long, control characters),
        or with a text or file list no platform sends (:func:`channels.malformed.problems`), is
        skipped as malformed before the sink sees it; overlong names are cut."""
        bad = malformed.problems(inbound)
        if bad:
            await self.skip_unreadable(
                sink, ValueError(f"unusable {', '.join(bad)}"), ref=ref, chat_id=inbound.chat_id,
                sender_id=inbound.sender_id, message_id=inbound.message_id, is_direct=inbound.is_direct,
                addressed=inbound.addressed, thread_id=inbound.thread_id,
            )  # fmt: skip
            return
        cap = malformed.MAX_NAME_CHARS
        if len(inbound.sender_name) > cap or len(inbound.chat_title) > cap:
            inbound = replace(
                inbound, sender_name=inbound.sender_name[:cap], chat_title=inbound.chat_title[:cap]
            )
        try:
            await sink(inbound)
        except _CONTENT_ERRORS as exc:
            marker = replace(
                inbound, text="", sender_name="", chat_title="", attachments=(), unsupported=UNREADABLE,
                extra={**(inbound.extra if _json_safe(inbound.extra) else {}), UNREADABLE: True},
            )  # fmt: skip
            try:
                await sink(marker)
            except Exception:
                raise exc from None
            self.count_malformed(malformed.MESSAGE)
            log.critical(
                "%s: skipped %s (chat %s, message %s) that could not be journaled: %s",
                self.name, ref, inbound.chat_id, inbound.message_id, type(exc).__name__,
            )  # fmt: skip

    # -- lifecycle ----------------------------------------------------------------------------
    @abc.abstractmethod
    async def run(self, sink: InboundSink) -> None:
        """Connect and deliver inbound messages to ``sink`` until cancelled.

        Calls :meth:`report_connected` once live (and :meth:`report_trouble` while it reconnects
        by itself). Raises :class:`FatalChannelError` when retrying cannot help; any other exception
        (or returning) makes the supervisor restart the channel with backoff. Cancellation must
        close connections cleanly.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook, most adapters need it
        """Release HTTP sessions etc. after ``run`` has ended for good (shutdown). Idempotent."""

    async def disconnect(self) -> None:
        """Drop the inbound connection before ``run`` is started again (the supervisor's restart).

        Replies may still be on their way through the adapter's HTTP pool: adapters whose sends
        do not depend on the inbound connection override this to keep that pool open, so a
        restart never cuts a reply mid-delivery. The default closes everything."""
        await self.close()

    def web_routes(self) -> Sequence[WebRoute]:
        """HTTP routes this channel serves on the daemon's hooks listener, for platforms that
        deliver by calling us (channels/webroute.py). Most connect out and serve nothing."""
        return ()

    # -- rendering ----------------------------------------------------------------------------
    @abc.abstractmethod
    def render(self, markdown: str) -> Sequence[Rendered]:
        """The final answer (Markdown) formatted for the platform, split at its limit without
        breaking code blocks. Never returns an empty sequence for non-empty input."""

    def render_stream(self, markdown: str) -> Rendered:
        """An in-progress snapshot for streaming edits: the text cut to the limit, an unfinished
        code block closed (:func:`channels.textsplit.stream_text`)."""
        return Rendered(text=stream_text(markdown, self.capabilities.max_message_len))

    # -- outbound -----------------------------------------------------------------------------
    @abc.abstractmethod
    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        """Send one message part as a reply to ``target``; return the platform message id.

        ``idempotency_key`` is stable across restarts for the same reply part; adapters whose
        platform deduplicates on a key (Discord nonce, Lark uuid) pass it on."""

    @abc.abstractmethod
    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        """Replace the content of a message the bot sent earlier."""

    def can_preview(self, target: ReplyTarget) -> bool:
        """Whether :meth:`preview` works for ``target`` (an ephemeral streamed draft)."""
        return False

    async def preview(self, target: ReplyTarget, key: str, part: Rendered) -> None:
        """Show the answer so far as an ephemeral draft that leaves nothing behind if we crash
        (Telegram's sendMessageDraft in private chats); only the final text becomes a message."""
        raise PermanentSendError(f"{self.name} has no draft previews")

    async def recover(self, target: ReplyTarget, idempotency_key: str) -> str | None:
        """Find a message an earlier process sent for ``idempotency_key`` but did not live to record
        (it crashed between the send and the outbox write); its id, or None when the platform
        offers no way to find it (Slack: message metadata carrying the key)."""
        return None

    async def typing(self, target: ReplyTarget) -> None:  # noqa: B027 - optional capability
        """Show a typing / working indicator, where the platform has one."""

    async def react(self, target: ReplyTarget, emoji: str) -> None:  # noqa: B027
        """Put a reaction on the user's message, where the platform has reactions."""

    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        """Send ``part`` with ``buttons`` under it (one row); return the message id. Only where
        ``capabilities.buttons``; the gateway falls back to text replies elsewhere."""
        raise PermanentSendError(f"{self.name} has no buttons")

    async def close_buttons(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        """Replace a :meth:`send_buttons` message with ``part`` and no buttons (the decision)."""
        await self.edit(target, message_id, part)

    async def register_commands(self, menu: Menu) -> str:
        """Publish ``menu`` as the platform's native command list; say in a few words what was
        published where (for the log), or ``""`` where the platform has no such list or the
        operator declares it (Slack's manifest). Optional capability: the default does nothing.

        Called by the gateway after each connect and when the list changes (gateway/daemon/menus.py);
        a failure is logged there and retried at the next connect, never fatal: typed commands
        work without a menu. Descriptions reach here masked of the daemon's secrets."""
        return ""

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        """Fetch an inbound attachment; raise :class:`PermanentSendError` if it exceeds ``limit``."""
        raise PermanentSendError(f"{self.name} does not support attachments")

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        """Upload a file produced by the agent into the conversation; return the message id.

        ``idempotency_key`` is stable across restarts for this file of this reply (see ``send``).
        The gateway has already checked ``file.size`` against ``capabilities.max_upload_bytes``."""
        raise PermanentSendError(f"{self.name} does not support sending files")

    async def thread_context(self, inbound: Inbound, limit: int, max_chars: int) -> Sequence[ContextItem]:
        """Earlier messages of the thread ``inbound`` was written in, oldest first, and the message
        it replies to: at most ``limit`` of them (newest kept); ``max_chars`` is what the gateway
        will keep of each text, for adapters that can ask for less. Never ``inbound`` itself nor
        anything posted after it (a resumed turn that fetches again sees the same).
        ``()`` when the message is in no thread and replies to nothing, or the platform has no
        such history. May raise any :class:`ChannelError`: the gateway answers without context."""
        return ()


guard_outbound(Channel)
