"""DingTalk's keys under ``channels.dingtalk`` in config.yaml."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from channels.settings import ChannelSettings


class DingTalkSettings(ChannelSettings):
    """An internal app's robot in Stream mode (docs/setup/dingtalk.md): the daemon opens an
    outbound websocket to DingTalk, so it needs no public address."""

    required: ClassVar[dict[str, str]] = {
        "client_id": "DINGTALK_CLIENT_ID",
        "client_secret": "DINGTALK_CLIENT_SECRET",
    }
    sdk_loggers: ClassVar[tuple[str, ...]] = ("dingtalk_stream",)

    client_id: str = ""
    """The app's Client ID (formerly AppKey), e.g. ``dingxxxxxxxx``."""
    client_secret: SecretStr | None = None
    """The app's Client Secret (formerly AppSecret); never logged. A revoked one stops the channel
    (see /readyz)."""
    robot_code: str = ""
    """The robot's code for the robot OpenAPI; empty: the Client ID (what DingTalk gives an internal
    app's robot)."""
    api_base: str = "https://api.dingtalk.com"
    """Base URL of DingTalk's OpenAPI (the Stream gateway's ``connections/open`` is under it too)."""
    oapi_base: str = "https://oapi.dingtalk.com"
    """Base URL of DingTalk's older API, where robot files are uploaded (``/media/upload``)."""
    card_template_id: str = ""
    """A card template (DingTalk's card platform) to send every message as a card and stream the
    answer into it; empty: plain Markdown messages, an answer arrives as one final message."""
    card_content_key: str = "content"
    """The template's Markdown variable that holds the text."""
    button_template_id: str = ""
    """A card template with buttons (DingTalk's card platform; docs/setup/dingtalk.md, "Buttons") to
    ask approvals and choices with: its ``card_content_key`` Markdown variable holds the question,
    its ``button_list_key`` list the buttons, each calling back over Stream. Empty: no buttons, the
    answer is typed (``approve CODE``, a number)."""
    button_list_key: str = "buttons"
    """The button template's loop variable: a JSON list of ``{"text", "color", "value"}``; each
    button's callback carries its ``value`` in ``params.value``."""
    keepalive: int = Field(20, ge=1, le=300)
    """Seconds between websocket pings; a connection that answers none for as long again is
    half-open and is made anew (nothing is lost: unacknowledged frames come again)."""
