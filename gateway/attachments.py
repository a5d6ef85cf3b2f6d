"""Files crossing between the chat and the agent: users' attachments in, presented files out.

Neither side ever handles a host path here: uploads go through ``AgentHarness.save_upload`` and
presented files come back as bytes from ``AgentHarness.read_output``, both symlink-safe on the
agent's side (docs/security.md). Outgoing files are delivered like text: paced, recorded in the
outbox, sent once (docs/durability.md).
"""

from __future__ import annotations

import logging
import re

from channels.base import Channel, ChannelError, Inbound, OutFile

from .agent_api import AgentHarness
from .delivery import Reply
from .store import Store

log = logging.getLogger(__name__)

FILE_PART = 10_000
"""Outbox part numbers of files a reply carries start here (text parts count from 0)."""
FILE_NOTE_PART = 20_000
"""Outbox part of the note saying which presented files could not be sent."""


def _safe_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "file"
    return cleaned[:120]


async def fetch_attachments(
    harness: AgentHarness, channel: Channel, inbound: Inbound, thread_id: str, limit: int
) -> tuple[list[str], list[str]]:
    """Save the message's files where the thread's sandbox sees them (its uploads dir); returns
    the paths as the agent sees them, and notes for the user about files that were refused."""
    if not inbound.attachments:
        return [], []
    files: list[str] = []
    notes: list[str] = []
    for att in inbound.attachments:
        if att.size is not None and att.size > limit:
            notes.append(
                f"⚠️ I skipped {att.name}: it is {att.size / 1e6:.1f} MB, over my {limit / 1e6:.0f} MB limit."
            )
            continue
        try:
            data = await channel.download(att, limit)
        except ChannelError as exc:
            notes.append(f"⚠️ I could not fetch {att.name}: {exc}")
            continue
        try:
            files.append(await harness.save_upload(thread_id, _safe_name(att.name), data))
        except Exception as exc:  # quota, disk full, a refused name: the text is safe to show
            log.warning("could not store upload %s for %s: %s", att.name, inbound.key, exc)
            notes.append(f"⚠️ I could not store {att.name}: {exc}")
    return files, notes


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
            problems.append(f"{name}: {exc}")
            continue
        await reply.send_file(FILE_PART + i, OutFile(out.name, out.data), caption)
    if problems and not reply.sent(FILE_NOTE_PART):
        await reply.note(FILE_NOTE_PART, "⚠️ I could not send " + "; ".join(problems))
