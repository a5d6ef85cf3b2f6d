"""The sections of config.yaml below the top level (``storage``, ``access``, ``usage``, ...): one
pydantic model each. Apart from :mod:`gateway.config.schema` (the top-level ``Config``, the
``channels`` section made from the platforms' settings, and the loading and its errors) so each
file stays readable; the lower layers (store, turns) import the section they use from here.
"""

from __future__ import annotations

import os
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)


class Strict(BaseModel):
    """A config section: an unknown key is an error (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid")


def _id_as_str(value: Any) -> Any:
    """Platform ids are strings, but YAML reads ``allow_users: [123456]`` as a number: take it as the
    id the operator meant instead of refusing the file (bools are not ids and stay refused)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


PlatformId = Annotated[str, BeforeValidator(_id_as_str)]
"""A user or chat id: a bare platform id or ``platform:id``; YAML integers are accepted."""


BusyMode = Literal["queue", "interrupt", "steer"]
"""What a message sent while a turn runs in its conversation does (docs/steering.md)."""
BUSY_MODES: tuple[BusyMode, ...] = ("queue", "interrupt", "steer")


class AccessPolicy(Strict):
    """Who may talk to the bot. Deny by default: unknown DM senders get the pairing path."""

    allow_users: list[PlatformId] = Field(default_factory=list)
    """User ids (bare platform id, or ``platform:id``) that bypass pairing. ``"*"`` (or
    ``"telegram:*"``) opens the bot to everyone: an explicit choice, never a default."""
    allow_chats: list[PlatformId] = Field(default_factory=list)
    """Group chats where anyone may address the bot. Empty: any group, but only allowed users."""
    admins: list[PlatformId] = Field(default_factory=list)
    """Users who may run admin commands in chat (implies allowed)."""
    pairing: bool = True
    """Unknown DM senders receive a one-time code an admin approves with ``chital pairing approve``."""
    group_policy: Literal["mention", "free", "off"] = "mention"
    """In groups: answer when addressed (mention), every message (free) or never (off)."""
    free_response_chats: list[PlatformId] = Field(default_factory=list)
    """Group chats answered without a mention even when group_policy is ``mention``."""
    pairing_code_ttl: float = Field(3600.0, gt=0)
    """Seconds a pairing code stays valid; a stranger who writes after that gets a new code."""
    pairing_max_pending: int = Field(20, ge=1, le=1000)
    """Pending codes kept at once (over all channels); a new request beyond it drops the oldest.
    Bounds what strangers can make us store, and the odds of a guessed code (docs/access.md)."""
    admin_chats: list[PlatformId] = Field(default_factory=list)
    """Chats (``platform:chat_id`` or bare ids) where pairing requests are announced, besides
    each admin's DM. Needed on Discord and Lark until an admin has written to the bot once,
    because there the DM chat id is not the user id (docs/access.md)."""
    group_model_switch: Literal["admins", "anyone"] = "admins"
    """Who may change a group chat's model with ``/model NAME`` (everyone there uses it); in a
    direct message the user always may."""


class ContextConfig(Strict):
    """The thread a message was written in, given to the agent as context (docs/thread-context.md):
    the earlier messages of a Slack, Discord or Lark thread, the message a Telegram, Discord or
    Lark reply answers."""

    thread_messages: int = Field(20, ge=0, le=200)
    """Earlier messages of the thread (or the one replied to) given with a message, newest kept.
    0: none, and nothing is fetched."""
    thread_chars: int = Field(8000, ge=0, le=100_000)
    """Characters of context at most, over all those messages; older ones are dropped first."""
    message_chars: int = Field(2000, ge=50, le=100_000)
    """Characters of one earlier message at most; a longer one is cut with "…"."""
    fetch_timeout: float = Field(5.0, gt=0, le=60)
    """Seconds the platform may take to hand over the thread; after that (or on any error) the
    message is answered without context."""


