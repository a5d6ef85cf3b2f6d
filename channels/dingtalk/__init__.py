"""DingTalk channel adapter (Stream mode through the official ``dingtalk-stream`` SDK's frames)."""

from typing import TYPE_CHECKING

from channels import lazy_exports

from .settings import DingTalkSettings

if TYPE_CHECKING:
    from .channel import DingTalkChannel

__all__ = ["DingTalkChannel", "DingTalkSettings"]
__getattr__ = lazy_exports(__name__, {"DingTalkChannel": ".channel"})
