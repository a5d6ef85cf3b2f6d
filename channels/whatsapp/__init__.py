"""WhatsApp Business Cloud API channel adapter (Graph API over aiohttp, webhooks on the hooks listener)."""

from typing import TYPE_CHECKING

from channels import lazy_exports

from .settings import WhatsAppSettings

if TYPE_CHECKING:
    from .channel import WhatsAppChannel

__all__ = ["WhatsAppChannel", "WhatsAppSettings"]
__getattr__ = lazy_exports(__name__, {"WhatsAppChannel": ".channel"})
