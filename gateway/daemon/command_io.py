"""What a chat command may do with the platform beyond its text reply: fetch a file the message
carries (``/skills install``) and post buttons (``/skills show`` under a draft). Closures over the
Gateway's channels, handed to the command context (gateway/commands/registry.py), so a command
never holds a channel."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from channels.base import Attachment, Button, Channel, ChannelError, Inbound

log = logging.getLogger(__name__)


def downloader(channels: Mapping[str, Channel]) -> Callable[[Inbound, Attachment, int], Awaitable[bytes]]:
    async def download(inbound: Inbound, attachment: Attachment, limit: int) -> bytes:
        """One file of ``inbound`` from its platform, at most ``limit`` bytes (else ChannelError)."""
        return await channels[inbound.platform].download(attachment, limit)

    return download


def button_poster(
    channels: Mapping[str, Channel],
) -> Callable[[Inbound, str, Sequence[Button], str], Awaitable[bool]]:
    async def post(inbound: Inbound, text: str, buttons: Sequence[Button], key: str) -> bool:
        """``text`` with ``buttons`` in reply to ``inbound``, once per ``key``; False where the
        platform has no buttons or refused them (the text answer still works)."""
        channel = channels.get(inbound.platform)
        if channel is None or not channel.capabilities.buttons:
            return False
        try:
            await channel.send_buttons(inbound.target, channel.render(text)[0], buttons, idempotency_key=key)
        except ChannelError as exc:  # a Lark app without cards
            log.warning("could not post buttons for %s: %s", key, exc)
            return False
        return True

    return post
