"""WeCom's keys under ``channels.wecom`` in config.yaml."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from channels.settings import ChannelSettings

DEFAULT_WS_URL = "wss://openws.work.weixin.qq.com"
"""The long connection's address (the official SDKs' built-in default; a privately deployed WeCom
shows its own in the admin console)."""


class WeComSettings(ChannelSettings):
    """A WeCom (WeChat Work) intelligent robot (智能机器人) in long-connection API mode: its bot id
    and secret (docs/setup/wecom.md). The daemon dials out to WeCom's websocket, so it needs no
    public address."""

    required: ClassVar[dict[str, str]] = {"bot_id": "WECOM_BOT_ID", "secret": "WECOM_BOT_SECRET"}

    bot_id: str = ""
    """The robot's Bot ID (智能机器人 → API 模式 → 长连接), sent with every subscription."""
    secret: SecretStr | None = None
    """The robot's long-connection Secret (never logged; a refused one stops the channel, see /readyz)."""
    ws_url: str = DEFAULT_WS_URL
    """The websocket address; change it only for a privately deployed WeCom (or a test's fake)."""
    heartbeat_interval: float = Field(30.0, ge=1.0, le=300.0)
    """Seconds between the ``ping`` frames that keep the connection alive; two unanswered pings in a
    row count as a dead (half-open) connection, which is dropped and dialled again."""
    reply_window: float = Field(330.0, ge=5.0, le=360.0)
    """Seconds after a message during which the answer streams into WeCom's reply to it; WeCom
    refuses stream updates after 6 minutes (errcode 846608). Later answers are sent proactively
    (``aibot_send_msg``) as one message each, without streaming."""
