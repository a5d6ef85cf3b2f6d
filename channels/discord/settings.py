"""Discord's keys under ``channels.discord`` in config.yaml."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from channels.settings import ChannelSettings


class DiscordSettings(ChannelSettings):
    """A bot token from the developer portal, with the Message Content intent enabled."""

    required: ClassVar[dict[str, str]] = {"token": "DISCORD_BOT_TOKEN"}
    sdk_loggers: ClassVar[tuple[str, ...]] = ("discord",)

    token: SecretStr | None = None
    api_base_url: str = "https://discord.com/api/v10"
    gateway_url: str | None = None
    """Overrides the gateway websocket URL (``ws://host:port/``); default: Discord's."""
    heartbeat_timeout: float = Field(60.0, gt=0)
    """Seconds without a heartbeat ACK before a half-open gateway connection is dropped and resumed."""
