"""config.yaml: a pydantic schema, ``$ENV_VAR`` references, and errors that name the field."""

from __future__ import annotations

import os
import re
import shlex
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, cast, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from agent.config import AgentSettings, ModelSpec
from agent.settings import shipped_skills_dir
from channels.settings import ChannelSettings
from gateway.config.platforms import PLATFORMS
from gateway.config.profiles import Profile, check_profiles
from gateway.turns.usage import UsageConfig

_ENV_REF = re.compile(r"\$(\{)?([A-Za-z_][A-Za-z0-9_]*)(?(1)\})")

HTTP_HOST_ENV = "CHITAL_HTTP_HOST"
"""When set, replaces ``http.host`` (from the file or the default). The container image sets it to
``0.0.0.0`` so a published port answers; a daemon on a host keeps listening on 127.0.0.1 only."""


class ConfigError(Exception):
    """config.yaml is unreadable or invalid. The message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _id_as_str(value: Any) -> Any:
    """Platform ids are strings, but YAML reads ``allow_users: [123456]`` as a number: take it as the
    id the operator meant instead of refusing the file (bools are not ids and stay refused)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


PlatformId = Annotated[str, BeforeValidator(_id_as_str)]
"""A user or chat id: a bare platform id or ``platform:id``; YAML integers are accepted."""


class AccessPolicy(_Strict):
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


class ContextConfig(_Strict):
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


class ChannelBase(_Strict):
    enabled: bool = True
    access: AccessPolicy | None = None
    """Overrides the top-level ``access`` for this channel."""
    context: ContextConfig | None = None
    """Overrides the top-level ``context`` for this channel."""


def _channel_section(settings: type[ChannelSettings]) -> type[ChannelBase]:
    """``channels.<platform>``: the platform's own settings (channels/<platform>/settings.py) plus
    ``enabled`` and ``access``, documented by the settings model's docstrings."""
    bases: tuple[type[BaseModel], ...] = (settings, ChannelBase)
    section = create_model(
        settings.__name__.removesuffix("Settings") + "Config",
        __base__=bases,
        __doc__=settings.__dict__.get("__doc__"),
        __module__=__name__,
    )
    return cast(type[ChannelBase], section)


def _off(section: type[ChannelBase]) -> Callable[[], ChannelBase]:
    return lambda: section(enabled=False)


def _channels_config() -> type[_Strict]:
    """The ``channels`` section: one key per platform of gateway/config/platforms.py, off when absent."""
    sections = {p.name: _channel_section(p.settings) for p in PLATFORMS}
    fields: dict[str, Any] = {name: (s, Field(default_factory=_off(s))) for name, s in sections.items()}
    return create_model("ChannelsConfig", __base__=_Strict, __module__=__name__, **fields)


if TYPE_CHECKING:

    class ChannelsConfig(_Strict):
        def __getattr__(self, name: str) -> Any: ...

else:
    ChannelsConfig = _channels_config()


class StorageConfig(_Strict):
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


class ConcurrencyConfig(_Strict):
    max_turns: int = Field(32, ge=1, le=1024)
    """Agent turns running at once across all conversations (turns mostly wait on the model)."""
    max_queue_per_conversation: int = Field(50, ge=1)
    """Messages a single conversation may have waiting; more are refused with a visible note."""
    turn_timeout: float = Field(900.0, gt=0)
    shutdown_grace: float = Field(20.0, ge=0)
    """Seconds SIGTERM waits for running turns before cancelling them (they resume on next start)."""


class LimitsConfig(_Strict):
    max_message_chars: int = Field(32_000, ge=1)
    """Longer inbound messages are refused with a clear note instead of being sent to the model."""
    max_attachment_bytes: int = Field(20 * 1024 * 1024, ge=0)
    user_messages_per_minute: int = Field(0, ge=0)
    """Messages one user may send to the agent per minute (sliding window); more are refused
    with a note. 0: no limit. Admins are exempt; commands are not counted."""


class TranscriptionConfig(_Strict):
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


class HttpConfig(_Strict):
    enabled: bool = True
    """Serve ``/healthz``, ``/readyz`` and ``/metrics``."""
    host: str = "127.0.0.1"
    """Address to listen on. Loopback by default: metrics are not for the network. The environment
    variable ``CHITAL_HTTP_HOST`` overrides it (the container image sets ``0.0.0.0``)."""
    port: int = Field(8787, ge=0, le=65535)
    """TCP port; 0 picks a free one (tests)."""


