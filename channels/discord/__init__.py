"""Discord channel adapter (discord.py's gateway client, REST replies)."""

from .channel import DiscordChannel

__all__ = ["DiscordChannel"]
