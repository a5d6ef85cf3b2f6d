"""Files crossing between the chat and the agent: users' attachments in, presented files out.

A user's images and recordings are saved like any file, and also kept for the turn: images for a
model that takes them, recordings for the transcriber (docs/media.md).

Neither side ever handles a host path here: uploads go through ``AgentHarness.save_upload`` and
presented files come back as bytes from ``AgentHarness.read_output``, both symlink-safe on the
agent's side (docs/security.md). Outgoing files are delivered like text: paced, recorded in the
outbox, sent once (docs/durability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.untrusted import TEXT_CHARS, code_span, file_name
from channels.base import Channel, ChannelError, OutFile, PermanentSendError
from gateway.agent_api import AgentHarness
from gateway.delivery.reply import Reply
from gateway.intake import media
from gateway.intake.transcribe import SHOWN_CHARS, Heard, heard
from gateway.store.entries import JournalEntry
from gateway.store.journal import Store

if TYPE_CHECKING:
    from gateway.intake.host import IntakeHost

log = logging.getLogger(__name__)

FILE_PART = 10_000
"""Outbox part numbers of files a reply carries start here (text parts count from 0)."""
FILE_NOTE_PART = 20_000
"""Outbox part of the note saying which presented files could not be sent."""
DOWNLOAD_SECONDS = 120.0
"""Time one attachment's download may take; a stalled file server gets a note, not the turn."""


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "file"
    return cleaned[:120]


REASON_CHARS = 200
"""At most this much of a platform's or a store's reason is shown."""


def _reason(exc: BaseException, name: str) -> str:
    """Why a file failed, as the chat shows it. An adapter's error text may carry the platform's
    own words (a Bad Request description, a media server's message), text nobody here wrote: it is
    shown as one bounded code span, so a ``[verify](https://…)`` in it is no link in the bot's voice,
    ``@everyone`` pings nobody and a bidi override reorders nothing. Secrets in it are masked by
    value on the way out like every outbound text (``Channel.egress``)."""
    return code_span(str(exc).replace(name, "that file"), REASON_CHARS, empty=type(exc).__name__)


def _shown(name: str) -> str:
    """A file name as the chat shows it: inline code, so a name like ``[Verify your account](https://…)``
    is not posted as a link (or other Markdown) in the bot's voice; bounded, and without the
    bidi overrides that make ``invoice\u202etxt.exe`` read as a text file (agent/untrusted.py)."""
    return code_span(name, TEXT_CHARS, empty="a file")


@dataclass
class Uploads:
    """A message's files once fetched: where the agent sees them, the images and recordings among
    them (bytes kept for this turn only), what the recordings said, and notes for the user."""

    files: list[str] = field(default_factory=list)
    """Paths as the agent sees them (its uploads)."""
    notes: list[str] = field(default_factory=list)
    """Shown to the user above the answer (skipped files, voice notes not heard, "🎙 heard: …")."""
    images: list[media.Received] = field(default_factory=list)
    """Images the turn's model may be shown (gateway/intake/media.py decides, per model)."""
    heard: list[Heard] = field(default_factory=list)
    """What each voice note or audio file said (or why it could not be heard)."""

    def message(self, text: str) -> str:
        """The user's text as the agent gets it: with what their recordings said, marked as
        transcribed so the agent can quote it back when asked what it heard."""
        parts = [text.strip()] if text.strip() else []
        for h in self.heard:
            if h.text:
                parts.append(
                    f"[Voice note {h.name}, transcribed automatically; quote it if the user asks what "
                    f"you heard]\n{h.text}"
                )
            else:
                parts.append(
                    f"[Voice note {h.name}: not transcribed ({h.problem}); the recording is in your uploads]"
                )
        return "\n\n".join(parts) or "(the user sent files without a message)"


async def fetch_attachments(
    gateway: IntakeHost, channel: Channel, entry: JournalEntry, thread_id: str
) -> Uploads:
    """Save the message's files where the thread's sandbox sees them (its uploads dir), keep the
    images for the model and transcribe the recordings (gateway/intake/media.py,
    gateway/intake/transcribe.py).
    Files that are refused or fail get a note for the user; nothing here fails the turn."""
    out = Uploads()
    if not entry.inbound.attachments:
        return out
    # Downloads and transcription wait on other services: the turn's global slot is given back
    # meanwhile, so a stalled transcriber or file server never delays other users' turns.
    async with gateway.turns.released():
        await _fetch_all(gateway, channel, entry, thread_id, out)
    return out