class DeliveryConfig(_Strict):
    stream: bool = True
    """Edit one message as text arrives; off: send the final answer only."""
    first_edit_delay: float = Field(0.6, ge=0)
    """How long streamed text gathers before the first message appears; a faster answer goes out
    whole in one message."""
    retry_window: float = Field(6 * 3600, gt=0)
    """Seconds a reply that failed for a transient reason (5xx, network, a channel restart) keeps
    being retried in-process (backoff 1 s doubling to 15 s, and at once on every reconnect) before
    it is marked failed."""


class SchedulesConfig(_Strict):
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


class Config(_Strict):
    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec()])
    agent: AgentSettings = Field(default_factory=AgentSettings)
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    access: AccessPolicy = Field(default_factory=AccessPolicy)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    context: ContextConfig = Field(default_factory=ContextConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    transcription: TranscriptionConfig = Field(default_factory=TranscriptionConfig)
    schedules: SchedulesConfig = Field(default_factory=SchedulesConfig)
    profiles: dict[str, Profile] = Field(default_factory=dict)
    """Agent profiles: a model and a system prompt for the chats and channels each one names
    (docs/models-and-usage.md)."""
    usage: UsageConfig = Field(default_factory=UsageConfig)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    _source: Path | None = PrivateAttr(default=None)
    """The file this was read from (absolute), for the commands the bot tells people to run."""

    @property
    def source(self) -> Path | None:
        return self._source

    @source.setter
    def source(self, path: Path | None) -> None:
        self._source = path

    def cli(self) -> str:
        """``chital -c /abs/config.yaml``: the command prefix that acts on this daemon's data from
        any directory (bare ``chital`` when it runs on the built-in defaults)."""
        return f"chital -c {shlex.quote(str(self._source))}" if self._source is not None else "chital"

    @model_validator(mode="after")
    def _model_exists(self) -> Config:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: duplicate model names {names}")
        if self.agent.model not in names:
            raise ValueError(f"agent.model: {self.agent.model!r} is not one of models[].name {names}")
        check_profiles(self.profiles, names)
        return self

    def model_spec(self, name: str | None = None) -> ModelSpec:
        wanted = name or self.agent.model
        return next(m for m in self.models if m.name == wanted)

    def access_for(self, channel: str) -> AccessPolicy:
        specific = getattr(self.channels, channel).access
        return specific if specific is not None else self.access

    def context_for(self, channel: str) -> ContextConfig:
        specific = getattr(self.channels, channel).context
        return specific if specific is not None else self.context


def _resolve_env(node: Any, path: str, missing: list[str]) -> Any:
    """Replace ``$VAR`` / ``${VAR}`` in strings. An unset variable becomes ``None`` when it is the
    whole value (so a channel without its token is simply off) and is reported otherwise."""
    if isinstance(node, dict):
        # A key whose whole value is an unset $VAR is dropped, so the field's default applies
        # (a channel without its token is simply off; a base URL falls back to the platform's).
        out = {k: _resolve_env(v, f"{path}.{k}" if path else str(k), missing) for k, v in node.items()}
        return {k: v for k, v in out.items() if not (v is None and isinstance(node[k], str))}
    if isinstance(node, list):
        return [_resolve_env(v, f"{path}[{i}]", missing) for i, v in enumerate(node)]
    if isinstance(node, str) and "$" in node:
        whole = _ENV_REF.fullmatch(node)
        if whole:
            return os.environ.get(whole.group(2)) or None

        def sub(m: re.Match[str]) -> str:
            value = os.environ.get(m.group(2))
            if value is None:
                missing.append(f"{path}: environment variable {m.group(2)} is not set")
                return ""
            return value

        return _ENV_REF.sub(sub, node)
    return node


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold: itself, a union's members, ``Annotated``'s base."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return models_in(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for arg in get_args(annotation) for m in models_in(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """Keys the schema accepts in the mapping at ``loc`` (empty when it cannot tell), to suggest the
    one a typo meant. Follows fields, list items and dict values through ``Config``'s annotations."""
    annotation: Any = Config
    for part in loc:
        models = models_in(annotation)
        named = [m for m in models if m.__name__ == part]
        if named:  # pydantic names the union member in the location
            annotation = named[0]
            continue
        if models:
            fields = [m.model_fields[str(part)] for m in models if str(part) in m.model_fields]
            if not fields:
                return []
            annotation = fields[0].annotation
            continue
        args = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) in (list, tuple, dict) and args:
            annotation = args[-1]  # list[X] / tuple[X, ...] item, dict[str, X] value
        elif args:
            annotation = args[0]  # X | None
        else:
            return []
    return sorted({name for m in models_in(annotation) for name in m.model_fields})


