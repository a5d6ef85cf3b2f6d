"""A leadership change on Discord moves the gateway session, not the sending side (issue 27 item 3).

Two DiscordChannels in one process stand for two daemons of one bot, each under its own
ChannelSupervisor, driven by real discord.py against the fake Discord. ``switch`` is what the
cluster calls when this daemon becomes or stops being the leader (gateway/daemon/standby.py). The
fake holds the answer of a send or an edit that has taken effect, so the switch happens while the
bot waits for it: the call must come back over the same HTTP session, once, with no retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from channels.base import ChannelState, Inbound, Rendered, ReplyTarget
from channels.discord import DiscordChannel
from gateway.ops.metrics import Metrics
from gateway.ops.supervisor import Backoff, ChannelSupervisor
from tests.fakes.discord_server import FakeDiscord

USER = "900000000000000077"

pytestmark = pytest.mark.usefixtures("discord_endpoints_restored")


@dataclass
class Daemon:
    """One daemon's Discord channel under its supervisor, and what its sink was handed."""

    channel: DiscordChannel
    sup: ChannelSupervisor
    inbox: list[Inbound] = field(default_factory=list)

    def texts(self) -> list[str]:
        return [m.text for m in self.inbox]


def _daemon(dc: FakeDiscord, *, receive: bool) -> Daemon:
    channel = DiscordChannel(dc.token, api_base_url=dc.api_base_url, gateway_url=dc.gateway_url)
    inbox: list[Inbound] = []

    async def sink(message: Inbound) -> None:
        inbox.append(message)

    channel.receive = receive
    sup = ChannelSupervisor(channel, sink, Metrics(), Backoff(0.05, 0.4))
    sup.start()
    return Daemon(channel, sup, inbox)


@pytest.fixture
async def pair(dc: FakeDiscord) -> AsyncIterator[tuple[Daemon, Daemon]]:
    """A leader (gateway) and a standby (REST only), both connected."""
    leader = _daemon(dc, receive=True)
    await dc.wait_for(lambda: leader.channel.state is ChannelState.CONNECTED and dc.connected, 15)
    standby = _daemon(dc, receive=False)
    await dc.wait_for(lambda: standby.channel.state is ChannelState.CONNECTED, 15)
    yield leader, standby
    for d in (leader, standby):
        await d.sup.close()


def ids(d: Daemon) -> list[str]:
    return [m.message_id for m in d.inbox]


def _target(dc: FakeDiscord) -> ReplyTarget:
    return ReplyTarget(platform="discord", chat_id=dc.dm_channel(USER))


async def _receives(dc: FakeDiscord, text: str, receiver: Daemon, other: Daemon) -> None:
    """``text`` sent by the user reaches ``receiver``'s sink, and (a later message reaching it
    first, in order) never ``other``'s."""
    await dc.inject_dm(USER, text)
    await dc.wait_for(lambda: text in receiver.texts(), 15)
    marker = f"{text} (after)"
    await dc.inject_dm(USER, marker)
    await dc.wait_for(lambda: marker in receiver.texts(), 15)
    assert text not in other.texts() and marker not in other.texts()


