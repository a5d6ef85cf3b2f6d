"""WeCom (WeChat Work) intelligent-robot channel adapter: the long connection (websocket) spoken
directly with aiohttp (docs/setup/wecom.md says why not the official SDK)."""

from typing import TYPE_CHECKING

from channels import lazy_exports

from .settings import WeComSettings

if TYPE_CHECKING:
    from .channel import WeComChannel

__all__ = ["WeComChannel", "WeComSettings"]
__getattr__ = lazy_exports(__name__, {"WeComChannel": ".channel"})
