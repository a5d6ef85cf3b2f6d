"""An in-memory chat platform and an adapter for it that implements :class:`channels.base.Channel`.

Why a real implementation and not a mock: the gateway's delivery, supervision and resume code is
only tested if the channel behaves the way the contract says a platform adapter does (ids come
back from sends, editing a deleted message is a :class:`PermanentSendError`, an edit with the same
text is :class:`NotModified`, a platform that dedupes repeats returns the earlier message).

:class:`FakePlatform` is the service's side: every message with its text history, files with their
bytes, reactions, typing, draft previews. It outlives an adapter, so a test can simulate a crash by
handing the same platform to a new :class:`FakeChannel` (:meth:`FakeChannel.restarted`).

:class:`FakeChannel` records every call, and can on demand fail a call with any
:class:`ChannelError` (:meth:`~FakeChannel.fail`), hold calls until released
(:meth:`~FakeChannel.hold`), end or crash its connection (:meth:`~FakeChannel.drop`), or fail to
connect (``fail("run", ...)``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from channels.base import (
    Action,
    ActionAnswer,
    Attachment,
    Button,
    Capabilities,
    Channel,
    ChannelState,
    Inbound,
    InboundSink,
    NotModified,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
)
from channels.textsplit import split_markdown

_REPORTS = hasattr(Channel, "report_connected")
"""The adapter reports and the supervisor owns the state (the channels refactor); before it, an
adapter set its state itself. Transitional: goes once every adapter reports."""

Op = Literal["run", "send", "edit", "send_file", "preview", "recover", "typing", "react", "download"]
OPS: tuple[Op, ...] = (
    "run",
    "send",
    "edit",
    "send_file",
    "preview",
    "recover",
    "typing",
    "react",
    "download",
)


@dataclass
class Message:
    """A message the bot posted, as the platform holds it."""

    message_id: str
    target: ReplyTarget
    idempotency_key: str
    texts: list[str]
    """The text as sent, then after each edit."""
    file: OutFile | None = None
    deleted: bool = False
    buttons: list[Button] = field(default_factory=list)
    """The buttons under it now (:meth:`FakeChannel.send_buttons`; cleared by ``close_buttons``)."""
    offered: list[Button] = field(default_factory=list)
    """The buttons it was sent with (a stale client can still press them)."""

    @property
    def text(self) -> str:
        """What the chat shows now (a file's caption for a file)."""
        return self.texts[-1]


@dataclass(frozen=True, slots=True)
class Edit:
    message_id: str
    text: str
    at: float


@dataclass(frozen=True, slots=True)
class Preview:
    target: ReplyTarget
    key: str
    text: str


@dataclass
class FakePlatform:
    """The chat service: what every user would see, whichever adapter instance put it there."""

    messages: dict[str, Message] = field(default_factory=dict)
    edits: list[Edit] = field(default_factory=list)
    previews: list[Preview] = field(default_factory=list)
    reactions: list[tuple[ReplyTarget, str]] = field(default_factory=list)
    typing: list[ReplyTarget] = field(default_factory=list)
    uploads: dict[str, bytes] = field(default_factory=dict)
    """Users' files by attachment id, for :meth:`Channel.download`."""
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def post(self, target: ReplyTarget, text: str, key: str, file: OutFile | None = None) -> Message:
        mid = str(next(self._ids))
        msg = self.messages[mid] = Message(mid, target, key, [text], file)
        return msg

    def by_key(self, key: str) -> Message | None:
        """The first message sent with idempotency key ``key`` (a dedupe or a metadata search)."""
        return next((m for m in self.messages.values() if m.idempotency_key == key), None)

    def delete(self, message_id: str) -> None:
        """A user deletes a bot message: editing it fails from now on."""
        self.messages[message_id].deleted = True


class FakeChannel(Channel):
    """A :class:`Channel` over a :class:`FakePlatform`. ``caps`` override :class:`Capabilities`."""

    def __init__(
        self,
        name: str = "telegram",
        *,
        platform: FakePlatform | None = None,
        drafts: bool = False,
        strict_edits: bool = True,
        **caps: Any,
    ) -> None:
        super().__init__()
        self.name = name
        self.platform = platform or FakePlatform()
        self.capabilities = Capabilities(**{"max_message_len": 4096, "edit_interval": 0.0, **caps})
        self.drafts = drafts
        """:meth:`can_preview` for every target without a thread (Telegram's DMs)."""
        self.strict_edits = strict_edits
        """An edit to the text a message already shows raises :class:`NotModified`, as Telegram's."""
        self.calls: list[tuple[Op, float]] = []
        """Every call (op, monotonic time), including those that then failed or were held."""
        self.recovered: list[str] = []
        """Idempotency keys :meth:`recover` was asked about."""
        self.runs = self.disconnects = self.closes = 0
        self._failures: dict[Op, deque[Exception]] = {op: deque() for op in OPS}
        self._always: dict[Op, Exception] = {}
        self._holds: dict[Op, asyncio.Event] = {}
        self._held: dict[Op, int] = dict.fromkeys(OPS, 0)
        self._passes: dict[Op, int] = dict.fromkeys(OPS, 0)
        self._sink: InboundSink | None = None
        self._end: asyncio.Future[None] | None = None
        self._mids = itertools.count(1)

    def __repr__(self) -> str:
        return f"FakeChannel({self.name!r}, state={self.state.value})"

    def restarted(self) -> FakeChannel:
        """A new adapter for the same platform and settings (the next process after a crash)."""
        twin = FakeChannel(
            self.name, platform=self.platform, drafts=self.drafts, strict_edits=self.strict_edits
        )
        twin.capabilities = self.capabilities
        return twin

    # -- steering ----------------------------------------------------------------------------------
    def fail(self, op: Op, error: Exception, times: int | None = 1) -> None:
        """The next ``times`` calls of ``op`` raise ``error`` (every call until :meth:`heal` with
        ``times=None``). Queued failures are used up in order."""
        if times is None:
            self._always[op] = error
        else:
            self._failures[op].extend([error] * times)

    def heal(self, op: Op | None = None) -> None:
        """Forget the failures set for ``op`` (every op by default)."""
        for name in [op] if op else list(OPS):
            self._failures[name].clear()
            self._always.pop(name, None)

    def hold(self, op: Op, *, after: int = 0) -> None:
        """Calls of ``op`` wait (once recorded) until :meth:`release`; the next ``after`` calls
        still go through (e.g. hold the second file of a reply, not the first)."""
        self._holds.setdefault(op, asyncio.Event())
        self._passes[op] = after

    def release(self, op: Op) -> None:
        gate = self._holds.pop(op, None)
        if gate is not None:
            gate.set()

    def held(self, op: Op) -> int:
        """How many calls of ``op`` are waiting at a hold right now."""
        return self._held[op]

    def force_state(self, state: ChannelState, reason: str | None = None) -> None:
        """Write the channel's state as its supervisor would (a test playing the supervisor)."""
        status = getattr(self, "status", None)
        if status is not None:
            status.set(state, reason)
        else:
            self.set_state(state, reason)

    def attempts(self, op: Op) -> list[float]:
        """Monotonic times of every call of ``op``."""
        return [at for name, at in self.calls if name == op]

    async def _enter(self, op: Op) -> None:
        self.calls.append((op, time.monotonic()))
        gate = self._holds.get(op)
        if gate is not None and self._passes[op] > 0:
            self._passes[op] -= 1
        elif gate is not None:
            self._held[op] += 1
            try:
                await gate.wait()
            finally:
                self._held[op] -= 1
        if self._failures[op]:
            raise self._failures[op].popleft()
        if op in self._always:
            raise self._always[op]

    # -- inbound -----------------------------------------------------------------------------------
    def message(
        self,
        sender: int | str,
        text: str,
        *,
        chat: int | str | None = None,
        mid: str | None = None,
        direct: bool | None = None,
        addressed: bool | None = None,
        thread: str | None = None,
        attachments: Sequence[Attachment] = (),
        name: str = "",
        **fields: Any,
    ) -> Inbound:
        """A user's message to this channel; a DM unless ``chat`` names another chat. ``fields``
        sets any other :class:`Inbound` field (``unsupported``, ``extra``)."""
        is_direct = chat is None if direct is None else direct
        return Inbound(
            platform=self.name,
            chat_id=str(sender if chat is None else chat),
            message_id=mid or f"m{next(self._mids)}",
            sender_id=str(sender),
            text=text,
            is_direct=is_direct,
            addressed=is_direct if addressed is None else addressed,
            thread_id=thread,
            sender_name=name,
            attachments=tuple(attachments),
            **fields,
        )

    async def deliver(self, inbound: Inbound) -> None:
        """Hand ``inbound`` to the gateway as an adapter does; returns once it is journaled (when
        the adapter may acknowledge it to the platform)."""
        if self._sink is None:
            raise RuntimeError(f"{self.name} is not running")
        await self.hand_over(self._sink, inbound, ref="fake event")

    def drop(self, error: BaseException | None = None) -> None:
        """End the live connection: ``run`` raises ``error`` (returns when None)."""
        if self._end is not None and not self._end.done():
            if error is None:
                self._end.set_result(None)
            else:
                self._end.set_exception(error)

    # -- the Channel contract --------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        self.runs += 1
        await self._enter("run")
        self._end = asyncio.get_running_loop().create_future()
        self._sink = sink
        if _REPORTS:
            self.report_connected()  # type: ignore[attr-defined]
        else:
            self.set_state(ChannelState.CONNECTED)
        try:
            await self._end
        finally:
            self._sink = None

    async def disconnect(self) -> None:
        """Only the inbound side: sends keep working across a restart, like the real adapters."""
        self.disconnects += 1
        self.drop()

    async def close(self) -> None:
        self.closes += 1
        self.drop()

    def render(self, markdown: str) -> Sequence[Rendered]:
        parts = split_markdown(markdown, self.capabilities.max_message_len)
        return [Rendered(text=p) for p in parts] or [Rendered(text=markdown)]

    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        await self._enter("send")
        if self.capabilities.dedupes_sends and (earlier := self.platform.by_key(idempotency_key)):
            return earlier.message_id
        return self.platform.post(target, part.text, idempotency_key).message_id

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        await self._enter("edit")
        msg = self.platform.messages.get(message_id)
        if msg is None or msg.deleted:
            raise PermanentSendError(f"message {message_id} to edit not found")
        if self.strict_edits and msg.text == part.text:
            raise NotModified("message is not modified")
        msg.texts.append(part.text)
        self.platform.edits.append(Edit(message_id, part.text, time.monotonic()))

    def can_preview(self, target: ReplyTarget) -> bool:
        return self.drafts and target.thread_id is None

    async def preview(self, target: ReplyTarget, key: str, part: Rendered) -> None:
        await self._enter("preview")
        if not self.can_preview(target):
            raise PermanentSendError(f"{self.name} has no draft previews here")
        self.platform.previews.append(Preview(target, key, part.text))

    async def recover(self, target: ReplyTarget, idempotency_key: str) -> str | None:
        await self._enter("recover")
        self.recovered.append(idempotency_key)
        if not self.capabilities.finds_orphans:
            return None
        found = self.platform.by_key(idempotency_key)
        return found.message_id if found else None

    async def typing(self, target: ReplyTarget) -> None:
        await self._enter("typing")
        self.platform.typing.append(target)

    async def react(self, target: ReplyTarget, emoji: str) -> None:
        await self._enter("react")
        self.platform.reactions.append((target, emoji))

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        await self._enter("download")
        data = self.platform.uploads.get(attachment.file_id)
        if data is None:
            raise PermanentSendError(f"file {attachment.file_id} is gone")
        if len(data) > limit:
            raise PermanentSendError(f"file is {len(data)} bytes, over {limit}")
        return data

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        await self._enter("send_file")
        if self.capabilities.dedupes_sends and (earlier := self.platform.by_key(idempotency_key)):
            return earlier.message_id
        return self.platform.post(target, caption, idempotency_key, file).message_id

    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        if not self.capabilities.buttons:
            raise PermanentSendError(f"{self.name} has no buttons")
        message_id = await self.send(target, part, idempotency_key=idempotency_key)
        self.platform.messages[message_id].buttons = list(buttons)
        self.platform.messages[message_id].offered = list(buttons)
        return message_id

    async def close_buttons(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        await self.edit(target, message_id, part)
        self.platform.messages[message_id].buttons = []

    async def press(self, message_id: str, label: str, user: int | str, name: str = "") -> ActionAnswer:
        """``user`` presses the button labelled ``label`` (its start) under ``message_id``."""
        msg = self.platform.messages[message_id]
        button = next(b for b in msg.offered if label in b.label)
        action = Action(self.name, msg.target.chat_id, str(user), button.value, message_id, name)
        return await self.hand_action(action)

    # -- what the users see ------------------------------------------------------------------------
    @property
    def sent(self) -> list[Message]:
        """Every message posted (texts and files), in order."""
        return list(self.platform.messages.values())

    @property
    def files(self) -> list[Message]:
        return [m for m in self.sent if m.file is not None]

    @property
    def edits(self) -> list[Edit]:
        return self.platform.edits

    def in_chat(self, chat_id: str) -> list[str]:
        """Current texts of the text messages the bot sent into ``chat_id``, in order."""
        return [m.text for m in self.sent if m.target.chat_id == chat_id and m.file is None]

    def replies_to(self, message_id: str) -> list[str]:
        """Current texts of the text messages replying to the user's ``message_id``."""
        return [m.text for m in self.sent if m.target.reply_to == message_id and m.file is None]
