"""Telegram channel adapter (python-telegram-bot 22.8, long polling)."""

from typing import TYPE_CHECKING

from channels import lazy_exports

from .settings import TelegramSettings

if TYPE_CHECKING:
    from .channel import TelegramChannel

__all__ = ["TelegramChannel", "TelegramSettings"]
__getattr__ = lazy_exports(__name__, {"TelegramChannel": ".channel"})
