"""MatrixChannel driven through the real matrix-nio client against tests/fakes/matrix_server.py,
and its pure parts (channels/matrix/inbound.py, render.py) on their own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from channels.base import (
    Attachment,
    FatalChannelError,
    Inbound,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    RetryAfter,
)
from channels.matrix.channel import MatrixChannel
from channels.matrix.inbound import ENCRYPTED_NOTE, to_inbound
from channels.matrix.render import render
from tests.fakes.matrix_server import SERVER, FakeMatrix

ME = f"@chital:{SERVER}"
ALICE = f"@alice:{SERVER}"
ROOM = f"!room:{SERVER}"


class Sink:
    def __init__(self) -> None:
        self.items: list[Inbound] = []

    async def __call__(self, inbound: Inbound) -> None:
        self.items.append(inbound)


def channel_for(hs: FakeMatrix, state: Path) -> MatrixChannel:
    return MatrixChannel(hs.base_url, hs.user_id, hs.token, sync_timeout=1, state_dir=str(state))


@contextlib.asynccontextmanager
async def running(hs: FakeMatrix, state: Path, sink: Sink) -> AsyncIterator[MatrixChannel]:
    channel = channel_for(hs, state)
    task = asyncio.create_task(channel.run(sink))
    try:
        await hs.wait_for(lambda: hs.syncs >= 2 or task.done(), what="the first long poll")
        yield channel
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await channel.close()


# -- the sync loop ------------------------------------------------------------------------------
async def test_a_bad_event_never_wedges_the_batch_and_a_restart_replays_nothing(
    matrix_hs: FakeMatrix, tmp_path: Path
) -> None:
    matrix_hs.room(ROOM, ALICE)
    sink = Sink()
    async with running(matrix_hs, tmp_path, sink):
        matrix_hs.inject_event(ROOM, "not an object")
        good = matrix_hs.inject_text(ROOM, ALICE, "hello")
        await matrix_hs.wait_for(lambda: len(sink.items) >= 2, what="the marker and the message")
    marker, message = sink.items
    assert marker.unreadable and marker.chat_id == ROOM
    assert message.message_id == good["event_id"] and message.text == "hello" and message.is_direct
    assert (tmp_path / "matrix-sync.json").stat().st_mode & 0o777 == 0o600
    assert matrix_hs.token not in (tmp_path / "matrix-sync.json").read_text()

    again = Sink()
    async with running(matrix_hs, tmp_path, again):
        later = matrix_hs.inject_text(ROOM, ALICE, "later")
        await matrix_hs.wait_for(lambda: again.items, what="the new message")
    assert [i.message_id for i in again.items] == [later["event_id"]], "nothing earlier came back"


async def test_first_sync_treats_history_as_history(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    matrix_hs.room(ROOM, ALICE)
    matrix_hs.inject_text(ROOM, ALICE, "said before the bot ever ran")
    sink = Sink()
    async with running(matrix_hs, tmp_path, sink):
        new = matrix_hs.inject_text(ROOM, ALICE, "now")
        await matrix_hs.wait_for(lambda: sink.items, what="the new message")
    assert [i.message_id for i in sink.items] == [new["event_id"]]


async def test_invite_is_joined(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    sink = Sink()
    async with running(matrix_hs, tmp_path, sink):
        matrix_hs.invite(f"!new:{SERVER}", ALICE)
        await matrix_hs.wait_for(lambda: any("/join/" in p for _, p in matrix_hs.calls), what="a join")


async def test_revoked_token_is_fatal_and_never_shown(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    matrix_hs.revoke_token()
    channel = channel_for(matrix_hs, tmp_path)
    with pytest.raises(FatalChannelError) as err:
        await asyncio.wait_for(channel.run(Sink()), 20)
    await channel.close()
    assert "access token" in str(err.value) and matrix_hs.token not in str(err.value)


async def test_token_for_another_user_is_fatal(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    channel = MatrixChannel(matrix_hs.base_url, ALICE, matrix_hs.token, state_dir=str(tmp_path))
    with pytest.raises(FatalChannelError, match="another user"):
        await asyncio.wait_for(channel.run(Sink()), 20)
    await channel.close()


# -- outbound -----------------------------------------------------------------------------------
async def test_send_is_idempotent_on_its_key_and_edits_replace(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    channel = channel_for(matrix_hs, tmp_path)
    target = ReplyTarget("matrix", ROOM, reply_to="$user-event")
    try:
        first = await channel.send(target, render("hi **there**")[0], idempotency_key="reply-1:0")
        second = await channel.send(target, render("hi **there**")[0], idempotency_key="reply-1:0")
        assert first == second and len(matrix_hs.bot_messages(ROOM)) == 1, "the txn id deduplicated"
        await channel.edit(target, first, Rendered("hi again"))
        seen = matrix_hs.messages[first]
        assert seen.text == "hi again" and seen.edits == 1
        edit = matrix_hs.edits()[-1]
        assert edit["m.relates_to"] == {"rel_type": "m.replace", "event_id": first}
        assert edit["body"] == "* hi again" and edit["m.mentions"] == {}
    finally:
        await channel.close()


async def test_thread_reply_stays_in_the_thread(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    channel = channel_for(matrix_hs, tmp_path)
    try:
        target = ReplyTarget("matrix", ROOM, thread_id="$root", reply_to="$asked")
        sent = await channel.send(target, Rendered("in thread"), idempotency_key="k")
    finally:
        await channel.close()
    rel = matrix_hs.messages[sent].content["m.relates_to"]
    assert rel == {"rel_type": "m.thread", "event_id": "$root", "is_falling_back": False,
                   "m.in_reply_to": {"event_id": "$asked"}}  # fmt: skip


async def test_429_is_retry_after_and_5xx_transient(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    channel = channel_for(matrix_hs, tmp_path)
    target = ReplyTarget("matrix", ROOM)
    try:
        matrix_hs.fail_next("send", 429, errcode="M_LIMIT_EXCEEDED", retry_after_ms=1500)
        with pytest.raises(RetryAfter) as err:
            await channel.send(target, Rendered("x"), idempotency_key="a")
        assert err.value.seconds == 1.5
        matrix_hs.fail_next("send", 403, errcode="M_FORBIDDEN")
        with pytest.raises(PermanentSendError, match="M_FORBIDDEN"):
            await channel.send(target, Rendered("x"), idempotency_key="b")
    finally:
        await channel.close()


async def test_files_out_and_in_through_the_media_repository(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    channel = channel_for(matrix_hs, tmp_path)
    target = ReplyTarget("matrix", ROOM, reply_to="$asked")
    try:
        sent = await channel.send_file(
            target, OutFile("chart.png", b"\x89PNG..."), "the chart", idempotency_key="f"
        )
        content = matrix_hs.messages[sent].content
        assert content["msgtype"] == "m.image" and content["filename"] == "chart.png"
        assert matrix_hs.media(content["url"]) == b"\x89PNG..."
        assert content["m.relates_to"] == {"m.in_reply_to": {"event_id": "$asked"}}

        mxc = matrix_hs.add_media(b"y" * 5000)
        got = await channel.download(Attachment(mxc, "small.bin", size=5000), limit=10_000)
        assert got == b"y" * 5000
        big = matrix_hs.add_media(b"z" * 3_000_000)  # read to its end, not one buffered chunk
        assert await channel.download(Attachment(big, "big.bin"), limit=5_000_000) == b"z" * 3_000_000
        # A server that announces less than it sends is cut off at the limit.
        with pytest.raises(PermanentSendError):
            await channel.download(Attachment(mxc, "liar.bin", size=10), limit=1000)
        with pytest.raises(PermanentSendError):
            await channel.download(Attachment("mxc://x/../../etc", "bad.bin"), limit=1000)
    finally:
        await channel.close()


# -- parsing and rendering ------------------------------------------------------------------------
def parse(
    content: dict, *, direct: bool = False, to_me: bool = False, etype: str = "m.room.message"
) -> Inbound | None:
    event = {"type": etype, "event_id": "$e1", "sender": ALICE, "origin_server_ts": 1, "content": content}
    return to_inbound(ROOM, event, me=ME, display_name="Chital", is_direct=direct, replies_to_me=to_me)


def test_mentions_replies_and_commands_address_the_bot_in_rooms() -> None:
    assert not parse({"msgtype": "m.text", "body": "the Chitalian food was good"}).addressed  # type: ignore[union-attr]
    named = parse({"msgtype": "m.text", "body": "Chital: what now?"})
    assert named is not None and named.addressed and named.text == "what now?"
    assert parse({"msgtype": "m.text", "body": "x", "m.mentions": {"user_ids": [ME]}}).addressed  # type: ignore[union-attr]
    assert parse({"msgtype": "m.text", "body": "/status"}).addressed  # type: ignore[union-attr]
    assert not parse({"msgtype": "m.text", "body": "/usr/bin is full"}).addressed  # type: ignore[union-attr]
    reply = parse({"msgtype": "m.text", "body": "> <@chital:fake.test> old\n\nnew words",
                   "m.relates_to": {"m.in_reply_to": {"event_id": "$old"}}}, to_me=True)  # fmt: skip
    assert reply is not None and reply.addressed and reply.text == "new words", "the quoted fallback is cut"


def test_what_is_not_for_the_agent() -> None:
    assert parse({"msgtype": "m.notice", "body": "another bot"}) is None
    edit = {"msgtype": "m.text", "body": "* x", "m.new_content": {"body": "x"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": "$a"}}  # fmt: skip
    assert parse(edit) is None
    assert parse({"anything": 1}, etype="m.reaction") is None
    sticker = parse({"body": "a cat", "url": "mxc://x/y"}, direct=True, etype="m.sticker")
    assert sticker is not None and sticker.unsupported == "stickers" and sticker.addressed
    enc = parse({"algorithm": "m.megolm.v1.aes-sha2"}, direct=True, etype="m.room.encrypted")
    assert enc is not None and enc.unsupported == ENCRYPTED_NOTE
    encrypted_file = parse({"msgtype": "m.file", "body": "a.pdf", "file": {"url": "mxc://x/y"}}, direct=True)
    assert encrypted_file is not None and encrypted_file.unsupported == "encrypted files"
    for bad in ({"msgtype": "m.text", "body": None}, {"msgtype": 5, "body": "x"},
                {"msgtype": "m.file", "body": "a"}, {"msgtype": "m.image", "body": "a", "url": "https://x/y"},
                {"msgtype": "m.text", "body": "x", "m.relates_to": "nope"}):  # fmt: skip
        with pytest.raises((TypeError, ValueError)):
            parse(bad)


def test_threads_are_conversations_of_their_own() -> None:
    rel = {"rel_type": "m.thread", "event_id": "$root", "is_falling_back": True,
           "m.in_reply_to": {"event_id": "$latest"}}  # fmt: skip
    inbound = parse({"msgtype": "m.text", "body": "Chital: hi", "m.relates_to": rel})
    assert inbound is not None and inbound.thread_id == "$root"
    assert inbound.conversation == f"matrix:{ROOM}:$root"


def test_render_pings_nobody_and_escapes_html() -> None:
    part = render("see [@alice](https://matrix.to/#/@alice:x) and @room <b onclick=x>hi</b>")[0]
    assert part.payload["m.mentions"] == {}
    html = part.payload["formatted_body"]
    assert "matrix.to" not in html and "<b onclick" not in html and "&lt;b onclick=x&gt;" in html


async def test_a_group_joined_later_has_its_history_left_alone(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    """A room's history comes with the join; in a group it is not answered, in a DM it is (the
    person often writes before the bot accepted the invite)."""
    group, dm = f"!g:{SERVER}", f"!d:{SERVER}"
    sink = Sink()
    async with running(matrix_hs, tmp_path, sink):
        for room, members in ((group, (ALICE, f"@bob:{SERVER}")), (dm, (ALICE,))):
            matrix_hs._members[room] = set(members)
            matrix_hs.inject_text(room, ALICE, f"Chital: before the join in {room}")
            matrix_hs.invite(room, ALICE)
        await matrix_hs.wait_for(lambda: sink.items, what="the DM's early message")
        after = matrix_hs.inject_text(group, ALICE, "Chital: after the join")
        await matrix_hs.wait_for(
            lambda: any(i.message_id == after["event_id"] for i in sink.items), what="after"
        )
    texts = [i.text for i in sink.items]
    assert texts == [f"before the join in {dm}", "after the join"], texts


async def test_a_long_sync_answer_is_read_whole(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    matrix_hs.room(ROOM, ALICE)
    sink = Sink()
    async with running(matrix_hs, tmp_path, sink):
        for i in range(40):  # about 2 MB in one batch
            matrix_hs.inject_text(ROOM, ALICE, f"{i} " + "w" * 50_000)
        await matrix_hs.wait_for(lambda: len(sink.items) >= 40, what="all forty")
    assert [i.text.split()[0] for i in sink.items] == [str(i) for i in range(40)], "in order, none lost"


async def test_a_stalled_sync_is_abandoned_and_nothing_is_lost(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    matrix_hs.room(ROOM, ALICE)
    sink = Sink()
    channel = MatrixChannel(matrix_hs.base_url, matrix_hs.user_id, matrix_hs.token, sync_timeout=1,
                            state_dir=str(tmp_path), sync_grace=1.0)  # fmt: skip
    task = asyncio.create_task(channel.run(sink))
    try:
        await matrix_hs.wait_for(lambda: matrix_hs.syncs >= 2, what="the first long poll")
        matrix_hs.stall_syncs()
        stalled_at = matrix_hs.syncs
        up = matrix_hs.inject_text(ROOM, ALICE, "during the stall")
        await matrix_hs.wait_for(lambda: matrix_hs.syncs > stalled_at + 1, what="a new sync after the stall")
        assert channel.reason and "sync failed" in channel.reason
        matrix_hs.stall_syncs(False)
        await matrix_hs.wait_for(lambda: sink.items, what="the message")
        assert [i.message_id for i in sink.items] == [up["event_id"]]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await channel.close()


async def test_a_passing_401_is_checked_not_believed(matrix_hs: FakeMatrix, tmp_path: Path) -> None:
    """A proxy being redeployed can answer 401 once; whoami then accepts the token: not fatal."""
    matrix_hs.room(ROOM, ALICE)
    sink = Sink()
    async with running(matrix_hs, tmp_path, sink) as channel:
        matrix_hs.fail_next("sync", 401, errcode="M_UNKNOWN_TOKEN")
        up = matrix_hs.inject_text(ROOM, ALICE, "still here")
        await matrix_hs.wait_for(lambda: sink.items, what="the message")
        assert sink.items[0].message_id == up["event_id"]
        assert channel.state.value != "failed"


async def test_a_reply_carries_the_replied_to_message_and_an_odd_one_costs_only_the_context(
    matrix_hs: FakeMatrix, tmp_path: Path
) -> None:
    matrix_hs.room(ROOM, ALICE)
    sink = Sink()
    async with running(matrix_hs, tmp_path, sink) as channel:
        original = matrix_hs.inject_text(ROOM, f"@bob:{SERVER}", "the original words")
        odd = matrix_hs.inject_event(ROOM, {**matrix_hs.event(ALICE, {}), "content": "not an object"})
        for target in (original, odd):
            rel = {"m.in_reply_to": {"event_id": target["event_id"]}}
            matrix_hs.inject_text(ROOM, ALICE, "> <@bob> quoted\n\nmy answer", **{"m.relates_to": rel})
        await matrix_hs.wait_for(
            lambda: len([i for i in sink.items if i.text == "my answer"]) == 2, what="both"
        )
        first, second = [i for i in sink.items if i.text == "my answer"]
        context = await channel.thread_context(first, 5, 1000)
    assert [(c.author, c.text, c.replied_to, c.is_self) for c in context] == [
        (f"@bob:{SERVER}", "the original words", True, False)
    ]
    assert await channel.thread_context(second, 5, 1000) == ()


def test_parts_stay_under_the_event_size_for_any_text() -> None:
    """4,000 emoji or 4,000 ``<`` would pass a character limit and be refused as M_TOO_LARGE."""
    from channels.matrix.render import MAX_PART_BYTES, render_stream, size

    for text in ("🦌" * 20_000, "<" * 20_000, "word " * 5_000):
        parts = render(text)
        assert all(size(p.payload) <= MAX_PART_BYTES for p in parts), text[:5]
        assert "".join(p.text for p in parts).replace("\n", "").replace(" ", "") == text.replace(" ", "")
        assert size(render_stream(text).payload) <= MAX_PART_BYTES
