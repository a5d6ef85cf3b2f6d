"""The one table of chat platforms, and the channels the gateway builds from it.

A platform is a package under channels/ (docs/channels.md) and one row of :data:`PLATFORMS`: its key
under ``channels:`` in config.yaml, its settings model (gateway/config/schema.py composes the ``channels``
section from this table) and its adapter class. Readiness, secrets and SDK loggers come from the
settings model, so adding a platform touches its own folder and this table only.

Adapters are imported lazily: a platform that is off costs neither import time nor memory."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import SecretStr

from channels.base import Channel
from channels.dingtalk import DingTalkSettings
from channels.discord import DiscordSettings
from channels.lark import LarkSettings
from channels.matrix import MatrixSettings
from channels.settings import ChannelSettings
from channels.slack import SlackSettings
from channels.telegram import TelegramSettings
from channels.wecom import WeComSettings
from channels.whatsapp import WhatsAppSettings

if TYPE_CHECKING:
    from gateway.config.schema import Config


@dataclass(frozen=True, slots=True)
class Platform:
    name: str
    """The key under ``channels:`` in config.yaml, and the adapter's :attr:`Channel.name`."""
    settings: type[ChannelSettings]
    adapter: str
    """``module:Class`` of the :class:`Channel`, imported only when the channel is built."""
    single_consumer: bool = False
    """The platform allows one inbound connection per bot (Telegram's long polling, Discord's
    gateway for one shard): with several daemons, only the leader runs it (gateway/daemon/cluster.py)."""
    keeps_state: bool = False
    """The adapter keeps a small file in the data directory (Matrix's sync token): it gets
    ``state_dir`` besides its settings."""

    def build(self, settings: ChannelSettings, state_dir: str = "") -> Channel:
        """The adapter, each field of the settings model passed to the constructor parameter of the
        same name (secrets unwrapped, a missing credential as ``""``)."""
        module, _, name = self.adapter.partition(":")
        cls: type[Channel] = getattr(importlib.import_module(module), name)
        values = {field: getattr(settings, field) for field in self.settings.model_fields}
        for field, value in values.items():
            if field in self.settings.required or isinstance(value, SecretStr):
                values[field] = settings.plain(field)
        if self.keeps_state:
            values["state_dir"] = state_dir
        return cls(**values)


PLATFORMS: tuple[Platform, ...] = (
    Platform("telegram", TelegramSettings, "channels.telegram.channel:TelegramChannel", single_consumer=True),
    Platform("slack", SlackSettings, "channels.slack.channel:SlackChannel"),
    Platform("discord", DiscordSettings, "channels.discord.channel:DiscordChannel", single_consumer=True),
    Platform("lark", LarkSettings, "channels.lark.channel:LarkChannel"),
    Platform(
        "matrix",
        MatrixSettings,
        "channels.matrix.channel:MatrixChannel",
        single_consumer=True,
        keeps_state=True,
    ),
    Platform("whatsapp", WhatsAppSettings, "channels.whatsapp.channel:WhatsAppChannel"),
    Platform("dingtalk", DingTalkSettings, "channels.dingtalk.channel:DingTalkChannel"),
    # One long connection per robot: a second subscription takes the stream over (docs/setup/wecom.md).
    Platform("wecom", WeComSettings, "channels.wecom.channel:WeComChannel", single_consumer=True),
)


def sdk_loggers() -> list[str]:
    """Every registered platform's SDK loggers (gateway/ops/logs.py quiets and redacts them)."""
    return [name for p in PLATFORMS for name in p.settings.sdk_loggers]


def channel_readiness(cfg: Config) -> dict[str, tuple[bool, str]]:
    """Per channel: (will start, why / why not). Used by ``chital check`` and start-up logs."""
    out: dict[str, tuple[bool, str]] = {}
    for p in PLATFORMS:
        section = getattr(cfg.channels, p.name)
        missing = section.missing()
        if not section.enabled:
            out[p.name] = (False, f"disabled in config (channels.{p.name}.enabled: false)")
        elif missing:
            out[p.name] = (False, missing)
        else:
            out[p.name] = (True, "credentials present")
    return out


def build_channels(cfg: Config) -> tuple[list[Channel], dict[str, str]]:
    """The adapters of the ready channels, and why each other channel is off."""
    channels: list[Channel] = []
    off: dict[str, str] = {}
    ready = channel_readiness(cfg)
    for p in PLATFORMS:
        ok, why = ready[p.name]
        if ok:
            channels.append(p.build(getattr(cfg.channels, p.name), str(cfg.storage.path)))
        else:
            off[p.name] = why
    return channels, off
