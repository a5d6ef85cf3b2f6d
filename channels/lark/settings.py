"""Feishu / Lark's keys under ``channels.lark`` in config.yaml."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from channels.settings import ChannelSettings


class LarkSettings(ChannelSettings):
    """A custom app's id and secret; the long connection (websocket) needs no public address."""

    required: ClassVar[dict[str, str]] = {"app_id": "LARK_APP_ID", "app_secret": "LARK_APP_SECRET"}
    # "websockets.client" logs the handshake request line, connection ticket included, at DEBUG.
    sdk_loggers: ClassVar[tuple[str, ...]] = ("Lark", "websockets.client")

    app_id: str | None = None
    app_secret: SecretStr | None = None
    domain: str = "feishu"
    """``feishu``, ``lark`` or a full base URL (``https://open.feishu.cn``)."""
    liveness_timeout: float = Field(45.0, gt=0)
    """Seconds without any frame before the connection counts as dead (pings go every third of it)."""
