"""Web chat: the console's chat page as one more channel (docs/console.md, "Web chat")."""

from typing import TYPE_CHECKING

from channels import lazy_exports

from .settings import WebSettings

if TYPE_CHECKING:
    from .channel import WebChannel

__all__ = ["WebChannel", "WebSettings"]
__getattr__ = lazy_exports(__name__, {"WebChannel": ".channel"})
