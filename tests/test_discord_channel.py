"""DiscordChannel driven through real discord.py against the fake Discord (REST + gateway + CDN)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from channels.base import (
    ChannelState,
    FatalChannelError,
    Inbound,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
)
from channels.discord import DiscordChannel
from channels.discord.render import to_discord_markdown
from gateway.ops.supervisor import run_once
from tests.fakes.discord_server import FakeDiscord

USER = "900000000000000042"

# The adapter points discord.py's process-wide class attributes at the fake.
pytestmark = pytest.mark.usefixtures("discord_endpoints_restored")


@pytest.fixture
def dc_heartbeat() -> float:
    return 0.5  # the stalled-connection tests time out after 1.5 s


@dataclass
class Bot:
    channel: DiscordChannel
    task: asyncio.Task[None]
    inbox: list[Inbound] = field(default_factory=list)


async def _start(dc: FakeDiscord, **kwargs: float) -> Bot:
    channel = DiscordChannel(dc.token, api_base_url=dc.api_base_url, gateway_url=dc.gateway_url, **kwargs)
    inbox: list[Inbound] = []

    async def sink(message: Inbound) -> None:
        inbox.append(message)

    bot = Bot(channel, asyncio.create_task(run_once(channel, sink)), inbox)
    await dc.wait_for(lambda: channel.state is ChannelState.CONNECTED and dc.connected, 10)
    return bot


@pytest.fixture
async def bot(dc: FakeDiscord) -> AsyncIterator[Bot]:
    bot = await _start(dc)
    yield bot
    bot.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await bot.task
    await bot.channel.close()
    assert bot.channel.state is ChannelState.STOPPED


async def _next(dc: FakeDiscord, bot: Bot, count: int) -> Inbound:
    await dc.wait_for(lambda: len(bot.inbox) >= count)
    return bot.inbox[count - 1]


# -- inbound -------------------------------------------------------------------------------------


async def test_guild_mention_is_addressed_and_stripped(dc: FakeDiscord, bot: Bot) -> None:
    assert dc.intents is not None and dc.intents & (1 << 15)  # message_content asked for
    mid = await dc.inject_message(None, USER, "what's the weather?", mention_bot=True)
    m = await _next(dc, bot, 1)
    assert (m.platform, m.chat_id, m.message_id, m.sender_id) == ("discord", dc.channel_id, mid, USER)
    assert m.text == "what's the weather?"
    assert m.addressed and not m.is_direct and m.thread_id is None
    assert "#general" in m.chat_title


async def test_unmentioned_guild_message_is_not_addressed(dc: FakeDiscord, bot: Bot) -> None:
    await dc.inject_message(None, USER, "just chatting")
    m = await _next(dc, bot, 1)
    assert m.text == "just chatting" and not m.addressed and not m.is_direct


async def test_dm_is_direct_and_addressed(dc: FakeDiscord, bot: Bot) -> None:
    await dc.inject_dm(USER, "hi bot")
    m = await _next(dc, bot, 1)
    assert m.is_direct and m.addressed and m.chat_id == dc.dm_channel(USER) and m.text == "hi bot"
    await bot.channel.send(m.target, Rendered("hello!"), idempotency_key="dm-1")
    assert dc.bot_messages(dc.dm_channel(USER))[0].content == "hello!"


async def test_reply_to_bot_is_addressed_and_own_posts_ignored(dc: FakeDiscord, bot: Bot) -> None:
    first = await dc.inject_message(None, USER, "hey", mention_bot=True)
    m = await _next(dc, bot, 1)
    bot_msg = await bot.channel.send(m.target, Rendered("I am here"), idempotency_key="k1")
    assert dc.posted[0].reply_to == first
    await dc.inject_message(None, USER, "and another thing", reply_to_message_id=bot_msg)
    reply = await _next(dc, bot, 2)
    assert reply.addressed and reply.text == "and another thing"
    await dc.inject_message(None, USER, "replying to myself", reply_to_message_id=first)
    assert not (await _next(dc, bot, 3)).addressed
    # The echo of the bot's own post (dispatched before these) never reached the sink.
    assert all(x.sender_id == USER for x in bot.inbox) and len(bot.inbox) == 3


async def test_thread_message_is_keyed_to_the_thread(dc: FakeDiscord, bot: Bot) -> None:
    await dc.inject_message(None, USER, "in a thread", mention_bot=True, thread=True)
    m = await _next(dc, bot, 1)
    assert (m.chat_id, m.thread_id) == (dc.channel_id, dc.thread_id)
    assert m.conversation == f"discord:{dc.channel_id}:{dc.thread_id}"
    await bot.channel.send(m.target, Rendered("answer"), idempotency_key="t1")
    assert [p.content for p in dc.bot_messages(dc.thread_id)] == ["answer"]
    assert dc.bot_messages(dc.channel_id) == []


# -- connection loss -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["close", "abort"])
async def test_resume_replays_events_missed_while_down(dc: FakeDiscord, bot: Bot, mode: str) -> None:
    m1 = await dc.inject_message(None, USER, "before", mention_bot=True)
    await _next(dc, bot, 1)
    await dc.drop_connection(mode)  # type: ignore[arg-type]
    m2 = await dc.inject_message(None, USER, "while down", mention_bot=True)
    second = await _next(dc, bot, 2)
    assert dc.resumes == 1 and dc.identifies == 1
    assert second.message_id == m2 and second.text == "while down"
    await dc.wait_for(lambda: bot.channel.state is ChannelState.CONNECTED)
    # A second delivery of the same post carries the same key, so the journal drops it.
    await dc.redeliver(m1)
    again = await _next(dc, bot, 3)
    assert again.key == bot.inbox[0].key and again.message_id == m1


async def test_stalled_connection_is_noticed_and_resumed(dc: FakeDiscord) -> None:
    bot = await _start(dc, heartbeat_timeout=1.5)
    try:
        await dc.drop_connection("stall")
        await dc.inject_message(None, USER, "during stall", mention_bot=True)
        m = await _next(dc, bot, 1)
        assert m.text == "during stall" and dc.resumes == 1
    finally:
        bot.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await bot.task


async def test_invalid_session_identifies_again(dc: FakeDiscord, bot: Bot) -> None:
    await dc.invalidate_session()
    await dc.wait_for(lambda: dc.identifies == 2 and dc.connected, 10)  # discord.py waits 5 s
    await dc.inject_message(None, USER, "after re-identify", mention_bot=True)
    assert (await _next(dc, bot, 1)).text == "after re-identify"


async def test_bad_token_is_fatal_and_not_leaked(dc: FakeDiscord) -> None:
    secret = "MTIz.bad.token-value"
    channel = DiscordChannel(secret, api_base_url=dc.api_base_url, gateway_url=dc.gateway_url)

    async def sink(_: Inbound) -> None:
        raise AssertionError("no message expected")

    with pytest.raises(FatalChannelError) as info:
        await asyncio.wait_for(run_once(channel, sink), 10)
    assert channel.state is ChannelState.FAILED
    assert secret not in str(info.value) and secret not in repr(channel)


# -- outbound --------------------------------------------------------------------------------------


def test_render_splits_long_answer_with_code_block() -> None:
    channel = DiscordChannel("unused")
    code = "\n".join(f"print('line {i:03d}')  # some padding text here" for i in range(80))
    answer = "Intro paragraph.\n\n" + "word " * 300 + "\n\n```python\n" + code + "\n```\n\nThe end."
    assert len(answer) > 5000
    parts = channel.render(answer)
    assert len(parts) >= 3
    for part in parts:
        assert len(part.text) <= 2000
        assert part.text.count("```") % 2 == 0, part.text
    joined = "\n".join(p.text for p in parts)
    assert all(f"line {i:03d}" in joined for i in range(80)) and joined.endswith("The end.")


def test_render_stream_closes_open_fence_within_limit() -> None:
    snapshot = DiscordChannel("unused").render_stream("Here:\n```python\n" + "x = 1\n" * 500)
    assert len(snapshot.text) <= 2000 and snapshot.text.count("```") == 2


def test_markdown_conversion_for_discord() -> None:
    md = "#### Small\n\n| a | bb |\n|---|----|\n| 1 | **2** |\n\n![cat](http://x/cat.png)\n\n```\n| a |\n```"
    out = to_discord_markdown(md)
    assert "**Small**" in out
    assert "```\na | bb\n--+---\n1 | 2\n```" in out
    assert "[cat](http://x/cat.png)" in out and "![" not in out
    assert out.endswith("```\n| a |\n```")  # code blocks untouched


async def test_same_idempotency_key_posts_once(dc: FakeDiscord, bot: Bot) -> None:
    target = ReplyTarget("discord", dc.channel_id)
    first = await bot.channel.send(target, Rendered("only once"), idempotency_key="turn-7:part-0")
    second = await bot.channel.send(target, Rendered("only once"), idempotency_key="turn-7:part-0")
    assert first == second and [p.content for p in dc.posted] == ["only once"]
    assert dc.posted[0].nonce is not None and len(dc.posted[0].nonce) <= 25


async def test_edit_typing_and_react(dc: FakeDiscord, bot: Bot) -> None:
    await dc.inject_message(None, USER, "go", mention_bot=True)
    m = await _next(dc, bot, 1)
    mid = await bot.channel.send(m.target, Rendered("thinking…"), idempotency_key="e1")
    await bot.channel.edit(m.target, mid, Rendered("done: 42"))
    await bot.channel.typing(m.target)
    await bot.channel.react(m.target, "👀")
    assert dc.posted[0].content == "done: 42" and dc.posted[0].edits == 1
    assert dc.typing[dc.channel_id] == 1
    assert dc.reactions == [(dc.channel_id, m.message_id, "👀")]


async def test_error_mapping(dc: FakeDiscord, bot: Bot) -> None:
    target = ReplyTarget("discord", dc.channel_id)
    dc.fail_next(429, method="POST", path_contains="/messages", retry_after=60.0)
    with pytest.raises(RetryAfter) as info:
        await bot.channel.send(target, Rendered("x"), idempotency_key="r1")
    assert info.value.seconds == pytest.approx(60.0)
    # A short 429 is waited out by discord.py itself: one message, no error.
    dc.fail_next(429, method="POST", path_contains="/messages", retry_after=0.1)
    await bot.channel.send(target, Rendered("after short limit"), idempotency_key="r2")
    assert [p.content for p in dc.posted] == ["after short limit"]
    dc.fail_next(503, method="POST", path_contains="/messages")
    with pytest.raises(TransientSendError):
        await bot.channel.send(target, Rendered("x"), idempotency_key="r3")
    with pytest.raises(PermanentSendError, match="50035"):
        await bot.channel.send(target, Rendered("x" * 2001), idempotency_key="r4")
    dc.forbidden_channels.add(dc.channel_id)
    with pytest.raises(PermanentSendError, match="403"):
        await bot.channel.send(target, Rendered("x"), idempotency_key="r5")


async def test_attachment_download_and_send_file(dc: FakeDiscord, bot: Bot, tmp_path: Path) -> None:
    payload = b"col1,col2\n1,2\n"
    await dc.inject_message(
        None, USER, "see file", mention_bot=True, attachments=[("data.csv", payload, "text/csv")]
    )
    m = await _next(dc, bot, 1)
    (att,) = m.attachments
    assert (att.name, att.mime_type, att.size) == ("data.csv", "text/csv", len(payload))
    assert await bot.channel.download(att, limit=1024) == payload
    with pytest.raises(PermanentSendError):
        await bot.channel.download(att, limit=4)
    report = tmp_path / "report.txt"
    report.write_bytes(b"the report")
    mid = await bot.channel.send_file(
        m.target, OutFile(report.name, report.read_bytes()), caption="here you go", idempotency_key="k#1"
    )
    posted = dc.bot_messages()[-1]
    assert posted.id == mid and posted.content == "here you go"
    assert posted.files == [("report.txt", b"the report")] and posted.reply_to == m.message_id