class StorageConfig(Strict):
    path: Path = Path("./data")
    """Directory for the SQLite databases and per-thread files."""
    url: str | None = None
    """``postgresql://user:password@host:5432/db`` keeps the gateway's tables and the agent's
    checkpoints and memory in PostgreSQL, so several daemons can share one bot
    (docs/scale-out.md); also ``$CHITAL_DATABASE_URL``. Unset: SQLite files under ``path``."""

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql://… URL (leave it unset for SQLite)")
        return value

    lease_seconds: float = Field(15.0, ge=2.0, le=600.0)
    """With PostgreSQL: how long a daemon's claim on a message outlives its last heartbeat. A
    daemon killed mid-answer is taken over by another after this long (docs/scale-out.md)."""

    @property
    def database_url(self) -> str | None:
        """The PostgreSQL URL in use: the config's, else ``$CHITAL_DATABASE_URL``, else None."""
        return self.url or os.environ.get("CHITAL_DATABASE_URL") or None

    reserve_mb: int = Field(64, ge=0)
    """Disk space held back beside the database and given up only when the disk fills, so the
    journal keeps recording (failures, new messages) while an operator frees space. 0: none."""
    retention_days: float = Field(7.0, gt=0)
    """Finished journal entries (with their outbox and file rows) older than this are deleted. It
    must outlast every platform's redelivery window (Telegram keeps updates 24 h), or a late
    redelivery would be answered twice: see docs/durability.md for the default."""
    prune_interval: float = Field(3600.0, gt=0)
    """Seconds between two prunes of the journal; one also runs at start-up."""
    pairing_retention_hours: float = Field(24.0, gt=0)
    """Pairing requests (pending, lapsed or denied) made longer ago than this, and than twice the
    longest ``access.pairing_code_ttl`` (a denial lasts one TTL after the code's own), are deleted
    by the periodic prune, so strangers cannot grow the database; whoever writes again gets a new
    code."""


class ConcurrencyConfig(Strict):
    max_turns: int = Field(32, ge=1, le=1024)
    """Agent turns running at once across all conversations (turns mostly wait on the model)."""
    max_queue_per_conversation: int = Field(50, ge=1)
    """Messages a single conversation may have waiting; more are refused with a visible note."""
    turn_timeout: float = Field(900.0, gt=0)
    shutdown_grace: float = Field(20.0, ge=0)
    """Seconds SIGTERM waits for running turns before cancelling them (they resume on next start)."""


class LimitsConfig(Strict):
    max_message_chars: int = Field(32_000, ge=1)
    """Longer inbound messages are refused with a clear note instead of being sent to the model."""
    max_attachment_bytes: int = Field(20 * 1024 * 1024, ge=0)
    user_messages_per_minute: int = Field(0, ge=0)
    """Messages one user may send to the agent per minute (sliding window); more are refused
    with a note. 0: no limit. Admins are exempt; commands are not counted."""


class TranscriptionConfig(Strict):
    """Voice notes and audio files, turned into text through an OpenAI-compatible
    ``/audio/transcriptions`` endpoint (OpenAI, or a self-hosted Whisper server; docs/media.md).
    On when ``base_url`` or ``api_key`` is set."""

    base_url: str | None = None
    """The API root, e.g. ``http://127.0.0.1:8000/v1`` for a local Whisper server. Unset with an
    ``api_key``: OpenAI's."""
    api_key: SecretStr | None = None
    """Sent as the Bearer token; never logged. A local server without keys needs none."""
    model: str = "whisper-1"
    language: str | None = None
    """ISO-639-1 hint (``en``, ``de``); unset: the service detects it."""
    timeout: float = Field(120.0, gt=0, le=3600)
    """Seconds one transcription may take before the user gets a note instead."""
    retries: int = Field(1, ge=0, le=5)
    """Retries of a failed call (timeouts, 5xx, 429), with the SDK's backoff."""
    max_bytes: int = Field(25 * 1024 * 1024, ge=1024)
    """Larger audio is not sent (OpenAI refuses over 25 MB); the user gets a note, the file is kept."""
    show_transcript: bool = False
    """Start the reply with "🎙 heard: …" (what was understood). Off: the user can still ask
    "what did you hear?", since the transcript is part of the message the agent answers."""
    concurrency: int = Field(4, ge=1, le=256)
    """Recordings transcribed at once over all users. Transcription runs outside the turn slots
    (``concurrency.max_turns``), so a stalled transcriber never delays other users' answers."""
    per_user: int = Field(1, ge=1, le=64)
    """Recordings of one user transcribed at once: the rest of that user's wait behind them, not
    in front of other users' (docs/media.md, "Fair transcription")."""

    @property
    def configured(self) -> bool:
        return bool(self.base_url or self.api_key)


