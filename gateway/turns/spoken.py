"""Spoken replies: after the text answer went out, the same answer as a voice message
(docs/speech.md).

Whether an answer is spoken: a ``speech:`` section is configured, the conversation chose ``/voice
all``, or ``/voice on`` and the message answered carried a voice note or audio recording, and the
turn ended with an answer (not an error, a stop or a timeout). The text is always sent first and
never waits for, or depends on, the audio.

The audio is one more part of the reply's outbox (:data:`VOICE_PART`), sent through
``Reply.send_file`` like the agent's files: a turn resumed after a crash finds it recorded and
sends nothing again; one killed before the part was recorded speaks again. Telegram and Lark get
an OGG/Opus voice (audio) message (``OutFile.voice``); Slack and Discord an audio file of
``speech.file_format``.

A failure (the service, its answer, the platform refusing the upload) costs the audio only: a
short note (:data:`VOICE_NOTE_PART`) says why in words from :mod:`gateway.delivery.speech`.
Synthesis runs outside the turn slots (the answer is out; a slow speech service must not hold
other users' turns), at most ``speech.concurrency`` at once over the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from channels.base import ChannelError, OutFile, PermanentSendError
from gateway.delivery.speech import SUFFIX, Format, SpeechFailed, holds_secret, speakable, synthesize
from gateway.intake import media
from gateway.intake.access import is_admin
from gateway.turns.usage import budget_refusal

if TYPE_CHECKING:
    from agent.redact import Redactor
    from gateway.config.schema import Config
    from gateway.delivery.reply import Reply
    from gateway.ops.metrics import Metrics
    from gateway.store.entries import JournalEntry
    from gateway.store.journal import Store
    from gateway.turns.queue import TurnQueue

log = logging.getLogger(__name__)

VOICE_PART = 40_000
"""Outbox part of the spoken answer (text 0.., files 10,000+, plan 20,000, after-answer note 30,000)."""
VOICE_NOTE_PART = 40_001
"""Outbox part of the note saying the answer could not be spoken."""
NATIVE_VOICE = frozenset({"telegram", "lark"})
"""Platforms whose adapter sends ``OutFile(voice=True)`` (OGG/Opus) as a voice message: Telegram's
``sendVoice``, Lark's ``audio`` message. Slack and Discord get an audio file."""


def recorded(entry: JournalEntry) -> bool:
    """Whether the message answered carried a voice note or audio recording."""
    return any(media.kind_of(att) in (media.VOICE, media.AUDIO) for att in entry.inbound.attachments)


STOPPED = "the spoken version was stopped"
"""What :meth:`Speaker._speak` returns when the user's /stop cut the spoken version."""


