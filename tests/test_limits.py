"""The limits config.yaml promises, enforced by the real Gateway (in process): a full conversation
queue and a user over their message rate get a note, journaled, answered exactly once."""

from __future__ import annotations

from pathlib import Path

from gateway.intake.limits import SlidingWindow
from tests.fakes.gateway_rig import close_gateway, dm, make_config, make_gateway, quiet, until

ADMIN = 100
USER = 200


async def test_full_queue_is_refused_with_a_note(tmp_path: Path) -> None:
    config = make_config(access={"allow_users": [str(USER)]}, concurrency={"max_queue_per_conversation": 2})
    gw, ch, harness = await make_gateway(tmp_path, config)
    try:
        harness.gate.clear()  # the agent is busy: turns pile up
        msgs = [dm(USER, f"m{i}") for i in range(4)]
        for m in msgs[:3]:
            await gw.accept(m)
        await until(lambda: len(harness.turns) == 1, what="first turn running")
        assert gw.turns.status(f"telegram:{USER}")[1] == 2
        await gw.accept(msgs[3])
        note = (await until(lambda: ch.replies_to(msgs[3].message_id), what="note"))[0]
        assert note == (
            "⏳ I already have 2 messages waiting in this chat; "
            "please wait for my answers before sending more."
        )
        await gw.accept(msgs[3])  # redelivered by the platform: no second note

        harness.gate.set()
        for m in msgs[:3]:
            await until(lambda m=m: ch.replies_to(m.message_id) == [f"echo: {m.text}"], what=m.text)
        await quiet(0.1)
        assert [t for _, t in harness.turns] == ["m0", "m1", "m2"], "the refused one never ran"
        assert ch.replies_to(msgs[3].message_id) == [note], "answered exactly once"
        open_keys = [e.key for e in await gw.store.journal_open()]
        assert msgs[3].key not in open_keys, "the refusal is finished, not left for a resume"
        later = dm(USER, "after the queue drained")
        await gw.accept(later)
        await until(lambda: ch.replies_to(later.message_id) == ["echo: after the queue drained"])
    finally:
        await close_gateway(gw)


async def test_user_rate_limit_with_admins_exempt(tmp_path: Path) -> None:
    config = make_config(
        access={"allow_users": [str(USER)], "admins": [str(ADMIN)]},
        limits={"user_messages_per_minute": 2},
    )
    gw, ch, harness = await make_gateway(tmp_path, config)
    try:
        msgs = [dm(USER, f"u{i}") for i in range(3)]
        for m in msgs:
            await gw.accept(m)
        note = (await until(lambda: ch.replies_to(msgs[2].message_id), what="rate note"))[0]
        assert note.startswith("🐢 You are sending messages faster than I can take them (at most 2")
        assert "Please wait about" in note
        await gw.accept(msgs[2])  # redelivery: still one note
        status = dm(USER, "/status")  # commands are not counted
        await gw.accept(status)
        assert "Thread:" in (await until(lambda: ch.replies_to(status.message_id)))[0]
        for i in range(5):
            m = dm(ADMIN, f"a{i}")
            await gw.accept(m)
            await until(lambda m=m: ch.replies_to(m.message_id) == [f"echo: {m.text}"], what=m.text)
        await quiet(0.1)
        assert ch.replies_to(msgs[2].message_id) == [note]
        assert [t for _, t in harness.turns if t.startswith("u")] == ["u0", "u1"]
    finally:
        await close_gateway(gw)


def test_sliding_window() -> None:
    w = SlidingWindow(2, 60.0, max_keys=3)
    assert w.hit("a", now=0) == 0 and w.hit("a", now=1) == 0
    assert w.hit("a", now=2) == 58.0, "refused until the oldest event leaves the window"
    assert w.hit("a", now=30) == 30.0, "a refusal is not counted"
    assert w.hit("a", now=60.5) == 0
    for key in "bcdefg":  # a flood of distinct keys stays bounded
        w.hit(key, now=61)
    assert len(w._events) <= 3
