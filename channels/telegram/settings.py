"""Telegram's keys under ``channels.telegram`` in config.yaml."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from channels.settings import ChannelSettings


class TelegramSettings(ChannelSettings):
    """A bot token from @BotFather; long polling, so the daemon needs no public address."""

    required: ClassVar[dict[str, str]] = {"token": "TELEGRAM_BOT_TOKEN"}
    sdk_loggers: ClassVar[tuple[str, ...]] = ("telegram",)

    token: SecretStr | None = None
    base_url: str = "https://api.telegram.org/bot"
    """Bot API prefix the token is appended to: change it for a self-hosted Bot API server."""
    base_file_url: str = "https://api.telegram.org/file/bot"
    """File download prefix the token is appended to."""
    poll_timeout: int = Field(25, ge=0, le=60)
    """Seconds one long poll waits for updates (0: short polling, one request a second)."""
    album_wait: float = Field(1.0, ge=0.1, le=10.0)
    """Seconds without a new photo or file of an album (a media group) after which the album is one
    message to the agent (handed over within 10 s of its first item at most; docs/media.md)."""
