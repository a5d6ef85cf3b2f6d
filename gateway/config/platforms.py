"""The one table of chat platforms, and the channels the gateway builds from it.

A platform is a package under channels/ (docs/channels.md) and one row of :data:`PLATFORMS`: its key
under ``channels:`` in config.yaml, its settings model (gateway/config/schema.py composes the ``channels``
section from this table) and its adapter class. Readiness, secrets and SDK loggers come from the
settings model, so adding a platform touches its own folder and this table only.

Adapters are imported lazily: a platform that is off costs neither import time nor memory."""

from __future__ import annotations

import importlib
import re
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
from channels.web import WebSettings
from channels.wecom import WeComSettings
from channels.whatsapp import WhatsAppSettings
from gateway.config.sections import AccessPolicy

if TYPE_CHECKING:
    from gateway.config.schema import Config


NEVER = "(?!)"
"""A pattern nothing matches."""


@dataclass(frozen=True, slots=True)
class IdShape:
    """How an id looks on a platform: checked before ``chital send`` journals a push to it (a typo
    must not sit in the journal for hours of retries), and how to say it to the operator."""

    pattern: str
    """A full-match regular expression (ASCII)."""
    said: str
    """The shape in words, e.g. "a number, e.g. 123456789"."""


@dataclass(frozen=True, slots=True)
class Platform:
    name: str
    """The key under ``channels:`` in config.yaml, and the adapter's :attr:`Channel.name`."""
    settings: type[ChannelSettings]
    adapter: str
    """``module:Class`` of the :class:`Channel`, imported only when the channel is built."""
    chat_ids: IdShape
    """What a chat id of this platform looks like (``chital send PLATFORM:CHAT``)."""
    direct_ids: str = NEVER
    """A chat id that fully matches this is a one-to-one chat (a push to it is not in a group);
    :data:`NEVER` where the id's shape cannot tell (WeCom: a user's id and a group's look alike)."""
    thread_ids: IdShape | None = None
    """What a thread id looks like, where a push can be posted into a thread directly."""
    dm_names_user: bool = False
    """A one-to-one chat's id is its user's id (Telegram, WhatsApp, DingTalk, WeCom), so a hook may
    target an allowed user's direct chat by that user's id; elsewhere (a Slack ``D…`` id, a Matrix
    room) the chat itself must be allowed."""
    single_consumer: bool = False
    """The platform allows one inbound connection per bot (Telegram's long polling, Discord's
    gateway for one shard): with several daemons, only the leader runs it (gateway/daemon/cluster.py)."""
    keeps_state: bool = False
    """The adapter keeps a small file in the data directory (Matrix's sync token): it gets
    ``state_dir`` besides its settings."""
    on_by_default: bool = False
    """Runs without a ``channels.<name>`` section in config.yaml (the web chat: it is a page of the
    console, and needs no credentials of its own)."""
    needs_console: bool = False
    """Runs only while the console is on (an admin token is set): its people log in there."""
    default_access: AccessPolicy | None = None
    """The access policy when ``channels.<name>.access`` is not set, instead of the top-level one
    (the web chat: its people are the console's, authenticated by its login)."""
    keeps_room: bool = False
    """The platform's messages live in the daemon's database (the web chat): the adapter gets the
    store as its ``room`` (channels/web/room.py)."""

    def build(self, settings: ChannelSettings, state_dir: str = "", room: object = None) -> Channel:
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
        if self.keeps_room:
            values["room"] = room
        return cls(**values)


