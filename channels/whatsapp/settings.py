"""WhatsApp's keys under ``channels.whatsapp`` in config.yaml."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from channels.settings import ChannelSettings


class WhatsAppSettings(ChannelSettings):
    """A WhatsApp Business phone number on Meta's Cloud API (docs/setup/whatsapp.md). Meta delivers
    messages by calling a webhook: the daemon serves it on the hooks listener (``hooks.host`` /
    ``hooks.port``), which must be reachable from the internet over HTTPS (a reverse proxy or a
    tunnel in front of it)."""

    required: ClassVar[dict[str, str]] = {
        "phone_number_id": "WHATSAPP_PHONE_NUMBER_ID",
        "access_token": "WHATSAPP_ACCESS_TOKEN",
        "app_secret": "WHATSAPP_APP_SECRET",
        "verify_token": "WHATSAPP_VERIFY_TOKEN",
    }

    phone_number_id: str = Field("", pattern=r"^[0-9]{0,32}$")
    """The business phone number's id (App Dashboard > WhatsApp > API Setup), not the number."""
    access_token: SecretStr | None = None
    """A system user's access token with ``whatsapp_business_messaging`` (never logged; a revoked
    one, Graph error 190, stops the channel: see /readyz)."""
    app_secret: SecretStr | None = None
    """The Meta app's secret: each webhook delivery's ``X-Hub-Signature-256`` is checked with it."""
    verify_token: SecretStr | None = None
    """A string of your choosing, typed into the webhook settings too: Meta's verification request
    must echo it before the webhook is accepted."""
    graph_url: str = Field("https://graph.facebook.com", pattern=r"^https?://[^\s/]+(:[0-9]+)?/?$")
    """Base URL of the Graph API (tests point it at a fake)."""
    api_version: str = Field("v21.0", pattern=r"^v[0-9]{1,3}\.[0-9]{1,2}$")
    """The Graph API version every call names."""
    max_body_bytes: int = Field(3_000_000, ge=1024, le=25_000_000)
    """Largest webhook body accepted; a larger one gets 413 unread (and is counted)."""
    read_seconds: float = Field(10.0, gt=0, le=120)
    """Time a caller has to send a webhook body once its headers are in (a slow-loris gets 408)."""