async def _fetch_all(
    gateway: IntakeHost, channel: Channel, entry: JournalEntry, thread_id: str, out: Uploads
) -> None:
    inbound = entry.inbound
    limit = gateway.config.limits.max_attachment_bytes
    for index, att in enumerate(inbound.attachments):
        if att.size is not None and att.size > limit:
            out.notes.append(
                f"⚠️ I skipped {_shown(att.name)}: it is {att.size / 1e6:.1f} MB, "
                f"over my {limit / 1e6:.0f} MB limit."
            )
            continue
        try:
            async with asyncio.timeout(DOWNLOAD_SECONDS):
                data = await channel.download(att, limit)
        except TimeoutError:
            out.notes.append(
                f"⚠️ I could not fetch {_shown(att.name)}: the download did not finish within "
                f"{DOWNLOAD_SECONDS:.0f} s. Please send it again."
            )
            continue
        except ChannelError as exc:
            out.notes.append(f"⚠️ I could not fetch {_shown(att.name)}: {_reason(exc, att.name)}")
            continue
        try:
            path = await _save_once(gateway, entry, index, thread_id, _safe_name(att.name), data)
        except Exception as exc:  # quota, disk full, a refused name: the text is safe to show
            log.warning("could not store upload %s for %s: %s", att.name, inbound.key, exc)
            out.notes.append(f"⚠️ I could not store {_shown(att.name)}: {_reason(exc, att.name)}")
            continue
        out.files.append(path)
        kind = media.kind_of(att)
        name = path.rsplit("/", 1)[-1]
        if kind == media.IMAGE:
            out.images.append(media.Received(name, path, data))
        elif kind in (media.VOICE, media.AUDIO):
            await _listen(gateway, entry, out, index, name, data, att.mime_type)


async def _save_once(
    gateway: IntakeHost, entry: JournalEntry, index: int, thread_id: str, name: str, data: bytes
) -> str:
    """Save the ``index``-th attachment of ``entry`` in the thread's uploads, once: the path is
    recorded under the journal key, so a turn run again (a crash, a retry) finds the file it saved
    before instead of storing ``name-2`` beside it, and gives the agent the same message."""
    key = f"{entry.key}#upload:{index}"
    with contextlib.suppress(Exception):  # unreadable record: save anew
        kept = await gateway.store.command_result(key)
        if kept is not None and json.loads(kept).get("thread") == thread_id:
            return str(json.loads(kept)["path"])
    path = await gateway.harness.save_upload(thread_id, name, data)
    try:
        await gateway.store.command_result_put(key, json.dumps({"thread": thread_id, "path": path}))
    except Exception as exc:  # a full disk: the file is saved, a rerun would save it again
        log.warning("could not record upload %s of %s: %s", name, entry.key, exc)
    return path


async def _listen(
    gateway: IntakeHost,
    entry: JournalEntry,
    out: Uploads,
    index: int,
    name: str,
    data: bytes,
    mime: str | None,
) -> None:
    """Transcribe one recording (the ``index``-th attachment) into ``out.heard``, with the note the
    user gets about it."""
    cfg = gateway.config.transcription
    if not cfg.configured:
        out.heard.append(Heard(name, problem="no transcription service is configured"))
        out.notes.append(
            f"🎙 I cannot listen to voice notes here: no transcription service is configured (the "
            f"admin can set one up, see docs/media.md). The agent has {name} as a file."
        )
        return
    user = f"{entry.inbound.platform}:{entry.inbound.sender_id}"
    async with gateway.slow_lane.slot(user):  # a fair share of the transcriber, per user
        result = await heard(
            gateway.store, cfg, entry.key, index, name, data, mime, gateway.config.limits.max_message_chars
        )
    out.heard.append(result)
    if result.problem:
        out.notes.append(f"⚠️ I could not transcribe {name}: {result.problem}. The agent has it as a file.")
    elif cfg.show_transcript:
        # What the transcriber says someone said is text others chose (a recording of a page
        # read aloud, a hostile transcriber): one code span, bounded, no links or mentions.
        out.notes.append(f"🎙 heard: {code_span(result.text, SHOWN_CHARS, empty='(nothing)')}")


async def deliver_files(harness: AgentHarness, store: Store, reply: Reply, key: str, thread_id: str) -> None:
    """Send the files the agent presented for journal entry ``key``, each once (the outbox
    remembers which went out), opened at this moment through the agent's safe reader. A file that
    cannot be sent (gone, a link, too big) is named in one note instead of failing the turn."""
    presented = await store.files_get(key)
    if not presented:
        return
    limit = reply.channel.capabilities.max_upload_bytes
    problems: list[str] = []
    for i, (path, caption) in enumerate(presented):
        if reply.sent(FILE_PART + i):
            continue
        name = path.rsplit("/", 1)[-1]
        try:
            out = await harness.read_output(thread_id, path, limit)
        except Exception as exc:  # the agent's file errors name the virtual path only
            log.warning("presented file %s of %s not sent: %s", path, key, exc)
            problems.append(f"{_shown(name)}: {_reason(exc, path)}")  # the name is shown once
            continue
        # The name the chat shows as the file's: no bidi overrides or zero-width characters (what
        # it really is must read at its end), bounded with its extension kept (agent/untrusted.py).
        try:
            await reply.send_file(FILE_PART + i, OutFile(file_name(out.name), out.data), caption)
        except PermanentSendError as exc:  # the platform refused this file: say which and why
            log.warning("presented file %s of %s refused by %s: %s", path, key, reply.channel.name, exc)
            problems.append(f"{_shown(name)}: {_reason(exc, out.name)}")
    if problems and not reply.sent(FILE_NOTE_PART):
        await reply.note(FILE_NOTE_PART, "⚠️ I could not send " + "; ".join(problems))