async def test_a_send_and_an_edit_under_way_go_on_across_a_leadership_change(
    dc: FakeDiscord, pair: tuple[Daemon, Daemon]
) -> None:
    """The standby's answer reached Discord, its response is held; meanwhile the leader steps
    down (its streaming edit held too) and the standby becomes the leader. Both calls come back
    over the HTTP session they were made on: one POST for the answer, the edit applied once, and
    neither fails. (The old code closed the whole client: both were cut, and failed.)"""
    old, new = pair
    await _receives(dc, "before the change", old, new)
    assert dc.identifies == 1, "the standby opened no gateway session"
    target = _target(dc)
    first = await old.channel.send(target, Rendered("draft", {}), idempotency_key="k-old")
    edit_held = dc.hold_answer("PATCH", lambda p: p.get("content") == "final words")
    send_held = dc.hold_answer("POST", lambda p: p.get("content") == "the standby's answer")
    edit = asyncio.create_task(old.channel.edit(target, first, Rendered("final words", {})))
    send = asyncio.create_task(
        new.channel.send(target, Rendered("the standby's answer", {}), idempotency_key="k-new")
    )
    await dc.wait_for(lambda: dc.holding == 2, 15)

    await old.sup.switch(receive=False)  # as the cluster does: the old leader steps down ...
    await new.sup.switch(receive=True)  # ... and the new one takes the gateway
    await dc.wait_for(lambda: dc.identifies == 2 and dc.connected, 15)
    await dc.wait_for(lambda: new.channel.state is ChannelState.CONNECTED, 15)
    assert old.channel.state is ChannelState.CONNECTED  # still connected, for sending
    await asyncio.sleep(0.5)  # a cut call fails at once; one that goes on is still waiting
    assert not send.done() and not edit.done()
    edit_held.set()
    send_held.set()
    sent_id = await asyncio.wait_for(send, 15)
    await asyncio.wait_for(edit, 15)

    answers = [m for m in dc.bot_messages() if m.content == "the standby's answer"]
    assert [m.id for m in answers] == [sent_id]
    assert sum(n for k, n in dc.message_posts.items() if k != "None") == 2, dc.message_posts  # no retry
    assert dc.message(first)["content"] == "final words"

    await _receives(dc, "after the change", new, old)
    # Both daemons still send, each over its own session.
    await old.channel.send(target, Rendered("from the standby", {}), idempotency_key="k-old-2")
    await new.channel.send(target, Rendered("from the leader", {}), idempotency_key="k-new-2")
    assert dc.max_open_sessions == 1, "never two gateway sessions at once"
    assert dc.open_sessions() == 1


async def test_leadership_goes_back_and_forth_on_one_login(
    dc: FakeDiscord, pair: tuple[Daemon, Daemon]
) -> None:
    """Each change opens a fresh gateway session on the new leader (an IDENTIFY, a READY whose
    cache replaces the last), logs in no second time, and the one that stepped down receives
    nothing more: messages and application commands reach the new leader only."""
    a, b = pair
    logins = sum(1 for m, p in dc.rest_calls if m == "GET" and p.endswith("/users/@me"))
    for n, (down, up) in enumerate(((a, b), (b, a), (a, b)), start=2):
        await down.sup.switch(receive=False)
        await up.sup.switch(receive=True)
        await dc.wait_for(lambda: dc.identifies == n and dc.connected, 15)  # noqa: B023
        await _receives(dc, f"change {n}", up, down)
        iid = await dc.run_command(USER, "help")  # an application command: answered by the leader
        await dc.wait_for(lambda: iid in dc.interaction_responses and iid in ids(up), 15)  # noqa: B023
        assert iid not in ids(down)
        assert up.channel.state is ChannelState.CONNECTED and down.channel.state is ChannelState.CONNECTED
    assert sum(1 for m, p in dc.rest_calls if m == "GET" and p.endswith("/users/@me")) == logins
    assert dc.max_open_sessions == 1


async def test_a_step_down_during_the_gateway_handshake_leaves_no_session_open(dc: FakeDiscord) -> None:
    """A step-down that lands after this daemon identified but before its READY arrived closes
    that connection too: no session of the former leader lingers beside the next leader's (its
    heartbeat thread would keep it open until the heartbeat timeout)."""
    d = _daemon(dc, receive=False)
    try:
        await dc.wait_for(lambda: d.channel.state is ChannelState.CONNECTED, 15)
        for n in range(1, 4):
            ready = dc.hold_ready()
            await d.sup.switch(receive=True)
            await dc.wait_for(lambda: dc.identifies == 2 * n - 1, 15)  # noqa: B023
            await d.sup.switch(receive=False)  # caught before its READY
            await dc.wait_for(lambda: dc.gateway_connections == 0, 15)
            ready.set()
            await d.sup.switch(receive=True)  # and once through, to a live session
            await dc.wait_for(lambda: dc.identifies == 2 * n and dc.connected, 15)  # noqa: B023
            await d.sup.switch(receive=False)
            await dc.wait_for(lambda: dc.gateway_connections == 0, 15)
        assert dc.max_open_sessions == 1
    finally:
        await d.sup.close()
