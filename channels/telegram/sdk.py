"""The adapter's reaches into python-telegram-bot's private names, and nothing else.

- ``Bot._post``: a Bot API call whose answer stays raw JSON. getUpdates is parsed by the adapter
  itself (channels/telegram/inbound.py: one unreadable update must not cost the batch), and a sent
  or edited message comes back with the message it replies to, in whatever shape the server uses;
  parsing it (as ``send_message`` does) would fail a delivered reply to a message PTB cannot
  read, and the retry would post it twice. We only need the new ``message_id``. ``_post`` is what
  PTB's own methods call.
- ``RetryAfter._retry_after``: the server's wait as PTB keeps it (a timedelta since 22.2), read
  without the deprecation warning the public ``retry_after`` property raises about its type.

Public fallback (outside :data:`compat.versions.VERIFIED`'s ``python-telegram-bot`` set): raw
calls go through ``Bot.do_api_request`` (public, raw JSON when no ``return_type``; its "use the
method instead" warning is silenced and a 404 it reports as ``EndPointNotFound`` is the
``InvalidToken`` underneath again), and the wait is read from the public ``retry_after``.
"""

from __future__ import annotations

import warnings
from typing import Any

from telegram import Bot
from telegram import error as tg

from compat.versions import usable

DISTRIBUTION = "python-telegram-bot"


async def post(bot: Bot, endpoint: str, params: dict[str, Any], *, read_timeout: float | None = None) -> Any:
    """The Bot API's answer to ``endpoint`` with ``params``, as the JSON it sent (see the module
    docstring); ``read_timeout`` as PTB's own methods take it."""
    timeout: Any = {} if read_timeout is None else {"read_timeout": read_timeout}
    if usable(DISTRIBUTION):
        return await bot._post(endpoint, dict(params), **timeout)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return await bot.do_api_request(endpoint, api_kwargs=dict(params), **timeout)
    except tg.EndPointNotFound as exc:
        if isinstance(exc.__cause__, tg.InvalidToken):
            raise exc.__cause__ from None
        raise


def retry_after_value(exc: tg.RetryAfter) -> Any:
    """How long the server asked to wait (a timedelta or a number of seconds)."""
    value = getattr(exc, "_retry_after", None) if usable(DISTRIBUTION) else None  # PTB ≥22.2
    if value is None:
        with warnings.catch_warnings():  # the public property warns about its type changing
            warnings.simplefilter("ignore")
            value = exc.retry_after
    return value