class SpeechConfig(Strict):
    """Spoken replies through an OpenAI-compatible ``/audio/speech`` endpoint (OpenAI, or a
    self-hosted text-to-speech server; docs/speech.md). On when ``base_url`` or ``api_key`` is set;
    each conversation then chooses with ``/voice on|all|off``."""

    base_url: str | None = None
    """The API root, e.g. ``http://127.0.0.1:8880/v1`` for a local server. Unset with an
    ``api_key``: OpenAI's."""
    api_key: SecretStr | None = None
    """Sent as the Bearer token; never logged (``$SPEECH_API_KEY`` in the file reads it from the
    environment). A local server without keys needs none."""
    model: str = "tts-1"
    voice: str = "alloy"
    """The voice name the service knows (OpenAI: alloy, echo, fable, onyx, nova, shimmer, ...)."""
    file_format: Literal["mp3", "opus"] = "mp3"
    """Audio asked for on Slack, Discord and Lark (an audio file there). Telegram always gets
    ``opus`` (OGG/Opus), the only format it shows as a voice message."""
    timeout: float = Field(60.0, gt=0, le=600)
    """Seconds one answer's speech may take (its retries and the download included) before the
    user gets a note instead; the text answer is never held back by it."""
    retries: int = Field(1, ge=0, le=5)
    """Retries of a failed call (timeouts, 5xx, 429), with the SDK's backoff."""
    max_chars: int = Field(1500, ge=50, le=4096)
    """Characters of an answer spoken at most (OpenAI takes 4,096); a longer answer is cut at a
    sentence and the voice message says the rest is in the text."""
    max_bytes: int = Field(10 * 1024 * 1024, ge=16 * 1024, le=50 * 1024 * 1024)
    """Bytes of audio read back at most: more is a misconfigured or hostile endpoint, and the
    download stops there."""
    concurrency: int = Field(2, ge=1, le=64)
    """Answers spoken at once over all users. Speech runs after the answer went out, outside the
    turn slots, so a slow speech service never delays anyone's text answers."""
    daily_chars_per_user: int = Field(50_000, ge=0)
    """Characters a user may have spoken per day (the ``usage:`` day and time zone; admins are
    exempt; 0: no limit). Speech is paid per character, outside the token budgets: without this,
    ``/voice all`` and a stream of long answers spend the operator's money unbounded. Counted per
    daemon process (several daemons on PostgreSQL each allow this much)."""

    @property
    def configured(self) -> bool:
        return bool(self.base_url or self.api_key)


class HttpConfig(Strict):
    enabled: bool = True
    """Serve ``/healthz``, ``/readyz`` and ``/metrics``."""
    host: str = "127.0.0.1"
    """Address to listen on. Loopback by default: metrics are not for the network. The environment
    variable ``CHITAL_HTTP_HOST`` overrides it (the container image sets ``0.0.0.0``)."""
    port: int = Field(8787, ge=0, le=65535)
    """TCP port; 0 picks a free one (tests)."""


class DeliveryConfig(Strict):
    stream: bool = True
    """Edit one message as text arrives; off: send the final answer only."""
    first_edit_delay: float = Field(0.6, ge=0)
    """How long streamed text gathers before the first message appears; a faster answer goes out
    whole in one message."""
    retry_window: float = Field(6 * 3600, gt=0)
    """Seconds a reply that failed for a transient reason (5xx, network, a channel restart) keeps
    being retried in-process (backoff 1 s doubling to 15 s, and at once on every reconnect) before
    it is marked failed."""


class SchedulesConfig(Strict):
    """Work the agent schedules for later (docs/schedules.md): reminders, cron rules."""

    enabled: bool = True
    """Give the agent its schedule tools; off: none, and nothing scheduled fires."""
    timezone: str = "UTC"
    """IANA zone (``Europe/Berlin``) for cron rules and times that name none. Chat platforms do
    not tell the bot a user's zone, so set your team's here; a user can still name another."""
    max_per_conversation: int = Field(50, ge=1, le=10_000)
    """Active schedules one conversation may hold."""
    max_per_user: int = Field(50, ge=1, le=10_000)
    """Active schedules one user may have created, over all conversations."""
    min_interval: float = Field(60.0, ge=60)
    """Seconds at least between two runs of a cron rule (a rule firing more often is refused)."""
    max_text_chars: int = Field(2000, ge=1, le=32_000)
    """Longest instruction a schedule may carry."""

    @model_validator(mode="after")
    def _zone_exists(self) -> SchedulesConfig:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone: unknown IANA time zone {self.timezone!r}") from None
        return self


class BackgroundConfig(Strict):
    """Background tasks (docs/background-tasks.md): ``/bg TASK`` and the agent's
    ``start_background_task`` run a task in its own agent thread while the chat stays free."""

    enabled: bool = True
    """Offer ``/bg`` and give the lead agent its ``start_background_task`` tool; off: neither."""
    max_per_user: int = Field(3, ge=1, le=100)
    """Background tasks one user may have running (or waiting to run) at once, over all chats; a
    further request is refused with a note naming the limit and ``/tasks stop ID``."""
    max_text_chars: int = Field(4000, ge=1, le=32_000)
    """Longest task description a background task may carry."""
    max_running: int = Field(4, ge=1, le=256)
    """Background tasks whose agent works at once on one daemon; more wait their turn. They run
    beside ``concurrency.max_turns`` (a task gives its chat slot back while it works), so hours of
    background work never make the chats wait."""
    timeout: float = Field(4 * 3600.0, gt=0)
    """Seconds a background task may run before it is stopped with a note (a chat's turn has
    ``concurrency.turn_timeout``); ``agent.max_steps`` bounds its model calls as for any turn."""
    listed: int = Field(10, ge=1, le=50)
    """Tasks ``/tasks`` lists: the running ones first, then the most recent finished."""