def _line_of(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line in the YAML source of the key (or item) at ``loc``, if the file has it."""
    line: int | None = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            pair = next((kv for kv in node.value if str(kv[0].value) == str(part)), None)
            if pair is None:
                return line
            line, node = pair[0].start_mark.line + 1, pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _describe(err: Any, node: yaml.Node | None) -> str:
    """One error line: the field path, its line in the file, and for an unknown key the closest
    known key. Never the offending value: it may be a secret."""
    loc = tuple(err["loc"])
    line = _line_of(node, loc)
    where = _field_path(loc) + (f" (line {line})" if line else "")
    if err["type"] != "extra_forbidden":
        return f"  {where}: {err['msg']}"
    known = _known_keys(loc[:-1])
    import difflib  # only for a config error: not loaded by a daemon that starts

    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    hint = f"; known keys: {', '.join(known)}" if known else ""
    if close:
        hint = f"; did you mean {close[0]!r}?"
    return f"  {where}: unknown key{hint}"


def parse_config(data: Any, source: str = "config.yaml", node: yaml.Node | None = None) -> Config:
    """Validate ``data`` (the parsed YAML). ``node``, the composed YAML document, lets errors give
    line numbers."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    missing: list[str] = []
    resolved = _resolve_env(data, "", missing)
    if missing:
        raise ConfigError(f"{source}: " + "; ".join(missing))
    try:
        cfg = Config.model_validate(resolved)
    except ValidationError as exc:
        lines = [_describe(err, node) for err in exc.errors()]
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines)) from None
    host = os.environ.get(HTTP_HOST_ENV, "").strip()
    if host:
        cfg.http.host = host
    return cfg


def builtin_defaults() -> dict[str, Any]:
    """What stands in for config.yaml when there is none: the example file's ``$VAR`` references.
    A channel whose credentials are in the environment is on (with the default access policy:
    strangers get a pairing code), one without them reports which variable to set; the model is
    ``$CHITAL_MODEL`` at ``$OPENAI_BASE_URL`` with ``$OPENAI_API_KEY``; data in ``$CHITAL_DATA``,
    else ./data."""
    return {
        "models": [
            {
                "name": "default",
                "use": "langchain_openai:ChatOpenAI",
                "model": "$CHITAL_MODEL",
                "base_url": "$OPENAI_BASE_URL",
                "api_key": "$OPENAI_API_KEY",
            }
        ],
        "channels": {p.name: {f: f"${env}" for f, env in p.settings.required.items()} for p in PLATFORMS},
        "storage": {"path": "$CHITAL_DATA"},
    }


def load_config(path: str | Path | None) -> Config:
    """Load ``path``; ``None`` (no file found) gives :func:`builtin_defaults`."""
    if path is None:
        return parse_config(builtin_defaults(), "built-in defaults")
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: no such file")
    try:
        # Composed first, then constructed: the node tree keeps line numbers for error messages.
        loader = yaml.SafeLoader(p.read_text(encoding="utf-8"))
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
    cfg = parse_config(data, str(p), node)
    cfg.source = p.resolve()
    # Relative paths in the file mean "beside this file", wherever the daemon is started from.
    base = p.parent
    if not cfg.storage.path.is_absolute():
        cfg.storage.path = (base / cfg.storage.path).resolve()
    skills = cfg.agent.skills
    resolved: dict[str, Path] = {}
    for field in ("public_dir", "custom_dir"):
        value = getattr(skills, field)
        if value is not None and not value.is_absolute():
            resolved[field] = (base / value).resolve()
    beside = (base / "skills" / "public").resolve()
    if skills.public_dir is None and not shipped_skills_dir().is_dir() and beside.is_dir():
        resolved["public_dir"] = beside  # an installed wheel: the Docker image's /app/skills/public
    # Rebuilt with the same fields-set: a folder the file names is missing with a warning, one
    # it leaves to the default is not (agent/skills.py).
    cfg.agent.skills = type(skills).model_construct(
        set(skills.model_fields_set), **{**dict(skills), **resolved}
    )
    return cfg
