"""The store's side of handing a conversation's next turn from one daemon to another without a
sweep (docs/scale-out.md, "What coordination costs"), on SQLite and PostgreSQL alike:

- a turn journaled by daemon B while an earlier turn of its conversation is daemon A's gets no
  lease (B would only fail to claim it and give it back);
- A's done mark says, in the same statement, that such a turn waits, and A takes it with one claim;
- a turn's claim can mark it running, as the runner's own statement did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from channels.base import Inbound
from channels.messages import ReplyTarget
from gateway.daemon.cluster import Leases
from gateway.store import entries
from gateway.store.entries import (
    BACKGROUND_MARK,
    AtClaim,
    JournalEntry,
    JournalKind,
    JournalState,
    conversation_of,
)
from gateway.store.journal import Store


def _msg(mid: str, chat: str = "1") -> Inbound:
    return Inbound(
        platform="slack", chat_id=chat, message_id=mid, sender_id="U9", text=f"m{mid}",
        is_direct=True, addressed=True,
    )  # fmt: skip


async def test_a_turn_behind_another_daemons_waits_unleased_and_is_handed_on(either_store: Store) -> None:
    s = either_store
    first, second, third = _msg("1"), _msg("2"), _msg("3")
    assert await s.journal_add_leased(first, JournalKind.TURN, lease=("A", 15)) == (True, True)
    assert await s.lease_claim(first.key, "A", 15, start=True)  # claimed and marked running at once
    [running] = await s.journal_open()
    assert (running.state, running.attempts) == (JournalState.RUNNING, 1)

    # B takes the chat's next message while A still runs the first: journaled, with no lease.
    assert await s.journal_add_leased(second, JournalKind.TURN, lease=("B", 15)) == (True, False)
    # Another chat's message on B is B's at once; a notice needs no order, so it is leased too.
    assert await s.journal_add_leased(_msg("1", chat="2"), JournalKind.TURN, lease=("B", 15)) == (True, True)
    assert await s.journal_add_leased(_msg("n", chat="1"), JournalKind.NOTICE, "hi", ("B", 15)) == (
        True,
        True,
    )
    # The third message, on A, waits too: an earlier open turn (the second) is nobody's.
    assert await s.journal_add_leased(third, JournalKind.TURN, lease=("A", 15)) == (True, False)
    assert await s.journal_add_leased(second, JournalKind.TURN, lease=("B", 15)) == (
        False,
        False,
    )  # redelivery
    assert await s.lease_holders() == {"A": 1, "B": 2, "": 2}

    conversation = running.conversation
    assert await s.lease_claim_next(conversation, "B", 15) is None  # the first is A's, live, still open
    assert await s.journal_done(first.key, look_next=True)  # ... and a later turn waits for no one now
    nxt = await s.lease_claim_next(conversation, "A", 15)
    assert nxt is not None and (nxt.key, nxt.kind, nxt.from_journal) == (second.key, JournalKind.TURN, True)
    assert nxt.inbound.text == "m2"
    assert await s.lease_owner(second.key) == "A"
    assert await s.lease_claim_next(conversation, "B", 15) is None  # behind A's live second
    after = await s.lease_claim_next(conversation, "A", 15)  # A's own queue keeps the order
    assert after is not None and after.key == third.key
    assert not await s.journal_done(second.key, look_next=True)  # the third is A's, live: nothing waits
    assert await s.lease_claim_next(conversation, "A", 15) is None
    assert not await s.journal_done(third.key)  # without look_next: just done
    assert {e.key for e in await s.journal_open()} == {"slack:2:1", "slack:1:n"}


async def test_a_lapsed_turn_is_handed_on_and_a_live_one_is_not(either_store: Store) -> None:
    s = either_store
    first, second = _msg("1"), _msg("2")
    assert await s.journal_add_leased(first, JournalKind.TURN, lease=("A", 15)) == (True, True)
    assert await s.journal_add_leased(second, JournalKind.TURN, lease=("A", -1)) == (True, True)  # lapsed
    assert await s.journal_done(first.key, look_next=True)  # the second's lease lapsed: it waits for anyone
    nxt = await s.lease_claim_next(conversation_of(first), "B", 15)
    assert nxt is not None and nxt.key == second.key
    assert await s.lease_owner(second.key) == "B"


async def test_a_turns_claim_says_which_reads_its_start_can_skip(either_store: Store) -> None:
    """The claim that marks a turn running also says whether its conversation has a ``/model``
    choice, an open question, and approvals of the turn or pending ones (each a read the turn's
    start skips when the answer is no); another conversation's rows do not count."""
    s = either_store
    first, elsewhere = _msg("1"), _msg("1", chat="2")
    conv, other = conversation_of(first), conversation_of(elsewhere)
    await s.journal_add_leased(first, JournalKind.TURN, lease=("A", 15))
    assert await s.lease_claim_turn(first.key, "A", 15, conv) == AtClaim(False, False, False)
    assert await s.lease_claim_turn(first.key, "B", 15, conv) is None  # A's live lease: not claimed

    await s.choose_model(other, "big", "U9")
    await s.choice_add("C0", "k0", other)
    await _approval(s, "x0", "k0", other)
    assert await s.lease_claim_turn(first.key, "A", 15, conv) == AtClaim(False, False, False)

    await s.choose_model(conv, "big", "U9")
    await s.choice_add("C1", "k1", conv)
    assert await s.lease_claim_turn(first.key, "A", 15, conv) == AtClaim(True, True, False)
    await s.choose_model(conv, None, "U9")
    assert await s.choice_close("C1")
    assert await s.lease_claim_turn(first.key, "A", 15, conv) == AtClaim(False, False, False)

    await _approval(s, "p1", "k1", conv)  # an earlier turn's, pending: this turn cancels it
    assert await s.lease_claim_turn(first.key, "A", 15, conv) == AtClaim(False, False, True)
    assert await s.approval_decide("p1", "denied", "U9")
    assert await s.lease_claim_turn(first.key, "A", 15, conv) == AtClaim(False, False, False)
    await _approval(s, "m1", first.key, conv)  # this turn's own, decided: its resume reads it
    assert await s.approval_decide("m1", "approved", "U9")
    assert await s.lease_claim_turn(first.key, "A", 15, conv) == AtClaim(False, False, True)

    # A background task's turn is a conversation of its own, but takes its chat's /model choice.
    task = dataclasses.replace(_msg("7"), extra={BACKGROUND_MARK: "3"})
    await s.journal_add_leased(task, JournalKind.TURN, lease=("A", 15))
    assert conversation_of(task) == f"{conv}:bg:3"
    await s.choose_model(conv, "big", "U9")
    assert await s.lease_claim_turn(task.key, "A", 15, task.conversation) == AtClaim(True, False, False)


