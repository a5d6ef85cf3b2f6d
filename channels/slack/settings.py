"""Slack's keys under ``channels.slack`` in config.yaml."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from channels.settings import ChannelSettings


class SlackSettings(ChannelSettings):
    """A bot token (``xoxb-``) for the Web API and an app-level token (``xapp-``) for Socket Mode,
    which needs no public address."""

    required: ClassVar[dict[str, str]] = {"bot_token": "SLACK_BOT_TOKEN", "app_token": "SLACK_APP_TOKEN"}
    sdk_loggers: ClassVar[tuple[str, ...]] = ("slack_sdk", "slack_bolt")

    bot_token: SecretStr | None = None
    app_token: SecretStr | None = None
    api_base_url: str = "https://slack.com/api/"
    ping_interval: float = Field(10.0, gt=0)
    """Seconds between Socket Mode pings; a dead connection shows within about twice this."""
