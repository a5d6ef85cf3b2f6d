"""Builds the enabled channel adapters from config and says why the others are off.

Adapters are imported lazily: a platform that is off costs neither import time nor memory."""

from __future__ import annotations

import logging

from channels.base import Channel

from .config import Config


def _secret(value: object) -> str | None:
    if value is None:
        return None
    getter = getattr(value, "get_secret_value", None)
    raw = getter() if getter else str(value)
    return raw or None


def channel_readiness(cfg: Config) -> dict[str, tuple[bool, str]]:
    """Per channel: (will start, why / why not). Used by ``chital check`` and start-up logs."""
    c = cfg.channels
    out: dict[str, tuple[bool, str]] = {}

    def judge(name: str, enabled: bool, needs: dict[str, object], env_hint: str) -> None:
        if not enabled:
            out[name] = (False, f"disabled in config (channels.{name}.enabled: false)")
            return
        missing = [k for k, v in needs.items() if not _secret(v)]
        if missing:
            out[name] = (False, f"missing {', '.join(missing)} (set {env_hint})")
        else:
            out[name] = (True, "credentials present")

    judge("telegram", c.telegram.enabled, {"token": c.telegram.token}, "TELEGRAM_BOT_TOKEN")
    judge(
        "slack",
        c.slack.enabled,
        {"bot_token": c.slack.bot_token, "app_token": c.slack.app_token},
        "SLACK_BOT_TOKEN and SLACK_APP_TOKEN",
    )
    judge("discord", c.discord.enabled, {"token": c.discord.token}, "DISCORD_BOT_TOKEN")
    judge(
        "lark",
        c.lark.enabled,
        {"app_id": c.lark.app_id, "app_secret": c.lark.app_secret},
        "LARK_APP_ID and LARK_APP_SECRET",
    )
    return out


def build_channels(cfg: Config) -> tuple[list[Channel], dict[str, str]]:
    channels: list[Channel] = []
    off: dict[str, str] = {}
    c = cfg.channels
    for name, (ok, why) in channel_readiness(cfg).items():
        if not ok:
            off[name] = why
            continue
        if name == "telegram":
            from channels.telegram import TelegramChannel

            channels.append(
                TelegramChannel(
                    _secret(c.telegram.token) or "",
                    base_url=c.telegram.base_url,
                    base_file_url=c.telegram.base_file_url,
                    poll_timeout=c.telegram.poll_timeout,
                )
            )
        elif name == "slack":
            from channels.slack import SlackChannel

            channels.append(
                SlackChannel(
                    _secret(c.slack.bot_token) or "",
                    _secret(c.slack.app_token) or "",
                    api_base_url=c.slack.api_base_url,
                    ping_interval=c.slack.ping_interval,
                )
            )
        elif name == "discord":
            from channels.discord import DiscordChannel

            channels.append(
                DiscordChannel(
                    _secret(c.discord.token) or "",
                    api_base_url=c.discord.api_base_url,
                    gateway_url=c.discord.gateway_url,
                    heartbeat_timeout=c.discord.heartbeat_timeout,
                )
            )
        elif name == "lark":
            from channels.lark import LarkChannel

            # lark-oapi attaches its own stdout handler at import; it would bypass our redacting
            # handler and print every line twice.
            logging.getLogger("Lark").handlers.clear()

            channels.append(
                LarkChannel(
                    c.lark.app_id or "",
                    _secret(c.lark.app_secret) or "",
                    domain=c.lark.domain,
                    liveness_timeout=c.lark.liveness_timeout,
                )
            )
    return channels, off
