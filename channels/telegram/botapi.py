"""The Bot API's vocabulary, as pure functions: the parameters a reply target becomes, the reactions
Telegram allows, what it lets bots download, and how python-telegram-bot's errors map onto the
channel contract's (with the token scrubbed from every text).

Kept apart from :mod:`channels.telegram.channel`, which holds the state (the ``Bot``, the token, the
long-poll offset) and the order of calls, so that these translations read, and change, in one
place. The raw JSON call itself goes through :mod:`channels.telegram.sdk` (the vendor boundary).
"""

from __future__ import annotations

from typing import Any

import httpx
from telegram import Bot, LinkPreviewOptions
from telegram import error as tg
from telegram.constants import ReactionEmoji

from channels.base import (
    ChannelError,
    FatalChannelError,
    NotModified,
    PermanentSendError,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
    scrub,
)
from channels.limits import check_size, retry_after

from . import sdk

TOKEN_REJECTED = "Telegram rejected the bot token (401)"
GETFILE_LIMIT = 20 * 1024 * 1024  # the Bot API serves bots files up to 20 MB
NO_PREVIEW = LinkPreviewOptions(is_disabled=True)
# Reactions must come from Telegram's fixed list; common status emoji map to the nearest allowed one.
REACTIONS = {e.value.replace("\ufe0f", ""): e.value for e in ReactionEmoji}
REACTION_ALIASES = {"✅": "👌", "✔": "👌", "☑": "👌", "⏳": "👀", "⌛": "👀", "🔄": "👀", "❌": "👎",
                    "🚫": "👎", "💭": "🤔"}  # fmt: skip
ANSWER_LOST = (httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError)
"""httpx failures after the request was written: Telegram may have acted on it (PTB keeps the
httpx error as the ``__cause__`` of its TimedOut / NetworkError). A refused or timed-out connect, a
full pool or an error answer (5xx) mean it did not."""


def map_error(exc: tg.TelegramError, token: str) -> ChannelError:
    """A PTB error as the contract's error, its text without ``token``."""
    text = error_text(exc, token)
    if isinstance(exc, tg.RetryAfter):
        return RetryAfter(retry_seconds(exc), "Telegram rate limit")
    if isinstance(exc, tg.InvalidToken):
        return FatalChannelError(TOKEN_REJECTED)
    if isinstance(exc, tg.BadRequest):  # before NetworkError: BadRequest subclasses it
        if "message is not modified" in text.lower():
            return NotModified(text)
        return PermanentSendError(text)
    if isinstance(exc, tg.Forbidden | tg.ChatMigrated):
        return PermanentSendError(text)
    return TransientSendError(text, maybe_sent=isinstance(exc.__cause__, ANSWER_LOST))


def error_text(exc: BaseException | str, token: str) -> str:
    return scrub(str(exc) or type(exc).__name__, token)


def retry_seconds(exc: tg.RetryAfter) -> float:
    return retry_after(sdk.retry_after_value(exc))


async def post(bot: Bot, endpoint: str, params: dict[str, Any]) -> Any:
    """A Bot API call whose answer stays raw JSON (channels/telegram/sdk.py says why)."""
    return await sdk.post(bot, endpoint, params)


def chat(chat_id: str) -> int | str:
    """Numeric chat ids as ints; ``@channelusername`` stays a string."""
    return int(chat_id) if chat_id.lstrip("-").isdigit() else chat_id


def where(target: ReplyTarget) -> dict[str, Any]:
    """The chat (and forum topic) a reply goes to, as Bot API parameters."""
    params: dict[str, Any] = {"chat_id": chat(target.chat_id)}
    if target.thread_id:
        params["message_thread_id"] = int(target.thread_id)
    return params


def reaction(emoji: str) -> str | None:
    """The allowed reaction ``emoji`` is or stands for, or None (Telegram would refuse it)."""
    key = emoji.replace("\ufe0f", "")
    return REACTIONS.get(key) or REACTIONS.get(REACTION_ALIASES.get(key, ""))


def check_download(name: str, size: int | None, limit: int) -> None:
    check_size(name, size, limit)
    check_size(name, size, GETFILE_LIMIT, "Telegram lets bots download at most 20 MB")
