"""Matrix's keys under ``channels.matrix`` in config.yaml."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from channels.settings import ChannelSettings


class MatrixSettings(ChannelSettings):
    """A bot account on any homeserver: its user id and an access token (docs/setup/matrix.md).
    The daemon syncs by long polling, so it needs no public address."""

    required: ClassVar[dict[str, str]] = {
        "homeserver": "MATRIX_HOMESERVER",
        "user_id": "MATRIX_USER_ID",
        "access_token": "MATRIX_ACCESS_TOKEN",
    }
    sdk_loggers: ClassVar[tuple[str, ...]] = ("nio",)

    homeserver: str = ""
    """Base URL of the bot's homeserver (``https://matrix.example.org``), not the server name."""
    user_id: str = ""
    """The bot's full user id (``@chital:example.org``)."""
    access_token: SecretStr | None = None
    """The bot's access token (never logged; a revoked one stops the channel, see /readyz)."""
    device_id: str = ""
    """The device the access token belongs to (optional; shown by whoami)."""
    sync_timeout: int = Field(30, ge=1, le=120)
    """Seconds one sync long poll waits for new events."""
    display_name: str = ""
    """A name that addresses the bot in rooms besides its user id; empty: the profile's name."""
