"""config.yaml: a pydantic schema, ``$ENV_VAR`` references, and errors that name the field."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from agent.config import AgentSettings, ModelSpec

_ENV_REF = re.compile(r"\$(\{)?([A-Za-z_][A-Za-z0-9_]*)(?(1)\})")


class ConfigError(Exception):
    """config.yaml is unreadable or invalid. The message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AccessPolicy(_Strict):
    """Who may talk to the bot. Deny by default: unknown DM senders get the pairing path."""

    allow_users: list[str] = Field(default_factory=list)
    """User ids (bare platform id, or ``platform:id``) that bypass pairing. ``"*"`` (or
    ``"telegram:*"``) opens the bot to everyone: an explicit choice, never a default."""
    allow_chats: list[str] = Field(default_factory=list)
    """Group chats where anyone may address the bot. Empty: any group, but only allowed users."""
    admins: list[str] = Field(default_factory=list)
    """Users who may run admin commands in chat (implies allowed)."""
    pairing: bool = True
    """Unknown DM senders receive a one-time code an admin approves with ``chital pairing approve``."""
    group_policy: Literal["mention", "free", "off"] = "mention"
    """In groups: answer when addressed (mention), every message (free) or never (off)."""
    free_response_chats: list[str] = Field(default_factory=list)
    """Group chats answered without a mention even when group_policy is ``mention``."""
    pairing_code_ttl: float = Field(3600.0, gt=0)
    """Seconds a pairing code stays valid; a stranger who writes after that gets a new code."""
    pairing_max_pending: int = Field(20, ge=1, le=1000)
    """Pending codes kept at once (over all channels); a new request beyond it drops the oldest.
    Bounds what strangers can make us store, and the odds of a guessed code (docs/access.md)."""
    admin_chats: list[str] = Field(default_factory=list)
    """Chats (``platform:chat_id`` or bare ids) where pairing requests are announced, besides
    each admin's DM. Needed on Discord and Lark until an admin has written to the bot once,
    because there the DM chat id is not the user id (docs/access.md)."""


class ChannelBase(_Strict):
    enabled: bool = True
    access: AccessPolicy | None = None
    """Overrides the top-level ``access`` for this channel."""


class TelegramConfig(ChannelBase):
    token: SecretStr | None = None
    base_url: str = "https://api.telegram.org/bot"
    base_file_url: str = "https://api.telegram.org/file/bot"
    poll_timeout: int = Field(25, ge=0, le=60)


class SlackConfig(ChannelBase):
    bot_token: SecretStr | None = None
    app_token: SecretStr | None = None
    api_base_url: str = "https://slack.com/api/"
    ping_interval: float = Field(10.0, gt=0)


class DiscordConfig(ChannelBase):
    token: SecretStr | None = None
    api_base_url: str = "https://discord.com/api/v10"
    gateway_url: str | None = None
    """Overrides the gateway websocket URL (``ws://host:port/``); default: Discord's."""
    heartbeat_timeout: float = Field(60.0, gt=0)
    """Seconds without a heartbeat ACK before a half-open gateway connection is dropped and resumed."""


class LarkConfig(ChannelBase):
    app_id: str | None = None
    app_secret: SecretStr | None = None
    domain: str = "feishu"
    """``feishu``, ``lark`` or a full base URL (``https://open.feishu.cn``)."""
    liveness_timeout: float = Field(45.0, gt=0)
    """Seconds without any frame before the connection counts as dead (pings go every third of it)."""


class ChannelsConfig(_Strict):
    telegram: TelegramConfig = Field(default_factory=lambda: TelegramConfig(enabled=False))
    slack: SlackConfig = Field(default_factory=lambda: SlackConfig(enabled=False))
    discord: DiscordConfig = Field(default_factory=lambda: DiscordConfig(enabled=False))
    lark: LarkConfig = Field(default_factory=lambda: LarkConfig(enabled=False))


class StorageConfig(_Strict):
    path: Path = Path("./data")
    """Directory for the SQLite databases and per-thread files."""
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


class HttpConfig(_Strict):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(8787, ge=0, le=65535)


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


class Config(_Strict):
    models: list[ModelSpec] = Field(default_factory=lambda: [ModelSpec()])
    agent: AgentSettings = Field(default_factory=AgentSettings)
    channels: ChannelsConfig = Field(default_factory=ChannelsConfig)
    access: AccessPolicy = Field(default_factory=AccessPolicy)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _model_exists(self) -> Config:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: duplicate model names {names}")
        if self.agent.model not in names:
            raise ValueError(f"agent.model: {self.agent.model!r} is not one of models[].name {names}")
        return self

    def model_spec(self, name: str | None = None) -> ModelSpec:
        wanted = name or self.agent.model
        return next(m for m in self.models if m.name == wanted)

    def access_for(self, channel: str) -> AccessPolicy:
        specific = getattr(self.channels, channel).access
        return specific if specific is not None else self.access


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


def parse_config(data: Any, source: str = "config.yaml") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    missing: list[str] = []
    resolved = _resolve_env(data, "", missing)
    if missing:
        raise ConfigError(f"{source}: " + "; ".join(missing))
    try:
        return Config.model_validate(resolved)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            # Never echo the offending value: it may be a secret.
            lines.append(f"  {_field_path(tuple(err['loc']))}: {err['msg']}")
        raise ConfigError(f"{source}: invalid configuration\n" + "\n".join(lines)) from None


def load_config(path: str | Path | None) -> Config:
    """Load ``path``; ``None`` or a missing default file gives the built-in defaults."""
    if path is None:
        return parse_config({}, "defaults")
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: no such file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{p}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
    cfg = parse_config(data, str(p))
    # Relative paths in the file mean "beside this file", wherever the daemon is started from.
    base = p.parent
    if not cfg.storage.path.is_absolute():
        cfg.storage.path = (base / cfg.storage.path).resolve()
    skills = cfg.agent.skills
    for field in ("public_dir", "custom_dir"):
        value = getattr(skills, field)
        if not value.is_absolute():
            setattr(skills, field, (base / value).resolve())
    return cfg
