"""What the end-to-end tests of a Discord daemon share: the users the config allows or refuses, and
how to wait for the reply a user would see. One home, so no test module imports another."""

from __future__ import annotations

from tests.fakes.discord_server import FakeDiscord, PostedMessage

FRIEND = "424242424242424242"
STRANGER = "666666666666666666"


def replies(dc: FakeDiscord, mid: str) -> list[PostedMessage]:
    """The bot's messages answering ``mid``: the first part references it, later parts follow it."""
    first = [m for m in dc.bot_messages() if m.reply_to == mid]
    if not first:
        return []
    after = [
        m for m in dc.bot_messages(first[0].channel_id) if int(m.id) > int(first[0].id) and m.reply_to is None
    ]
    return first + after


async def answered(dc: FakeDiscord, mid: str, needle: str, timeout: float = 15) -> PostedMessage:
    def check() -> PostedMessage | None:
        return next((m for m in replies(dc, mid) if needle in m.content), None)

    return await dc.wait_for(check, timeout=timeout)
