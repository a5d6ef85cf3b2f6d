"""The web chat channel: what a person types on the console's chat page goes to the gateway like a
message from any chat app, and what the gateway sends lands in the chat's :class:`Room`, which the
page reads (docs/console.md, "Web chat").

The console (gateway/console/chat.py) is this channel's "platform": it checks the session and the
CSRF token, then calls :meth:`WebChannel.post` and :meth:`WebChannel.press`. Everything after that
is the adapter contract every channel keeps: the message is journaled before the page is told it
was taken, one reply thread per message (sends carry the gateway's idempotency key, and a repeated
key returns the first message), buttons come back as :class:`~channels.base.Action` values.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from channels.base import (
    Action,
    ActionAnswer,
    Attachment,
    Button,
    Capabilities,
    Channel,
    FatalChannelError,
    Inbound,
    InboundSink,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    TransientSendError,
)
from channels.textsplit import split_markdown
from channels.web.room import FileRef, Room

MAX_LEN = 8000
"""Characters of one bot message on the page (a longer answer is split like on any platform)."""
PERSON = re.compile(r"[a-z0-9_-]{1,32}")
"""A console person's name, as it appears in their chat ids and their sender id."""
CHAT_ID = re.compile(r"([a-z0-9_-]{1,32})~[0-9a-f]{12}")
"""``<person>~<12 hex>``: the person owns the chat; the hex makes it unguessable and unique."""
NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
"""A message's id as the page makes it (one per form): a retried or double-clicked post repeats
it, and the journal takes a message id once."""
MAX_NAME = 200
"""A file name is cut to this many characters."""


def new_chat_id(person: str) -> str:
    if not PERSON.fullmatch(person):
        raise ValueError("not a console person's name")
    return f"{person}~{secrets.token_hex(6)}"


def owner_of(chat_id: str) -> str | None:
    """The person a chat id belongs to, or None when it is not a web chat id at all."""
    m = CHAT_ID.fullmatch(chat_id)
    return m.group(1) if m else None


