"""The instant between a platform accepting our message and our outbox recording its id.

A process killed in that instant used to leave a partial message nobody edits, and the resumed turn
posted a second answer. Now a send is marked in the outbox before it goes out; the next process,
finding the mark without an id, asks the platform (Slack: the message metadata carrying the key)
and edits what it finds, or (Telegram groups, where nothing can be found) says that its answer
replaces the cut-off one. Real Store, real Reply, real SDKs against the fake servers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from channels.base import ChannelError, Rendered, ReplyTarget
from channels.telegram import TelegramChannel
from gateway.delivery.pacing import ChatPacer
from gateway.delivery.reply import SENDING, Reply
from gateway.ops.metrics import Metrics
from gateway.store.journal import Store
from tests.fakes.gateway_rig import store_at
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.slack_channel_rig import Sink, running

KEY = "x:chat:msg-1"


async def _orphan(store: Store, send: Rendered, channel: object, target: ReplyTarget) -> str:
    """What the killed process did: mark the send, send part 0, die before recording its id."""
    await store.outbox_put(KEY, 0, SENDING)
    return await channel.send(target, send, idempotency_key=f"{KEY}#0")  # type: ignore[attr-defined]


async def test_slack_orphan_is_found_by_its_metadata_and_edited(tmp_path: Path) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    async with FakeSlack() as slack, running(slack, Sink()) as channel:
        target = ReplyTarget("slack", "C1", reply_to="1600000000.000001")
        orphan_ts = await _orphan(store, Rendered("partial ans"), channel, target)
        other = await channel.send(target, Rendered("another reply"), idempotency_key="y:chat:msg-2#0")
        reply = Reply(channel, target, KEY, store, ChatPacer(channel.capabilities), Metrics())
        await reply.load()
        assert not reply.supersedes
        await reply.finish("the complete answer")
        post = slack.post(orphan_ts)
        assert post is not None and post.history == ["partial ans", "the complete answer"]
        assert slack.post(other).text == "another reply"  # type: ignore[union-attr]
        assert len(slack.posts) == 2
        assert await store.outbox_get(KEY) == {0: orphan_ts}
    await store.close()


async def test_slack_mark_without_a_message_sends_once(tmp_path: Path) -> None:
    """Killed after the mark, before the send reached Slack: nothing to find, one new message."""
    store = await store_at(tmp_path / "g.sqlite")
    async with FakeSlack() as slack, running(slack, Sink()) as channel:
        target = ReplyTarget("slack", "C1", reply_to="1600000000.000001")
        await store.outbox_put(KEY, 0, SENDING)
        reply = Reply(channel, target, KEY, store, ChatPacer(channel.capabilities), Metrics())
        await reply.load()
        await reply.finish("the complete answer")
        assert [p.text for p in slack.posts] == ["the complete answer"]
    await store.close()


async def test_telegram_group_answer_says_it_supersedes_the_cut_off_one(tmp_path: Path) -> None:
    async with FakeTelegram() as fake:
        channel = TelegramChannel(fake.token, base_url=fake.base_url, base_file_url=fake.base_file_url)
        try:
            await _telegram_group(tmp_path, fake, channel)
        finally:
            await channel.close()


async def _telegram_group(tmp_path: Path, fake: FakeTelegram, channel: TelegramChannel) -> None:
    group = -100200300
    fake.inject_message(group, 1001, "hello all", chat_type="supergroup")
    store = await store_at(tmp_path / "g.sqlite")
    target = ReplyTarget("telegram", str(group))
    await channel._request.initialize()
    await _orphan(store, Rendered("partial ans"), channel, target)
    reply = Reply(channel, target, KEY, store, ChatPacer(channel.capabilities), Metrics())
    await reply.load()
    assert reply.supersedes
    await reply.finish("the complete answer")
    texts = fake.bot_texts(group)
    assert texts[0] == "partial ans"
    assert texts[-1].startswith("↪️") and "replaces" in texts[-1] and "the complete answer" in texts[-1]
    assert len(texts) == 2
    await store.close()


async def test_every_new_send_is_marked_before_it_goes_out(tmp_path: Path) -> None:
    """The mark is in the outbox while the platform call is in flight (what makes the above work)."""
    store = await store_at(tmp_path / "g.sqlite")
    seen: list[dict[int, str]] = []
    async with FakeSlack() as slack, running(slack, Sink()) as channel:
        original = channel.send

        async def spying_send(target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
            seen.append(await store.outbox_get(KEY))
            return await original(target, part, idempotency_key=idempotency_key)

        channel.send = spying_send  # type: ignore[method-assign]
        target = ReplyTarget("slack", "C1", reply_to="1600000000.000001")
        reply = Reply(channel, target, KEY, store, ChatPacer(channel.capabilities), Metrics())
        await reply.finish("one")
        assert seen == [{0: SENDING}]
        assert (await store.outbox_get(KEY))[0] == slack.posts[0].ts
    await store.close()


async def test_telegram_send_whose_answer_was_lost_is_not_repeated_blindly(tmp_path: Path) -> None:
    """Telegram posted the message, the answer never came back (no kill: the connection dropped).
    sendMessage has no idempotency key, so this stays a possible second message; what must not
    happen is a silent copy: the pacer does not repeat it at once, and the retry says it replaces
    the cut-off one (docs/durability.md)."""
    async with FakeTelegram() as fake:
        channel = TelegramChannel(fake.token, base_url=fake.base_url, base_file_url=fake.base_file_url)
        try:
            group = -100200300
            fake.inject_message(group, 1001, "hello all", chat_type="supergroup")
            store = await store_at(tmp_path / "g.sqlite")
            await channel._request.initialize()
            target = ReplyTarget("telegram", str(group))
            reply = Reply(channel, target, KEY, store, ChatPacer(channel.capabilities), Metrics())
            fake.lose_answer_next("sendMessage")
            with pytest.raises(ChannelError):
                await reply.finish("the complete answer")
            assert fake.bot_texts(group) == ["the complete answer"], "sent once, not repeated blindly"
            assert await store.outbox_get(KEY) == {0: SENDING}, "the mark stays for a restart"
            await reply.finish("the complete answer")  # the gateway's retry of the parked reply
            texts = fake.bot_texts(group)
            assert len(texts) == 2 and texts[1].startswith("↪️") and "the complete answer" in texts[1]
            await store.close()
        finally:
            await channel.close()
