"""Telegram channel adapter (python-telegram-bot 22.8, long polling)."""

from channels.telegram.channel import TelegramChannel
from channels.telegram.render import render_markdown

__all__ = ["TelegramChannel", "render_markdown"]
