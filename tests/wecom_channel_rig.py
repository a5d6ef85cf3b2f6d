"""WeComChannel run against the fake WeCom, as the adapter's unit and attack tests need it: a sink
that records what the adapter delivers, and the channel running (subscribed) until the test is done.
One home, so no test module imports another and none keeps its own copy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from channels.base import Inbound
from channels.wecom.channel import WeComChannel
from tests.fakes.wecom_server import FakeWeCom


class Sink:
    """Records every inbound the adapter hands over."""

    def __init__(self) -> None:
        self.items: list[Inbound] = []

    async def __call__(self, inbound: Inbound) -> None:
        self.items.append(inbound)


def channel_for(fake: FakeWeCom, **kw: float) -> WeComChannel:
    """The adapter pointed at ``fake``; ``heartbeat`` (0.3 s by default, for the half-open tests)."""
    return WeComChannel(
        fake.bot_id, fake.secret, ws_url=fake.url, heartbeat_interval=kw.pop("heartbeat", 0.3), **kw
    )


@contextlib.asynccontextmanager
async def running(fake: FakeWeCom, sink: Sink, **kw: float) -> AsyncIterator[WeComChannel]:
    """The channel subscribed and reading into ``sink``; stopped and closed afterwards. A channel
    that ended before its subscription (a refused secret) fails the test here, saying why."""
    channel = channel_for(fake, **kw)
    task = asyncio.create_task(channel.run(sink))
    try:
        await fake.wait_for(lambda: fake.connected or task.done(), what="the subscription")
        assert not task.done(), task.exception()
        yield channel
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await channel.close()
