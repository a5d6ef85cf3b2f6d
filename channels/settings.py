"""The base of every platform's settings model (``channels/<platform>/settings.py``).

A platform's settings are its own keys under ``channels.<platform>`` in config.yaml: credentials
(``SecretStr``: masked in every log line, never echoed), endpoint overrides and timeouts. The model
also declares what the channel cannot start without and which loggers its SDK brings, so the gateway
judges readiness, redacts and quiets every platform with the same code (gateway/config/platforms.py lists
the platforms; gateway/config/schema.py adds ``enabled`` and ``access`` to each). Each field is handed to
the adapter's constructor parameter of the same name, so the settings model is the one place a
default lives.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, SecretStr


class ChannelSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    required: ClassVar[dict[str, str]] = {}
    """Fields the channel cannot start without -> the environment variable that usually holds each."""
    sdk_loggers: ClassVar[tuple[str, ...]] = ()
    """Loggers of the platform's SDK: held at WARNING and redacted where they log (request URLs can
    carry a token, and some SDKs attach handlers of their own)."""

    def plain(self, name: str) -> str:
        """Field ``name`` as plain text, a secret unwrapped; ``""`` when unset."""
        value = getattr(self, name)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        return str(value) if value else ""

    def missing(self) -> str | None:
        """Why the channel cannot start (``missing token (set TELEGRAM_BOT_TOKEN)``), or None."""
        gaps = [name for name in self.required if not self.plain(name)]
        if not gaps:
            return None
        return f"missing {', '.join(gaps)} (set {' and '.join(self.required[g] for g in gaps)})"