class Speaker:
    """Speaks answers for the turns of one daemon (see the module docstring)."""

    def __init__(
        self, config: Config, store: Store, redact: Redactor, turns: TurnQueue | None = None
    ) -> None:
        self.config, self.cfg = config, config.speech
        self._store, self._redact, self._turns = store, redact, turns
        self._slots = asyncio.Semaphore(self.cfg.concurrency)
        self._spoken: dict[str, int] = {}
        """Characters spoken today per user (``daily_chars_per_user``); the day is ``_day``."""
        self._day = ""
        self.usage_settled: Callable[[], Awaitable[None]] | None = None
        """Waits until the model calls recorded so far are written (the daemon's usage recorder):
        the budget is read after this turn's own calls count."""

    async def wanted(self, entry: JournalEntry) -> bool:
        """Whether this entry's answer is to be spoken (one read, only with speech configured)."""
        if not self.cfg.configured:
            return False
        mode = await self._store.voice_mode(entry.conversation)
        return mode == "all" or (mode == "on" and recorded(entry))

    async def deliver(
        self, reply: Reply, entry: JournalEntry, answer: str, metrics: Metrics | None = None
    ) -> None:
        """Speak ``answer`` into ``reply`` once, if the conversation wants it; never raises but
        for cancellation (the text answer is out whatever happens here)."""
        if reply.sent(VOICE_PART) or reply.sent(VOICE_NOTE_PART):
            return
        try:
            if not await self.wanted(entry):
                return
        except Exception as exc:  # the database: no audio this time, the answer stands
            log.warning("could not read the voice mode for %s: %s", entry.key, exc)
            return
        try:
            problem = await self._over_budget(entry) or await self._speak(reply, entry, answer)
        except Exception as exc:  # a bug of ours must not cost the answer its done mark
            log.error("speaking %s failed: %s", entry.key, exc, exc_info=True)
            problem = "something went wrong on my side"
        if metrics is not None:
            metrics.speech.labels(
                "stopped" if problem == STOPPED else "failed" if problem else "spoken"
            ).inc()
        if problem == STOPPED:
            with contextlib.suppress(Exception):
                await reply.note(VOICE_NOTE_PART, f"({STOPPED})")
        elif problem:
            with contextlib.suppress(Exception):
                await reply.note(VOICE_NOTE_PART, f"(couldn't speak this answer: {problem})")

    async def _over_budget(self, entry: JournalEntry) -> str:
        """Speech is paid for too: a user whose daily budget (tokens or money) this very answer
        used up gets the text without audio. Speech itself is priced per character, not in
        tokens, so it is bounded per answer (``max_chars``), not added to the token ledger."""
        inbound = entry.inbound
        admin = is_admin(self.config.access_for(inbound.platform), inbound)
        try:
            if self.usage_settled is not None:
                await self.usage_settled()
            spent = await budget_refusal(self._store, self.config, inbound.user, admin)
        except Exception as exc:  # a budget that cannot be read fails closed, as at every model call
            log.warning("could not check the budget before speaking %s: %s", entry.key, exc)
            return "I could not check your daily budget just now"
        return "your daily budget is used up" if spent else ""

    def _allowance(self, entry: JournalEntry, chars: int) -> bool:
        """Whether ``entry``'s user may have ``chars`` more characters spoken today; if so they
        are counted now, before the call (the service charges for a call whose audio is lost)."""
        limit, inbound = self.cfg.daily_chars_per_user, entry.inbound
        if not limit or is_admin(self.config.access_for(inbound.platform), inbound):
            return True
        day = self.config.usage.today().isoformat()
        if day != self._day:
            self._day, self._spoken = day, {}
        used = self._spoken.get(inbound.user, 0)
        if used + chars > limit:
            log.info("speech: %s is over the daily %d characters", inbound.user, limit)
            return False
        self._spoken[inbound.user] = used + chars
        return True

    async def _synthesized(self, text: str, fmt: Format) -> bytes:
        async with self._slots:
            return await synthesize(self.cfg, text, fmt)

    async def _speak(self, reply: Reply, entry: JournalEntry, answer: str) -> str:
        """Synthesise and send; the reason it failed, or "" when the voice went out."""
        text = speakable(answer, self._redact, self.cfg.max_chars)
        if not text.strip():
            return "there is no text in it to read out"
        if holds_secret(text, self._redact.secrets):
            log.warning("answer %s not spoken: it spells out one of the daemon's secrets", entry.key)
            return "it holds something secret, written in pieces, that I must not read out"
        if not self._allowance(entry, len(text)):
            return (
                f"you have had {self.cfg.daily_chars_per_user:,} characters spoken today, the most "
                "this bot allows; the text still comes, and voice is back tomorrow"
            )
        native = reply.channel.name in NATIVE_VOICE
        fmt: Format = "opus" if native else self.cfg.file_format
        released = self._turns.released() if self._turns is not None else contextlib.nullcontext()
        try:
            async with released:
                # A task of its own, so the user's /stop can cut it (the turn's answer is out and
                # the turn itself no longer stoppable); waiting for a slot counts as making it.
                making = asyncio.ensure_future(self._synthesized(text, fmt))
                cut = self._turns.cuttable(entry.key, making) if self._turns else contextlib.nullcontext()
                with cut:
                    try:
                        data = await making
                    except asyncio.CancelledError:
                        me = asyncio.current_task()
                        if making.cancelled() and (me is None or not me.cancelling()):
                            log.info("answer %s: its spoken version stopped by /stop", entry.key)
                            return STOPPED
                        raise
        except SpeechFailed as exc:
            log.warning("answer %s not spoken: %s", entry.key, exc)
            return str(exc)
        limit = reply.channel.capabilities.max_upload_bytes
        if len(data) > limit:
            return f"the audio is {len(data) / 1e6:.1f} MB, more than this chat takes"
        out = OutFile(f"answer{SUFFIX[fmt]}", data, voice=native)
        try:
            await reply.send_file(VOICE_PART, out, "" if native else "🔊 spoken version of the answer above")
        except PermanentSendError as exc:
            log.warning("voice of %s refused: %s", entry.key, exc)
            return "the chat refused the audio message"
        except ChannelError as exc:  # a network or server problem on the chat's side
            log.warning("voice of %s not sent: %s", entry.key, exc)
            return "the chat app could not take the audio message just now"
        return ""
