"""The approvals a turn reads when it starts (gateway/store/approvals.py ``approvals_at_turn``), on
both engines: one statement gives the turn's own requests, whatever their state, and the requests
still pending in its conversation on its platform (a new turn cancels those), and nothing of the
other conversations, platforms or settled requests, however many wait there."""

from __future__ import annotations

import time

from channels.base import ReplyTarget
from gateway.store.approvals import CANCELLED, ApprovalRow
from gateway.store.journal import Store


async def _ask(store: Store, n: int, key: str, conversation: str, platform: str = "telegram") -> ApprovalRow:
    target = ReplyTarget(platform, conversation.rsplit(":", 1)[-1])
    return await store.approval_add(
        f"call-{n}", f"CODE{n:04d}", key, conversation, target, f"{platform}:9", "Ann", "write_file",
        "may I?", time.time() + 600,
    )  # fmt: skip


async def test_a_turn_reads_its_own_requests_and_its_conversations_pending_ones(either_store: Store) -> None:
    store = either_store
    here = "telegram:200"
    own_settled = await _ask(store, 1, "telegram:200:5", here)
    assert await store.approval_decide(own_settled.id, CANCELLED, "x")
    own_pending = await _ask(store, 2, "telegram:200:5", here)
    older = await _ask(store, 3, "telegram:200:4", here)  # an earlier turn of the chat, waiting
    done = await _ask(store, 4, "telegram:200:3", here)
    assert await store.approval_decide(done.id, CANCELLED, "x")
    for n in range(5, 25):  # waiting in other chats, and in a chat of that id on another platform
        await _ask(store, n, f"telegram:{n}:1", f"telegram:{n}")
    await _ask(store, 25, "slack:200:1", "slack:200", platform="slack")

    mine, waiting = await store.approvals_at_turn("telegram:200:5", here, "telegram")

    assert [r.id for r in mine] == [own_settled.id, own_pending.id]
    assert [r.id for r in waiting] == [older.id]
    assert [r.id for r in await store.approvals_for("telegram:200:5")] == [r.id for r in mine]
