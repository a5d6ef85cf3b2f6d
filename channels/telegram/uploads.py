"""Files the agent sends on Telegram: which Bot API method carries each (a photo shown inline, a
spoken answer as a voice message, anything else as a document) and what to do when Telegram
refuses the nicer form. Telegram has no idempotency key: the gateway's outbox is all."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from telegram import Bot, InputFile, Message, ReplyParameters

from channels.base import OutFile, PermanentSendError, ReplyTarget
from channels.limits import check_size

from .botapi import where
from .render import MAX_CAPTION_UTF16, truncate

log = logging.getLogger(__name__)

UPLOAD_LIMIT = 50 * 1024 * 1024  # the Bot API accepts uploads up to 50 MB
PHOTO_LIMIT = 10 * 1024 * 1024
_PHOTO_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp"})

Api = Callable[[Awaitable[Message]], Awaitable[Message]]
"""The channel's wrapper of a PTB call (its errors turned into the contract's, without the token)."""


async def send_file(api: Api, bot: Bot, target: ReplyTarget, file: OutFile, caption: str) -> str:
    """Images up to 10 MB go as photos (shown inline), a spoken answer (``file.voice``, Ogg Opus)
    as a voice message, anything else, or a photo or voice Telegram refuses, as a document."""
    data, size = file.data, file.size
    check_size(file.name, size, UPLOAD_LIMIT, "Telegram bots upload at most 50 MB")
    kwargs: dict[str, Any] = {**where(target)}
    if caption:
        kwargs["caption"] = truncate(caption, MAX_CAPTION_UTF16)
    if target.reply_to:
        kwargs["reply_parameters"] = ReplyParameters(
            message_id=int(target.reply_to), allow_sending_without_reply=True
        )
    if file.voice and file.suffix == ".ogg":  # a spoken answer: a voice message, played inline
        try:
            msg = await api(bot.send_voice(voice=InputFile(data, filename=file.name), **kwargs))
            return str(msg.message_id)
        except PermanentSendError as exc:  # the user's privacy settings refuse voice messages
            if "VOICE_MESSAGES_FORBIDDEN" not in str(exc).upper():
                raise
            log.info("telegram: voice messages refused by the user; sending the audio as a file")
    if file.suffix in _PHOTO_SUFFIXES and size <= PHOTO_LIMIT:
        try:
            msg = await api(bot.send_photo(photo=InputFile(data, filename=file.name), **kwargs))
            return str(msg.message_id)
        except PermanentSendError as exc:
            log.info("telegram: photo refused (%s); sending as a document", exc)
    msg = await api(bot.send_document(document=InputFile(data, filename=file.name), **kwargs))
    return str(msg.message_id)