class ModelPrice(BaseModel):
    """What a model's tokens cost, in ``usage.currency`` per million tokens (the provider's list
    price: Chital does not read bills)."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0, le=1_000_000, allow_inf_nan=False)
    """Per million prompt tokens that were not read from the provider's cache."""
    output: float = Field(ge=0, le=1_000_000, allow_inf_nan=False)
    """Per million completion tokens."""
    cached_input: float | None = Field(None, ge=0, le=1_000_000, allow_inf_nan=False)
    """Per million prompt tokens read from the provider's prompt cache; unset: the input price."""


class UsageConfig(BaseModel):
    """Token accounting and the optional daily budget per user."""

    model_config = ConfigDict(extra="forbid")

    daily_tokens: int = Field(0, ge=0)
    """Tokens (prompt + completion, all model calls of their turns, sub-agents, titles and memory
    included) one user may use per day; checked at intake (a message beyond it gets a note instead
    of an answer) and before every model call (a turn that reaches it stops with a note).
    0: no budget."""
    users: dict[str, int] = Field(default_factory=dict)
    """Per-user budgets that replace ``daily_tokens``, keyed ``platform:user_id``; 0: unlimited."""
    admins_exempt: bool = True
    """Admins (``access.admins``) have no budget unless ``users`` names them."""
    timezone: str = "UTC"
    """Where a day starts and ends, for the budget and ``/usage`` (an IANA name, e.g. Europe/Berlin)."""
    retention_days: int = Field(90, ge=30)
    """Usage rows older than this are deleted (``/usage`` shows 30 days)."""
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """Per model (``models[].name``): its prices, so ``/usage`` and the metrics show cost beside
    tokens. A model without one shows tokens only, its cost unknown (never 0)."""
    currency: str = Field("USD", min_length=1, max_length=8, pattern=r"^[A-Za-z$€£¥]+$")
    """The unit of ``prices`` and ``daily_cost``, as shown (``USD``, ``EUR``, ``$``)."""
    daily_cost: float = Field(0, ge=0, lt=1e9, allow_inf_nan=False)
    """Money (in ``currency``) one user's model calls may cost per day, checked like
    ``daily_tokens`` (at intake and before every model call). Every model needs a price then.
    0: no money budget. Both budgets may be set: the first one reached stops."""
    user_costs: dict[str, float] = Field(default_factory=dict)
    """Per-user money budgets that replace ``daily_cost``, keyed ``platform:user_id``; 0: unlimited."""
    reserve_output_tokens: int = Field(2048, ge=1)
    """For users with a budget: the tokens held for a model call's answer when the model's own
    settings give no ``max_tokens`` (the request's estimated size is held besides). A larger value
    keeps a budget tighter under concurrent calls, a smaller one refuses fewer calls near its end."""

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r} (use an IANA name such as UTC or Europe/Berlin)"
            ) from None
        return value

    @field_validator("users")
    @classmethod
    def _qualified(cls, value: dict[str, int]) -> dict[str, int]:
        for user, tokens in value.items():
            platform, _, raw = user.partition(":")
            if not platform or not raw:
                raise ValueError(f"{user!r}: write users as 'platform:user_id', e.g. 'telegram:12345'")
            if tokens < 0:
                raise ValueError(f"{user!r}: a budget cannot be negative")
        return value

    @field_validator("user_costs")
    @classmethod
    def _qualified_costs(cls, value: dict[str, float]) -> dict[str, float]:
        for user, cost in value.items():
            platform, _, raw = user.partition(":")
            if not platform or not raw:
                raise ValueError(f"{user!r}: write users as 'platform:user_id', e.g. 'telegram:12345'")
            if not 0 <= cost < 1e9:
                raise ValueError(f"{user!r}: a money budget is a number from 0 (unlimited) up")
        return value

    def today(self, now: float | None = None) -> date:
        return datetime.fromtimestamp(time.time() if now is None else now, ZoneInfo(self.timezone)).date()

    def seconds_to_midnight(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        zone = ZoneInfo(self.timezone)
        tomorrow = datetime.fromtimestamp(now, zone).date() + timedelta(days=1)
        return datetime(tomorrow.year, tomorrow.month, tomorrow.day, tzinfo=zone).timestamp() - now