def in_bytes(size: int) -> str:
    """``10 MB``, ``64 KB``: a limit as a person reads it."""
    for unit, scale in (("MB", 1024 * 1024), ("KB", 1024)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def file_name(raw: str) -> str:
    """A name a person's browser gave a file, made harmless to store and show: the last path part
    only, control and format characters dropped, cut; never empty."""
    name = raw.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C").strip().lstrip(".")
    return name[:MAX_NAME] or "file"


def mime_type(raw: str) -> str:
    """A MIME type a person's browser gave a file, kept only when it is printable ASCII (a header
    of bytes that are not UTF-8 reads as lone surrogates, which neither database can store: the
    post was a 500), cut; else none (the gateway guesses from the name)."""
    mime = raw.strip()[:100]
    return mime if mime.isascii() and mime.isprintable() else ""


@dataclass(frozen=True, slots=True)
class Upload:
    """A file as the console received it from the page."""

    name: str
    mime: str
    data: bytes


class Refused(Exception):
    """The page's request cannot be taken as it is; the text says why, for the person."""


class Bell:
    """Wakes every open page of this daemon at once when a chat changed here (pages also look in the
    database every ``poll_seconds`` for what another daemon wrote)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def ring(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seconds: float) -> None:
        event = self._event
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()


class WebChannel(Channel):
    name = "web"

    def __init__(
        self,
        max_file_bytes: int = 10 * 1024 * 1024,
        max_files: int = 5,
        max_text_chars: int = 20_000,
        poll_seconds: float = 0.5,
        max_streams: int = 16,
        keep_days: float = 30.0,
        room: Room | None = None,
    ) -> None:
        super().__init__()
        self.capabilities = Capabilities(
            max_message_len=MAX_LEN,
            edit_interval=0.3,
            max_upload_bytes=max_file_bytes,
            buttons=True,
            dedupes_sends=True,
        )
        self.max_files = max_files
        self.max_text_chars = max_text_chars
        self.poll_seconds = poll_seconds
        self.max_streams = max_streams
        self.keep_days = keep_days
        """Read by the daemon's prune (gateway/store/retention.py), not here."""
        self.room = room
        self.bell = Bell()
        self._sink: InboundSink | None = None

    def _room(self) -> Room:
        if self.room is None:
            raise FatalChannelError("web chat has no database (the gateway did not give it one)")
        return self.room

    # -- lifecycle ------------------------------------------------------------------------------
    async def run(self, sink: InboundSink) -> None:
        """Nothing to connect to: the channel takes messages while this runs."""
        self._room()
        self._sink = sink
        self.report_connected()
        try:
            await asyncio.Event().wait()
        finally:
            self._sink = None
            self.bell.ring()  # open pages' streams end now, before the daemon closes the database

    @property
    def taking(self) -> bool:
        """Whether the channel runs (between start and stop): an open page's stream ends when it
        stops, so it never reads a database the stopping daemon is closing."""
        return self._sink is not None

    # -- from the page --------------------------------------------------------------------------
    async def post(self, chat_id: str, person: str, nonce: str, text: str, uploads: Sequence[Upload]) -> str:
        """Take a person's message: its files and the message go into the room, then the gateway
        journals it. Returns the message id. Raises :class:`Refused` (the person reads why) or a
        :class:`~channels.base.ChannelError` when the gateway cannot take it now (send it again:
        the same nonce is the same message)."""
        if owner_of(chat_id) != person:
            raise Refused("That chat is not yours.")
        if not NONCE.fullmatch(nonce):
            raise Refused("The form is out of date: reload the page.")
        text = text.replace("\r\n", "\n").strip()
        if len(text) > self.max_text_chars:
            cap = self.max_text_chars
            raise Refused(f"That message is too long ({len(text):,} characters; at most {cap:,}).")
        if len(uploads) > self.max_files:
            raise Refused(f"At most {self.max_files} files per message.")
        limit = self.capabilities.max_upload_bytes
        for upload in uploads:
            if len(upload.data) > limit:
                raise Refused(f"{file_name(upload.name)} is larger than {in_bytes(limit)}.")
        if not text and not uploads:
            raise Refused("Type a message or choose a file.")
        sink = self._sink
        if sink is None:
            raise TransientSendError("the web chat is not running (the daemon is starting or stopping)")
        room = self._room()
        msg_id = f"u-{nonce}"
        attachments, refs = [], []
        for i, upload in enumerate(uploads):
            file_id = f"{nonce}-{i}"  # the same post again stores the same files again, in place
            name, mime = file_name(upload.name), mime_type(upload.mime)
            await room.web_file_put(chat_id, file_id, name, mime, upload.data)
            size = len(upload.data)
            attachments.append(Attachment(f"{chat_id}:{file_id}", name, mime or None, size))
            refs.append(FileRef(file_id, name, size))
        await room.web_add(chat_id, person, msg_id, "user", person, text, files=tuple(refs))
        stored = await room.web_message(chat_id, msg_id)
        if stored is None:
            # The nonce is another chat's message (ids are unique across chats): journaled here it
            # would be answered in a chat whose page never shows it. (Its files stay unlisted
            # until the prune.)
            raise Refused("The form is out of date: reload the page.")
        self.bell.ring()
        # A retry after a 503 (stored, not journaled) may carry other text or files under the same
        # nonce; the room kept the first try's, so that is what the gateway gets: the page shows
        # exactly the message the agent answers.
        mimes = {a.file_id: a.mime_type for a in attachments}
        inbound = Inbound(
            platform=self.name,
            chat_id=chat_id,
            message_id=msg_id,
            sender_id=person,
            text=stored.text,
            is_direct=True,
            addressed=True,
            sender_name=person,
            attachments=tuple(
                Attachment(f"{chat_id}:{f.file_id}", f.name, mimes.get(f"{chat_id}:{f.file_id}"), f.size)
                for f in stored.files
            ),
        )
        await self.hand_over(sink, inbound, ref=f"message {msg_id}")
        return msg_id

    async def press(self, chat_id: str, person: str, msg_id: str, value: str) -> ActionAnswer:
        """A button on the page was pressed: only a button this chat's message really carries."""
        if owner_of(chat_id) != person:
            raise Refused("That chat is not yours.")
        message = await self._room().web_message(chat_id, msg_id)
        if message is None or not any(b.value == value for b in message.buttons):
            return ActionAnswer("That button is no longer there.", refused=True)
        action = Action(self.name, chat_id, person, value, message_id=msg_id, sender_name=person)
        return await self.hand_action(action)

    # -- to the page ----------------------------------------------------------------------------
    def render(self, markdown: str) -> Sequence[Rendered]:
        parts = split_markdown(markdown, MAX_LEN) or [markdown.strip()[:MAX_LEN] or "…"]
        return [Rendered(text=p) for p in parts]

    async def _add(
        self,
        target: ReplyTarget,
        text: str,
        key: str,
        *,
        buttons: tuple[Button, ...] = (),
        files: tuple[FileRef, ...] = (),
    ) -> str:
        owner = owner_of(target.chat_id)
        if owner is None:
            raise PermanentSendError("not a web chat id")
        msg_id = await self._room().web_add(
            target.chat_id, owner, f"b-{secrets.token_hex(8)}", "bot", "", text,
            buttons=buttons, files=files, send_key=key,
        )  # fmt: skip
        self.bell.ring()
        return msg_id

    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        return await self._add(target, part.text, idempotency_key)

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        if not await self._room().web_edit(target.chat_id, message_id, part.text, None):
            raise PermanentSendError("that message is not in this chat")
        self.bell.ring()

    async def send_buttons(
        self, target: ReplyTarget, part: Rendered, buttons: Sequence[Button], *, idempotency_key: str
    ) -> str:
        return await self._add(target, part.text, idempotency_key, buttons=tuple(buttons))

    async def close_buttons(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        if not await self._room().web_edit(target.chat_id, message_id, part.text, ()):
            raise PermanentSendError("that message is not in this chat")
        self.bell.ring()

    async def recover(self, target: ReplyTarget, idempotency_key: str) -> str | None:
        return await self._room().web_by_key(idempotency_key)

    async def send_file(
        self, target: ReplyTarget, file: OutFile, caption: str = "", *, idempotency_key: str
    ) -> str:
        found = await self.recover(target, idempotency_key)
        if found is not None:
            return found
        file_id = secrets.token_urlsafe(18)
        name = file_name(file.name)
        await self._room().web_file_put(target.chat_id, file_id, name, "", file.data)
        ref = FileRef(file_id, name, file.size)
        return await self._add(target, caption, idempotency_key, files=(ref,))

    async def download(self, attachment: Attachment, limit: int) -> bytes:
        chat_id, _, file_id = attachment.file_id.partition(":")
        found = await self._room().web_file_get(chat_id, file_id)
        if found is None:
            raise PermanentSendError("that file is no longer in the chat")
        if len(found.data) > limit:
            raise PermanentSendError(f"the file is larger than {limit} bytes")
        return found.data
