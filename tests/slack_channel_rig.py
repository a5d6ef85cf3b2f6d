"""SlackChannel run against the fake Slack, as the adapter and crash-window tests need it: a sink that
records (or fails, or holds) what the adapter delivers, and the channel running until the test is done.
One home, so no test module imports another."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from channels.base import ChannelState, Inbound
from channels.slack import SlackChannel
from gateway.ops.supervisor import run_once
from tests.fakes.slack_server import FakeSlack

PING = 0.4  # small ping interval keeps reconnect tests fast


class Sink:
    """Records what the adapter delivered; can fail or hold the next calls."""

    def __init__(self) -> None:
        self.items: list[Inbound] = []
        self.fail_next = 0
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def __call__(self, inbound: Inbound) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("journal unavailable")
        self.items.append(inbound)

    def keys(self) -> list[str]:
        return [i.key for i in self.items]


def make_channel(fake: FakeSlack, *, app_token: str | None = None) -> SlackChannel:
    return SlackChannel(
        fake.bot_token, app_token or fake.app_token, api_base_url=fake.api_base_url, ping_interval=PING
    )


@contextlib.asynccontextmanager
async def running(fake: FakeSlack, sink: Sink) -> AsyncIterator[SlackChannel]:
    channel = make_channel(fake)
    task = asyncio.create_task(run_once(channel, sink))
    try:
        await fake.wait_for(lambda: channel.state is ChannelState.CONNECTED or task.done(), 10)
        if task.done():
            task.result()
        yield channel
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await channel.close()
