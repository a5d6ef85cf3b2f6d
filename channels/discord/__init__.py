"""Discord channel adapter (discord.py's gateway client in, REST replies out)."""

from typing import TYPE_CHECKING

from channels import lazy_exports

from .settings import DiscordSettings

if TYPE_CHECKING:
    from .channel import DiscordChannel

__all__ = ["DiscordChannel", "DiscordSettings"]
__getattr__ = lazy_exports(__name__, {"DiscordChannel": ".channel"})