async def test_a_turn_alone_in_its_conversation_is_claimed_by_its_insert(either_store: Store) -> None:
    """A turn that will start at once (``start``) and finds no other open turn of its conversation
    is journaled running, with one attempt and the daemon's lease, and the insert returns what its
    claim would (one statement where there were two); one behind an open turn, even the same
    daemon's, is journaled pending and claimed later; a redelivery is neither."""
    s = either_store
    first, second, third, elsewhere = _msg("1"), _msg("2"), _msg("3"), _msg("1", chat="2")
    conv = conversation_of(first)
    await s.choose_model(conv, "big", "U9")
    await _approval(s, "p1", "k0", conv)  # an earlier turn's, pending
    fresh, leased, at_claim = await s.journal_add_turn(first, JournalKind.TURN, "", ("A", 15), start=True)
    assert (fresh, leased, at_claim) == (True, True, AtClaim(True, False, True))
    [entry] = await s.journal_open()
    assert (entry.key, entry.state, entry.attempts) == (first.key, JournalState.RUNNING, 1)
    assert await s.lease_owner(first.key) == "A"
    assert await s.lease_claim_turn(first.key, "B", 15, conv) is None  # A's now: nobody else claims it

    # Behind A's open turn: leased to A (it queues here) but pending, and claimed when it starts.
    assert await s.journal_add_turn(second, JournalKind.TURN, "", ("A", 15), start=True) == (True, True, None)
    # Behind another daemon's: neither leased nor claimed.
    assert await s.journal_add_turn(third, JournalKind.TURN, "", ("B", 15), start=True) == (True, False, None)
    assert await s.journal_add_turn(first, JournalKind.TURN, "", ("A", 15), start=True) == (
        False,
        False,
        None,
    )
    states = {e.key: (e.state, e.attempts) for e in await s.journal_open()}
    assert states[second.key] == states[third.key] == (JournalState.PENDING, 0)
    assert await s.lease_claim_turn(second.key, "A", 15, conv) is not None  # A's next, in order

    # Without ``start`` (a turn that waits for a slot) the insert leases it only.
    assert await s.journal_add_turn(elsewhere, JournalKind.TURN, "", ("B", 15)) == (True, True, None)
    states = {e.key: (e.state, e.attempts) for e in await s.journal_open()}
    assert states[elsewhere.key] == (JournalState.PENDING, 0)


