"""Intake, in process: who reaches the agent, what is journaled, and what a redelivery does.

The real Gateway, Store (SQLite on tmp_path), queue and delivery; the platform is a FakeChannel
(messages go through its sink as an adapter's do), the agent a FakeHarness. What the subprocess
end-to-end tests check per platform, without a subprocess or a model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from channels.base import ChannelError, Inbound
from gateway.store.entries import JournalKind, JournalState
from tests.fakes.gateway_rig import ADMIN, USER, Rig, fake_rig, make_config, quiet, replies, settled, until

STRANGER = 7
GROUP = "-100"


async def test_allowed_message_is_journaled_before_the_adapter_may_ack(rig: Rig) -> None:
    ch, store = rig.channel, rig.store
    rig.harness.gate.clear()  # the agent is slow: the answer comes long after the ack
    msg = ch.message(USER, "hello")
    await ch.deliver(msg)  # returns when the adapter may acknowledge the event
    (entry,) = await store.journal_open()
    assert (entry.key, entry.kind, entry.inbound.text) == (msg.key, JournalKind.TURN, "hello")
    assert isinstance(entry.kind, JournalKind) and isinstance(entry.state, JournalState)
    assert rig.metric("chital_messages_in_total", channel="telegram") == 1

    rig.harness.gate.set()
    assert await until(lambda: ch.replies_to(msg.message_id), what="answer") == ["echo: hello"]
    await until(lambda: rig.metric("chital_turns_total", outcome="ok") == 1, what="turn counted")
    assert await store.journal_open() == []
    assert (await store.journal_counts()) == {"done": 1}
    assert rig.harness.turns[0][1] == "hello"


async def test_redelivered_message_is_answered_once(rig: Rig) -> None:
    ch = rig.channel
    rig.harness.gate.clear()
    msg = ch.message(USER, "once please")
    await ch.deliver(msg)
    await ch.deliver(msg)  # the platform redelivers before the answer...
    rig.harness.gate.set()
    await until(lambda: ch.replies_to(msg.message_id), what="answer")
    await ch.deliver(msg)  # ... and after it (a reconnect replay)
    await quiet(0.2)
    assert ch.replies_to(msg.message_id) == ["echo: once please"]
    assert len(rig.harness.calls) == 1
    assert rig.metric("chital_messages_ignored_total", channel="telegram", reason="duplicate") == 2


async def test_stranger_gets_a_pairing_code_and_the_admin_is_told(rig: Rig) -> None:
    ch = rig.channel
    msg = ch.message(STRANGER, "let me in", name="Mallory")
    await ch.deliver(msg)
    (code_note,) = await until(lambda: ch.replies_to(msg.message_id), what="pairing code")
    assert "pairing code is" in code_note
    (announcement,) = await until(lambda: ch.in_chat(str(ADMIN)), what="announcement")
    assert "Mallory" in announcement and "asks to use the bot" in announcement
    await ch.deliver(ch.message(STRANGER, "hello??"))  # reminders are throttled: nothing more
    await quiet(0.2)
    assert len(ch.in_chat(str(STRANGER))) == 1 and len(ch.in_chat(str(ADMIN))) == 1
    assert rig.harness.calls == [], "a stranger never reaches the agent"


async def test_group_messages_need_an_address_and_a_known_sender(rig: Rig) -> None:
    ch, store = rig.channel, rig.store
    chatter = ch.message(USER, "talking among ourselves", chat=GROUP)
    await ch.deliver(chatter)
    assert not await store.journal_seen(chatter.key), "not for the bot: not even journaled"
    assert rig.metric("chital_messages_ignored_total", channel="telegram", reason="not_for_bot") == 1

    stranger = ch.message(STRANGER, "@bot do my work", chat=GROUP, addressed=True)
    await ch.deliver(stranger)
    (refusal,) = await until(lambda: ch.replies_to(stranger.message_id), what="refusal")
    assert refusal.startswith("Sorry, I only answer people I know.")

    member = ch.message(USER, "@bot hi", chat=GROUP, addressed=True)
    await ch.deliver(member)
    assert await until(lambda: ch.replies_to(member.message_id), what="answer") == ["echo: @bot hi"]
    assert [text for _, text in rig.harness.turns] == ["@bot hi"]


async def test_pairing_off_denies_a_stranger_in_a_dm(tmp_path: Path) -> None:
    config = make_config(access={"allow_users": [str(USER)], "pairing": False})
    async with fake_rig(tmp_path, config) as rig:
        msg = rig.channel.message(STRANGER, "hi")
        await rig.channel.deliver(msg)
        (note,) = await until(lambda: rig.channel.replies_to(msg.message_id), what="refusal")
        assert note.startswith("Sorry, I only answer people I know.")
        assert await rig.store.pairing_list() == [] and rig.harness.calls == []


async def test_commands_are_journaled_run_once_and_never_reach_the_agent(rig: Rig) -> None:
    ch, store = rig.channel, rig.store
    help_msg = ch.message(USER, "/help")
    await ch.deliver(help_msg)
    await ch.deliver(help_msg)  # redelivered
    (text,) = await until(lambda: ch.replies_to(help_msg.message_id), what="help")
    assert text.startswith("Commands:") and "/stop" in text and "/approve" not in text

    status = ch.message(USER, "/status")
    await ch.deliver(status)
    (text,) = await until(lambda: ch.replies_to(status.message_id), what="status")
    assert "Model: fake-model" in text and "Now: idle; 0 queued" in text

    unknown = ch.message(USER, "/frobnicate now")
    await ch.deliver(unknown)
    (text,) = await until(lambda: ch.replies_to(unknown.message_id), what="unknown")
    assert text.startswith("Unknown command /frobnicate.")
    await quiet(0.1)
    assert len(ch.replies_to(help_msg.message_id)) == 1, "one reply to a redelivered command"
    assert rig.harness.calls == []
    kinds = {key: kind for key, kind in await _kinds(rig)}
    assert kinds == {help_msg.key: "command", status.key: "command", unknown.key: "notice"}
    await settled(store)  # fails if an entry stays open: each is marked done a moment after its reply


async def test_what_the_agent_cannot_use_gets_a_journaled_note(tmp_path: Path) -> None:
    config = make_config(access={"allow_users": [str(USER)]}, limits={"max_message_chars": 20})
    async with fake_rig(tmp_path, config) as rig:
        ch = rig.channel
        sticker = ch.message(USER, "", unsupported="sticker")
        empty = ch.message(USER, "   ")
        long = ch.message(USER, "x" * 21)
        for msg in (sticker, empty, long):
            await ch.deliver(msg)
        notes = [await until(replies(ch, m)) for m in (sticker, empty, long)]
        assert notes[0] == ["I can't use stickers yet; please describe what you need in words."]
        assert notes[1] == ["I received an empty message. What can I do for you?"]
        assert notes[2][0].startswith("⚠️ Your message is 21 characters long; I take at most 20.")
        assert rig.harness.calls == []
        assert {kind for _, kind in await _kinds(rig)} == {"notice"}


async def test_a_closing_gateway_refuses_without_journaling(rig: Rig) -> None:
    await rig.gateway.close(0)
    msg = rig.channel.message(USER, "too late")
    with pytest.raises(ChannelError):
        await rig.channel.deliver(msg)  # the adapter does not ack: the platform redelivers later
    assert not await rig.store.journal_seen(msg.key)


async def test_a_message_the_journal_refuses_is_skipped_with_a_note(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A content error (here: the journal refusing the text) must not wedge the adapter: the
    message becomes an unreadable marker, journaled and answered, and the event is acked."""
    store = rig.store
    real = store.journal_add

    async def picky(
        inbound: Inbound, kind: str, note: str = "", lease: tuple[str, float] | None = None
    ) -> bool:
        if "poison" in inbound.text:
            raise ValueError("cannot encode")
        return await real(inbound, kind, note, lease)

    monkeypatch.setattr(store, "journal_add", picky)
    msg = rig.channel.message(USER, "poison pill")
    await rig.channel.deliver(msg)
    (note,) = await until(lambda: rig.channel.replies_to(msg.message_id), what="note")
    assert note.startswith("⚠️ I couldn't read that message")
    assert rig.channel.unreadable_events == 1 and rig.harness.calls == []


async def _kinds(rig: Rig) -> list[tuple[str, str]]:
    async with rig.store._db.execute("SELECT key, kind FROM journal") as cur:
        return [(str(k), str(v)) for k, v in await cur.fetchall()]
