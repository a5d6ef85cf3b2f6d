"""TelegramChannel driven through the real python-telegram-bot against FakeTelegram on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from channels.base import (
    Attachment,
    ChannelState,
    FatalChannelError,
    Inbound,
    NotModified,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    RetryAfter,
    TransientSendError,
)
from channels.telegram import TelegramChannel
from gateway.ops.supervisor import run_once
from tests.fakes.telegram_server import FakeTelegram, entity_text, utf16_len

GROUP = -1001234567890
USER = 4242


class Sink:
    """A list-appending sink that can be told to fail (the journal being down)."""

    def __init__(self) -> None:
        self.items: list[Inbound] = []
        self.fail_times = 0
        self._changed = asyncio.Event()

    async def __call__(self, inbound: Inbound) -> None:
        if self.fail_times:
            self.fail_times -= 1
            raise RuntimeError("journal unavailable")
        self.items.append(inbound)
        self._changed.set()

    async def wait(self, count: int, within: float = 5.0) -> list[Inbound]:
        async with asyncio.timeout(within):
            while len(self.items) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.items


@pytest.fixture
async def channel(tg: FakeTelegram) -> AsyncIterator[TelegramChannel]:
    ch = TelegramChannel(
        tg.token, base_url=tg.base_url, base_file_url=tg.base_file_url, poll_timeout=2,
        auth_recheck_delay=0.05,
    )  # fmt: skip
    yield ch
    await ch.close()


@contextlib.asynccontextmanager
async def running(channel: TelegramChannel, sink: Sink) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(run_once(channel, sink))
    try:
        async with asyncio.timeout(5):
            while channel.state is not ChannelState.CONNECTED:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def one(channel: TelegramChannel) -> Inbound:
    """Run the channel until it produced one Inbound and return it."""
    sink = Sink()
    async with running(channel, sink):
        return (await sink.wait(1))[0]


# -- inbound mapping -----------------------------------------------------------------------------
async def test_direct_message_is_addressed(tg: FakeTelegram, channel: TelegramChannel) -> None:
    tg.inject_message(USER, USER, "hello there", first_name="Ada")
    msg = await one(channel)
    assert (msg.platform, msg.chat_id, msg.sender_id) == ("telegram", str(USER), str(USER))
    assert msg.text == "hello there"
    assert msg.is_direct and msg.addressed and msg.thread_id is None
    assert msg.sender_name == "Ada"
    assert msg.message_id == "1" and msg.key == f"telegram:{USER}:1"


async def test_group_message_without_mention_is_not_addressed(
    tg: FakeTelegram, channel: TelegramChannel
) -> None:
    tg.inject_message(GROUP, USER, "just chatting", chat_type="supergroup", chat_title="Team")
    msg = await one(channel)
    assert not msg.is_direct and not msg.addressed
    assert msg.chat_title == "Team" and msg.text == "just chatting"


async def test_group_mention_is_addressed_and_stripped(tg: FakeTelegram, channel: TelegramChannel) -> None:
    tg.inject_mention(GROUP, USER, "what is 2+2?")
    tg.inject_message(GROUP, USER, "hey @chital_bot, look 👀 here", chat_type="supergroup")
    tg.inject_message(GROUP, USER, "ask @someone_else", chat_type="supergroup")
    sink = Sink()
    async with running(channel, sink):
        first, second, third = await sink.wait(3)
    assert first.addressed and first.text == "what is 2+2?"
    assert second.addressed and second.text == "hey, look 👀 here"
    assert not third.addressed and third.text == "ask @someone_else"


async def test_reply_to_bot_is_addressed(tg: FakeTelegram, channel: TelegramChannel) -> None:
    tg.inject_message(GROUP, USER, "and then?", chat_type="supergroup", reply_to_bot=True)
    msg = await one(channel)
    assert msg.addressed and msg.text == "and then?"


async def test_commands_are_normalised_and_other_bots_commands_ignored(
    tg: FakeTelegram, channel: TelegramChannel
) -> None:
    tg.inject_command(GROUP, USER, "new", "fresh start")
    tg.inject_command(GROUP, USER, "stop", at=None)
    tg.inject_command(GROUP, USER, "start", "x", at="other_bot")
    sink = Sink()
    async with running(channel, sink):
        ours, bare, theirs = await sink.wait(3)
    assert ours.addressed and ours.text == "/new fresh start"
    assert bare.addressed and bare.text == "/stop"
    assert not theirs.addressed and theirs.text == "/start@other_bot x"


async def test_forum_topic_sets_thread_id(tg: FakeTelegram, channel: TelegramChannel) -> None:
    # Topic messages "reply" to the topic's creation message: that must not count as addressing.
    tg.inject_message(GROUP, USER, "in topic", chat_type="supergroup", message_thread_id=77, is_topic=True)
    tg.inject_mention(GROUP, USER, "help", message_thread_id=77, is_topic=True)
    sink = Sink()
    async with running(channel, sink):
        plain, mention = await sink.wait(2)
    assert plain.thread_id == "77" and not plain.addressed
    assert mention.thread_id == "77" and mention.addressed
    assert mention.conversation == f"telegram:{GROUP}:77"
    assert mention.target.thread_id == "77"


async def test_bots_edits_and_service_messages_are_skipped(
    tg: FakeTelegram, channel: TelegramChannel
) -> None:
    tg.inject_message(GROUP, 999, "I am a bot", chat_type="supergroup", from_bot=True)
    edit = tg.inject_message(USER, USER, "original")
    tg.push_update({"edited_message": {**edit["message"], "text": "edited", "edit_date": 1}})
    tg.push_update(
        {
            "message": {
                "message_id": 50,
                "date": 1,
                "chat": {"id": GROUP, "type": "supergroup"},
                "from": {"id": USER, "is_bot": False, "first_name": "U"},
                "new_chat_members": [{"id": 5, "is_bot": False, "first_name": "N"}],
            }
        }
    )
    tg.inject_message(USER, USER, "last")
    sink = Sink()
    async with running(channel, sink):
        await sink.wait(2)
        await tg.wait_for(lambda: not tg.pending_updates, what="all updates confirmed")
    assert [m.text for m in sink.items] == ["original", "last"]


async def test_attachments_are_listed(tg: FakeTelegram, channel: TelegramChannel) -> None:
    doc = tg.add_file(b"a,b\n1,2\n", file_name="data.csv", mime_type="text/csv")
    tg.inject_message(USER, USER, "see file", document=doc)
    tg.inject_message(USER, USER, "", photo=tg.add_photo(b"\xff\xd8" * 500))
    sink = Sink()
    async with running(channel, sink):
        with_doc, with_photo = await sink.wait(2)
    assert with_doc.text == "see file"
    assert with_doc.attachments == (Attachment(doc["file_id"], "data.csv", "text/csv", 8),)
    (photo,) = with_photo.attachments
    assert photo.size == 1000 and photo.mime_type == "image/jpeg"


# -- durability ----------------------------------------------------------------------------------
async def test_offset_not_advanced_when_sink_raises(tg: FakeTelegram, channel: TelegramChannel) -> None:
    update = tg.inject_message(USER, USER, "do not lose me")
    sink = Sink()
    sink.fail_times = 1
    with pytest.raises(RuntimeError, match="journal unavailable"):
        await asyncio.wait_for(run_once(channel, sink), 5)
    assert tg.pending_updates == [update]  # never confirmed
    async with running(channel, sink):
        (msg,) = await sink.wait(1)
        await tg.wait_for(lambda: not tg.pending_updates, what="update confirmed")
    assert msg.text == "do not lose me"
    polls = tg.calls_to("getUpdates")
    assert polls[-1].params["offset"] == update["update_id"] + 1
    assert polls[0].params["allowed_updates"] == ["message", "callback_query"]  # presses of our buttons
    assert polls[0].params["timeout"] == 2


async def test_unparseable_update_reaches_the_sink_as_a_marker(
    tg: FakeTelegram, channel: TelegramChannel
) -> None:
    tg.inject_message(USER, USER, "one")
    bad = tg.inject_malformed(GROUP, USER, "@chital_bot hi", drop=("date",), chat_type="supergroup")
    tg.inject_message(USER, USER, "two")
    sink = Sink()
    async with running(channel, sink):
        one_, marker, two = await sink.wait(3)
        await tg.wait_for(lambda: not tg.pending_updates, what="all confirmed")
        assert channel.state is ChannelState.CONNECTED
    assert (one_.text, two.text) == ("one", "two")
    assert marker.unreadable and marker.text == "" and not marker.is_direct and marker.addressed
    assert (marker.chat_id, marker.sender_id) == (str(GROUP), str(USER))
    assert marker.message_id == str(bad["message"]["message_id"])
    assert tg.calls_to("getUpdates")[-1].params["offset"] > bad["update_id"]


async def test_redelivered_update_gives_the_same_key(tg: FakeTelegram, channel: TelegramChannel) -> None:
    update = tg.inject_message(GROUP, USER, "once", chat_type="supergroup")
    sink = Sink()
    async with running(channel, sink):
        await sink.wait(1)
        tg.redeliver(update)
        first, again = await sink.wait(2)
    assert first.key == again.key == f"telegram:{GROUP}:{update['message']['message_id']}"


async def test_cancelled_run_stops_cleanly(tg: FakeTelegram, channel: TelegramChannel) -> None:
    sink = Sink()
    async with running(channel, sink) as task:
        await tg.wait_for(lambda: tg.calls_to("getUpdates"))
    assert task.cancelled() and channel.state is ChannelState.STOPPED


# -- connection failures -------------------------------------------------------------------------
async def test_revoked_token_during_polling_is_fatal(tg: FakeTelegram, channel: TelegramChannel) -> None:
    task = asyncio.create_task(run_once(channel, Sink()))
    await tg.wait_for(lambda: tg.calls_to("getUpdates"))
    tg.revoke_token()
    with pytest.raises(FatalChannelError) as info:
        await asyncio.wait_for(task, 5)
    assert "401" in str(info.value) and tg.token not in str(info.value)
    assert channel.state is ChannelState.FAILED and channel.reason == str(info.value)


async def test_rejected_token_at_start_is_fatal(tg: FakeTelegram) -> None:
    ch = TelegramChannel(
        "999:wrong", base_url=tg.base_url, base_file_url=tg.base_file_url, auth_recheck_delay=0.05
    )
    try:
        with pytest.raises(FatalChannelError, match="rejected the bot token"):
            await asyncio.wait_for(run_once(ch, Sink()), 5)
        assert ch.state is ChannelState.FAILED
    finally:
        await ch.close()


async def test_getme_network_failure_is_not_fatal(tg: FakeTelegram, channel: TelegramChannel) -> None:
    tg.fail_next("getMe", 0)  # connection dropped without an answer
    with pytest.raises(ConnectionError) as info:
        await asyncio.wait_for(run_once(channel, Sink()), 5)
    assert not isinstance(info.value, FatalChannelError) and tg.token not in str(info.value)
    assert channel.state is ChannelState.RECONNECTING
    # Nothing listening at all: still an ordinary, retryable error.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = TelegramChannel(tg.token, base_url=f"http://127.0.0.1:{port}/bot", base_file_url="x")
    try:
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(run_once(dead, Sink()), 5)
    finally:
        await dead.close()


async def test_poll_conflict_reconnects_and_recovers(tg: FakeTelegram, channel: TelegramChannel) -> None:
    reasons: list[str | None] = []
    channel.add_status_listener(lambda ch: reasons.append(ch.reason))
    sink = Sink()
    tg.fail_next("getUpdates", 409)
    async with running(channel, sink):
        tg.inject_message(USER, USER, "after the conflict")
        await sink.wait(1, within=8)
        assert channel.state is ChannelState.CONNECTED
    assert "another poller is using this token" in reasons


# -- rendering -----------------------------------------------------------------------------------
def test_render_long_answer_keeps_code_blocks(channel: TelegramChannel) -> None:
    code = "\n".join(f"value_{i} = compute({i})  # step {i}" for i in range(260))
    answer = "# Report\n\nIntro with **bold** text.\n\n```python\n" + code + "\n```\n\n" + "Done. " * 200
    assert len(answer) >= 10_000
    parts = channel.render(answer)
    assert len(parts) >= 3
    code_seen: list[str] = []
    for part in parts:
        assert 0 < utf16_len(part.text) <= 4096
        for ent in part.payload["entities"]:
            assert ent["offset"] + ent["length"] <= utf16_len(part.text)
            if ent["type"] == "pre":
                assert ent["language"] == "python"
                code_seen.append(entity_text(part.text, ent))
    assert "\n".join(c.strip("\n") for c in code_seen) == code
    assert "Done." in parts[-1].text and "**" not in "".join(p.text for p in parts)


def test_render_never_empty_and_stream_is_capped(channel: TelegramChannel) -> None:
    assert channel.render("plain") == [Rendered("plain", {"entities": []})]
    assert channel.render("[relative](docs/x.md)")[0].payload["entities"] == []
    stream = channel.render_stream("😀" * 3000)
    assert utf16_len(stream.text) <= 4096 and stream.text.endswith("…")


# -- outbound ------------------------------------------------------------------------------------
async def test_send_edit_and_error_mapping(tg: FakeTelegram, channel: TelegramChannel) -> None:
    user_msg = tg.inject_message(USER, USER, "question")["message"]
    target = ReplyTarget("telegram", str(USER), reply_to=str(user_msg["message_id"]))
    (part,) = channel.render("The **answer**")
    mid = await channel.send(target, part, idempotency_key="k1")
    seen = tg.message(USER, int(mid))
    assert seen.text == "The answer" and seen.spans("bold") == ["answer"]
    assert seen.reply_to == user_msg["message_id"]

    await channel.edit(target, mid, Rendered("The answer, revised"))
    assert tg.message(USER, int(mid)).text == "The answer, revised"
    assert tg.message(USER, int(mid)).edits == 1
    with pytest.raises(NotModified):
        await channel.edit(target, mid, Rendered("The answer, revised"))

    tg.fail_next("sendMessage", 429, retry_after=7)
    with pytest.raises(RetryAfter) as info:
        await channel.send(target, part, idempotency_key="k2")
    assert info.value.seconds == 7
    tg.fail_next("editMessageText", 502)
    with pytest.raises(TransientSendError):
        await channel.edit(target, mid, Rendered("x"))
    with pytest.raises(PermanentSendError, match=r"(?i)message to edit not found"):
        await channel.edit(target, "9999", Rendered("x"))
    tg.block_chat(USER)
    with pytest.raises(PermanentSendError, match="blocked"):
        await channel.send(target, part, idempotency_key="k3")
    tg.revoke_token()
    with pytest.raises(FatalChannelError) as fatal:
        await channel.send(ReplyTarget("telegram", str(GROUP)), part, idempotency_key="k4")
    assert tg.token not in str(fatal.value)
    assert tg.bot_texts(USER) == ["The answer, revised"]


async def test_send_to_topic_and_reply_to_missing_message(tg: FakeTelegram, channel: TelegramChannel) -> None:
    tg.inject_message(GROUP, USER, "hi", chat_type="supergroup", message_thread_id=77, is_topic=True)
    target = ReplyTarget("telegram", str(GROUP), thread_id="77", reply_to="12345")  # reply target gone
    mid = await channel.send(target, Rendered("in topic"), idempotency_key="k")
    seen = tg.message(GROUP, int(mid))
    assert seen.thread_id == 77 and seen.text == "in topic" and seen.reply_to is None


async def test_refused_entities_fall_back_to_plain_text(tg: FakeTelegram, channel: TelegramChannel) -> None:
    tg.inject_message(USER, USER, "q")
    bad = Rendered("short", {"entities": [{"type": "bold", "offset": 0, "length": 50}]})
    mid = await channel.send(ReplyTarget("telegram", str(USER)), bad, idempotency_key="k")
    assert tg.message(USER, int(mid)).entities == [] and tg.bot_texts(USER) == ["short"]


async def test_typing_and_reactions(tg: FakeTelegram, channel: TelegramChannel) -> None:
    update = tg.inject_message(GROUP, USER, "q", chat_type="supergroup", message_thread_id=5, is_topic=True)
    target = ReplyTarget("telegram", str(GROUP), thread_id="5", reply_to=str(update["message"]["message_id"]))
    await channel.typing(target)
    (action,) = tg.calls_to("sendChatAction")
    assert action.params["action"] == "typing" and action.params["message_thread_id"] == 5
    await channel.react(target, "✅")  # not an allowed Telegram reaction: mapped
    assert tg.message(GROUP, int(target.reply_to or 0)).reactions == ["👌"]
    await channel.react(target, "🦜")  # unmappable: skipped, no call
    assert len(tg.calls_to("setMessageReaction")) == 1
    tg.fail_next("sendChatAction", 500)
    tg.fail_next("setMessageReaction", 400)
    await channel.typing(target)  # failures are swallowed
    await channel.react(target, "👀")


async def test_download_respects_limit(tg: FakeTelegram, channel: TelegramChannel) -> None:
    doc = tg.add_file(b"x" * 1000, file_name="a.bin")
    att = Attachment(doc["file_id"], "a.bin", size=1000)
    assert await channel.download(att, limit=1000) == b"x" * 1000
    calls = len(tg.calls)
    with pytest.raises(PermanentSendError, match="over the 999-byte limit"):
        await channel.download(att, limit=999)
    assert len(tg.calls) == calls  # refused before asking Telegram
    unknown = Attachment(doc["file_id"], "a.bin", size=None)
    with pytest.raises(PermanentSendError, match="limit"):
        await channel.download(unknown, limit=10)
    huge = Attachment("FILE-X", "big.iso", size=30 * 1024 * 1024)
    with pytest.raises(PermanentSendError, match="20 MB"):
        await channel.download(huge, limit=100 * 1024 * 1024)


async def test_send_file_as_document_and_photo(
    tg: FakeTelegram, channel: TelegramChannel, tmp_path: Path
) -> None:
    tg.inject_message(USER, USER, "make a report")
    target = ReplyTarget("telegram", str(USER), reply_to="1")
    report = tmp_path / "report.csv"
    report.write_bytes(b"a,b\n1,2\n")
    mid = await channel.send_file(
        target, OutFile(report.name, report.read_bytes()), caption="Your report", idempotency_key="k#1"
    )
    seen = tg.message(USER, int(mid))
    assert seen.document is not None and seen.document["file_name"] == "report.csv"
    assert tg.file_bytes(seen.document["file_id"]) == b"a,b\n1,2\n" and seen.text == "Your report"
    chart = tmp_path / "chart.png"
    chart.write_bytes(b"\x89PNG fake image")
    pid = await channel.send_file(target, OutFile(chart.name, chart.read_bytes()), idempotency_key="k#2")
    assert tg.message(USER, int(pid)).photo is not None
    assert [c.method for c in tg.calls[-2:]] == ["sendDocument", "sendPhoto"]