PLATFORMS: tuple[Platform, ...] = (
    Platform(
        "telegram",
        TelegramSettings,
        "channels.telegram.channel:TelegramChannel",
        IdShape(r"-?\d{1,20}", "a number, e.g. 123456789 or -1001234567890"),
        direct_ids=r"\d+",
        thread_ids=IdShape(r"\d{1,12}", "a forum topic id (a number)"),
        single_consumer=True,
        dm_names_user=True,
    ),
    Platform(
        "slack",
        SlackSettings,
        "channels.slack.channel:SlackChannel",
        IdShape(r"[CDG][A-Z0-9]{4,30}", "a channel id like C0123ABCD (not a #name)"),
        direct_ids=r"D.*",
        thread_ids=IdShape(r"\d{9,12}\.\d{1,9}", "a thread ts like 1700000000.123456"),
    ),
    Platform(
        "discord",
        DiscordSettings,
        "channels.discord.channel:DiscordChannel",
        IdShape(r"\d{15,22}", "a channel id (a snowflake number)"),
        thread_ids=IdShape(r"\d{15,22}", "a thread's channel id (a snowflake number)"),
        single_consumer=True,
    ),
    # Lark has no thread ids to post into: the API posts into a thread only as a reply to one of its messages.
    Platform(
        "lark",
        LarkSettings,
        "channels.lark.channel:LarkChannel",
        IdShape(r"oc_[A-Za-z0-9]{4,64}", "a chat id like oc_a0553eda9014c201e6969b478895c230"),
    ),
    # Room ids are "!opaque:server" (room versions up to 11) or "!hash" (version 12 drops the server).
    Platform(
        "matrix",
        MatrixSettings,
        "channels.matrix.channel:MatrixChannel",
        IdShape(
            r"![A-Za-z0-9._~=+/-]{1,255}(:[A-Za-z0-9.-]{1,255}(:\d{1,5})?)?",
            "a room id like !AbCdEf:example.org",
        ),
        single_consumer=True,
        keeps_state=True,
    ),
    # A user's phone number in international form without "+", or a group id of the Groups API.
    Platform(
        "whatsapp",
        WhatsAppSettings,
        "channels.whatsapp.channel:WhatsAppChannel",
        IdShape(
            r"\d{7,15}|[A-Za-z][A-Za-z0-9_=-]{7,127}", "a phone number like 15551234567 (no +), or a group id"
        ),
        direct_ids=r"\d+",
        dm_names_user=True,
    ),
    # A group's open conversation id starts with "cid"; anything else is a user's staff id.
    Platform(
        "dingtalk",
        DingTalkSettings,
        "channels.dingtalk.channel:DingTalkChannel",
        IdShape(
            r"cid[A-Za-z0-9+/=_-]{4,128}|[A-Za-z0-9_-]{1,64}", "a staff id, or a group's id like cidAbC…=="
        ),
        direct_ids=r"(?!cid)[A-Za-z0-9_-]+",
        dm_names_user=True,
    ),
    # One long connection per robot: a second subscription takes the stream over (docs/setup/wecom.md).
    # aibot_send_msg takes a user's id in one-to-one chats and the group's chat id in groups.
    Platform(
        "wecom",
        WeComSettings,
        "channels.wecom.channel:WeComChannel",
        IdShape(r"[A-Za-z0-9_.@-]{1,64}", "a user id, or a group's chat id"),
        single_consumer=True,
        dm_names_user=True,
    ),
    # The console's chat page: "<person>~<12 hex>", every chat one person's with the bot.
    Platform(
        "web",
        WebSettings,
        "channels.web.channel:WebChannel",
        IdShape(r"[a-z0-9_-]{1,32}~[0-9a-f]{12}", "a web chat id like admin~0123456789ab (see the console)"),
        direct_ids=r".*",
        on_by_default=True,
        needs_console=True,
        default_access=AccessPolicy(allow_users=["web:admin"], admins=["web:admin"], pairing=False),
        keeps_room=True,
    ),
)


def platform_named(name: str) -> Platform | None:
    """The registry row of platform ``name``, or None."""
    return next((p for p in PLATFORMS if p.name == name), None)


def is_direct(platform: str, chat_id: str) -> bool:
    """Whether ``chat_id`` is a one-to-one chat on ``platform``, as far as its shape tells (a
    message the daemon starts itself, a push or a hook's turn, has no platform event to say so)."""
    row = platform_named(platform)
    return row is not None and re.fullmatch(row.direct_ids, chat_id, re.ASCII) is not None


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
        elif p.needs_console and cfg.console.admin_token() is None:
            out[p.name] = (False, "the console is off (set console.token or $CHITAL_CONSOLE_TOKEN)")
        elif missing:
            out[p.name] = (False, missing)
        else:
            out[p.name] = (True, "credentials present")
    return out


def build_channels(cfg: Config, room: object = None) -> tuple[list[Channel], dict[str, str]]:
    """The adapters of the ready channels, and why each other channel is off. ``room``: the store,
    for a platform whose messages the daemon keeps (:attr:`Platform.keeps_room`)."""
    channels: list[Channel] = []
    off: dict[str, str] = {}
    ready = channel_readiness(cfg)
    for p in PLATFORMS:
        ok, why = ready[p.name]
        if ok:
            channels.append(p.build(getattr(cfg.channels, p.name), str(cfg.storage.path), room))
        else:
            off[p.name] = why
    return channels, off
