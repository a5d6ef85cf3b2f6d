"""The ``hooks:`` section: HTTP deliveries (GitHub, GitLab, Alertmanager, CI) that start a turn
(docs/hooks.md). Off unless at least one hook is configured; served on a listener of its own, never
on the ops endpoint (gateway/ops/http.py), so exposing hooks to a network never exposes metrics."""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, field_validator

from gateway.config.platforms import PLATFORMS
from gateway.config.sections import PlatformId, Strict

HOOK_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
"""A hook's name as it appears in ``/hooks/<name>``: lower case, digits, ``-`` and ``_``."""


class HookSpec(Strict):
    """One hook: who may call it (the secret), where its turn runs and what the agent is asked."""

    secret: SecretStr
    """The shared secret the sender signs each body with (HMAC-SHA256 over the raw body, sent as
    GitHub's ``X-Hub-Signature-256: sha256=<hex>`` or ``X-Chital-Signature: sha256=<hex>``). Put it in
    the environment and write ``${NAME}`` here. At least 16 characters."""
    platform: str
    """The platform of the conversation the hook's turn runs in: any of the registry
    (gateway/config/platforms.py), e.g. ``telegram``, ``slack``, ``matrix``, ``whatsapp``."""
    chat_id: PlatformId
    """The chat the answer lands in. It must be allowed by ``access`` (in ``allow_chats`` or
    ``admin_chats``, or the direct chat of an allowed user); a hook whose chat is not is refused at
    start-up."""
    prompt: str = Field(min_length=1, max_length=4000)
    """What the agent is asked, with field look-ups of the payload such as ``{payload.action}`` or
    ``{payload.alerts.0.labels.alertname}`` (and ``{event}``, ``{hook}``). Only look-ups: no
    expressions, no code. A looked-up value is shown quoted on one line; the whole payload follows
    as quoted data. ``{{`` and ``}}`` are literal braces."""
    rate_per_minute: int = Field(30, ge=1, le=10_000)
    """Deliveries accepted per minute (a burst of as many, refilled evenly); more get 429."""

    @field_validator("platform")
    @classmethod
    def _known_platform(cls, value: str) -> str:
        names = [p.name for p in PLATFORMS]
        if value not in names:
            raise ValueError(f"unknown platform {value[:40]!r}; use one of {', '.join(names)}")
        return value

    @field_validator("secret")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 16:
            raise ValueError("a hook's secret must be at least 16 characters")
        return value


class HooksConfig(Strict):
    """Events that start work (docs/hooks.md): ``POST /hooks/<name>`` on a listener of its own."""

    host: str = "127.0.0.1"
    """Address the hooks listener binds. Loopback by default: put a reverse proxy (TLS) in front to
    take deliveries from the internet."""
    port: int = Field(8788, ge=0, le=65535)
    """TCP port of the hooks listener; 0 picks a free one (tests)."""
    max_body_bytes: int = Field(1_000_000, ge=1024, le=25_000_000)
    """Largest body accepted; a larger one gets 413 without being read into memory."""
    read_seconds: float = Field(10.0, gt=0, le=300)
    """Time a sender has to send the whole body once its headers are in; a slower one (a
    slow-loris holding the connection open a byte at a time) gets 408 and is counted."""
    payload_chars: int = Field(8000, ge=500, le=100_000)
    """Characters of the payload (as indented JSON) the agent is shown; the rest is cut."""
    hooks: dict[str, HookSpec] = Field(default_factory=dict)
    """The hooks by name (``/hooks/<name>``). Empty: no listener at all."""

    @field_validator("hooks")
    @classmethod
    def _names(cls, value: dict[str, HookSpec]) -> dict[str, HookSpec]:
        for name in value:
            if not HOOK_NAME.fullmatch(name):
                raise ValueError(f"hook name {name!r}: use lower-case letters, digits, '-' and '_'")
        return value