async def test_two_daemons_journaling_one_chats_messages_at_once_start_one_turn(pg_url: str) -> None:
    """Two daemons journal two messages of one chat at the same moment, each insert slowed by a
    trigger so that both run before either commits: behind the conversation's lock only the
    first starts its turn, the second is journaled pending behind it (without the lock both saw
    no other open turn, and both started one on the same agent thread)."""
    import psycopg

    first, second = _msg("1"), _msg("2")
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        a, b = await Store.open_postgres(pg_url), await Store.open_postgres(pg_url)
        try:
            await conn.execute(
                "CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " PERFORM pg_sleep(0.3); RETURN NEW; END $$"
            )
            await conn.execute(
                "CREATE TRIGGER slow BEFORE INSERT ON journal FOR EACH ROW EXECUTE FUNCTION slow_insert()"
            )
            got = await asyncio.gather(
                a.journal_add_turn(first, JournalKind.TURN, "", ("A", 15), start=True),
                b.journal_add_turn(second, JournalKind.TURN, "", ("B", 15), start=True),
            )
            started = [at_claim is not None for _, _, at_claim in got]
            states = sorted(e.state.value for e in await a.journal_open())
        finally:
            await a.close()
            await b.close()
    assert started.count(True) == 1, got
    assert states == ["pending", "running"]


async def test_a_turn_its_insert_claimed_starts_only_while_its_lease_holds(
    two_stores: tuple[Store, Store],
) -> None:
    """A turn claimed by its insert starts with no statement of its own while that claim is young;
    one that waited longer (a queue, a stall) asks again: when its lease lapsed and another
    daemon's sweep took and started it meanwhile, it does not start here too (a review found
    it did, running the model and writing the thread beside the other daemon)."""
    a, b = two_stores
    leases = Leases(a, node="A", ttl=0.4)
    young, old = _msg("1"), _msg("1", chat="2")
    entries_ = []
    for msg in (young, old):
        fresh, leased, at_claim = await a.journal_add_turn(msg, JournalKind.TURN, "", ("A", 0.4), start=True)
        assert fresh and leased and at_claim is not None
        entry = JournalEntry.new(msg, JournalKind.TURN)
        entry.at_claim, entry.started = at_claim, True
        entries_.append(entry)
    assert await leases.claim(entries_[0], set(), start=True)  # young: its own lease, no statement
    await asyncio.sleep(0.6)  # A's lease on the other lapses before its queue reaches it
    assert old.key in await b.lease_orphans("B", ["slack"])
    assert await b.lease_claim_turn(old.key, "B", 15, old.conversation, conversation_of(old)) is not None
    assert not await leases.claim(entries_[1], set(), start=True)
    assert await b.lease_owner(old.key) == "B"


async def test_a_late_start_is_claimed_again_in_order(two_stores: tuple[Store, Store]) -> None:
    """A turn its insert claimed waits here past half its lease; meanwhile its chat's earlier turn,
    paused for an approval when the insert ran, was approved and resumed by another daemon (the
    later turn's lease had lapsed). The late start claims again, in order: it does not run beside
    the earlier turn on the same agent thread (a second review found it did)."""
    a, b = two_stores
    leases = Leases(a, node="A", ttl=0.4)
    t1, t2 = _msg("1"), _msg("2")
    conv = conversation_of(t1)
    assert (await a.journal_add_turn(t1, JournalKind.TURN, "", ("A", 0.4), start=True))[2] is not None
    await a.journal_pause(t1.key)  # T1 waits for an approval: not open
    _, _, at2 = await a.journal_add_turn(t2, JournalKind.TURN, "", ("A", 0.4), start=True)
    assert at2 is not None  # alone among the open turns: claimed by its insert
    late = JournalEntry.new(t2, JournalKind.TURN)
    late.at_claim, late.started = at2, True
    assert await b.journal_unpause(t1.key)  # approved: T1 is open again, before T2
    await asyncio.sleep(0.6)  # A stalls: its lease on T2 lapses
    assert await b.lease_claim_turn(t1.key, "B", 15, t1.conversation, conv) is not None
    assert not await leases.claim(late, set(), start=True)
    await b.journal_done(t1.key)
    assert await leases.claim(late, set(), start=True)  # its turn now
    # The insert's attempt stays counted although that start never ran (docs/scale-out.md).
    states = {e.key: (e.state, e.attempts) for e in await a.journal_open()}
    assert states[t2.key] == (JournalState.RUNNING, 2)


def test_a_claims_no_model_choice_stands_for_a_moment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``/model`` may come at any time: a turn that starts long after its claim (a background task
    waiting for a slot) reads the choice again."""
    seen = AtClaim(False, False, False)
    assert seen.no_model_choice() and not AtClaim(True, False, False).no_model_choice()
    monkeypatch.setattr(entries.time, "monotonic", lambda: seen.at + entries.MODEL_HINT_SECONDS + 0.1)
    assert not seen.no_model_choice()


async def _approval(s: Store, id: str, key: str, conversation: str) -> None:
    target = ReplyTarget(platform="slack", chat_id=conversation.rsplit(":", 1)[-1])
    await s.approval_add(
        id, id.upper(), key, conversation, target, "U9", "Ann", "shell", "ls", time.time() + 60
    )
