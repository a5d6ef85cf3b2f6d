"""A /stop that lands while the turn is posting its approval buttons, before it has paused, through
`chital run` on the fake Telegram with the fake model asking for gated calls.

The fake Telegram holds the answer to one buttons message (it is in the chat, the daemon waits for
its id), so the /stop arrives exactly in that window with no timing guess. Asserted is what people
see: every buttons message of the stopped turn loses its buttons and says it was cancelled (the one
whose id the daemon never learnt, at its first press), a late press is told the request was
cancelled, the reply says "Stopped", and the gated call never runs (the model is never called again
and never gets a tool result)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.daemon import chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, replies_to

AGENT = {"memory": {"enabled": False}, "approvals": {"tools": ["web_fetch"], "timeout": 600}}


def fetch(url: str) -> ToolCall:
    return ToolCall("web_fetch", {"url": url})


def buttons_messages(tg: FakeTelegram) -> list[Any]:
    """The approval requests the bot posted (live or settled), oldest first."""
    return [m for m in tg.bot_messages(OWNER) if "Approval needed" in m.text]


async def press(tg: FakeTelegram, message_id: int, label: str = "Approve") -> str:
    update = tg.press_button(OWNER, message_id, OWNER, label)
    qid = update["callback_query"]["id"]
    answer = await tg.wait_for(lambda: tg.answered_queries.get(qid), timeout=30, what="the press's answer")
    return str(answer.get("text", ""))


async def test_stop_while_the_buttons_are_being_posted_withdraws_them_and_nothing_runs(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(
        Reply(tool_calls=[fetch("https://example.org/one"), fetch("https://example.org/two")]),
        Reply(text="MODEL-CALLED-AGAIN"),
    )
    # The second request's message lands in the chat; its answer (its id) is held back.
    release = tg.hold_answer("sendMessage", lambda p: "reply_markup" in p, skip=1)
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[str(OWNER)], agent=AGENT)
    try:
        async with started_daemon(tmp_path, cfg):
            up = tg.inject_message(OWNER, OWNER, "fetch both pages", first_name="Ann")
            mid = up["message"]["message_id"]
            await tg.wait_for(lambda: tg.holding or None, timeout=30, what="the second buttons in flight")
            first, second = buttons_messages(tg)
            assert tg.buttons(OWNER, first.message_id) and tg.buttons(OWNER, second.message_id)

            stop = tg.inject_message(OWNER, OWNER, "/stop", first_name="Ann")
            await tg.wait_for(
                lambda: any(
                    "Stopping" in m.text for m in replies_to(tg, OWNER, stop["message"]["message_id"])
                ),
                timeout=30,
                what="the /stop's reply",
            )
            # The request whose id was on record: withdrawn at once, no press needed.
            await tg.wait_for(
                lambda: not tg.buttons(OWNER, first.message_id) or None, timeout=30, what="first withdrawn"
            )
            assert "Cancelled: stopped by" in tg.message(OWNER, first.message_id).text
            await tg.wait_for(
                lambda: any(m.text == "⏹ Stopped." for m in replies_to(tg, OWNER, mid)) or None,
                timeout=30,
                what="the stopped reply",
            )
            release.set()  # the daemon may read the held answer now: it changes nothing

            # A late press on the request whose id was never learnt: refused in words, and its
            # buttons taken off the message pressed.
            late = await press(tg, second.message_id)
            assert "Already settled" in late and "Cancelled" in late, late
            await tg.wait_for(
                lambda: not tg.buttons(OWNER, second.message_id) or None, timeout=30, what="second withdrawn"
            )
            assert "Cancelled" in tg.message(OWNER, second.message_id).text
            # A press on the withdrawn one (a stale client) is refused the same way.
            tg.push_update(
                {
                    "callback_query": {
                        "id": "Q-stale",
                        "from": {"id": OWNER, "is_bot": False, "first_name": "Ann"},
                        "message": tg.message(OWNER, first.message_id).raw,
                        "chat_instance": str(OWNER),
                        "data": first_approve_data(tg),
                    }
                }
            )
            answer = await tg.wait_for(lambda: tg.answered_queries.get("Q-stale"), timeout=30)
            assert "Already settled" in str(answer)
            calls = len(model.requests)
    finally:
        release.set()
    assert calls == 1, "the model was never called again: nothing ran, nothing resumed"
    assert not any("MODEL-CALLED-AGAIN" in m.text for m in tg.bot_messages(OWNER))
    assert not any("Approved" in m.text for m in tg.bot_messages(OWNER))


def first_approve_data(tg: FakeTelegram) -> str:
    """The Approve button's data the first request carried (as the bot posted it)."""
    seen = [c for c in tg.calls_to("sendMessage") if "reply_markup" in c.params]
    markup = seen[0].params["reply_markup"]
    markup = markup if isinstance(markup, dict) else json.loads(markup)
    return str(markup["inline_keyboard"][0][0]["callback_data"])


async def test_stop_while_the_only_request_is_being_posted(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """One gated call, its buttons' answer held: the stop comes before the daemon knows the
    message's id. The first press is refused with the reason and takes the buttons off."""
    model.script(Reply(tool_calls=[fetch("https://example.org/only")]), Reply(text="MODEL-CALLED-AGAIN"))
    release = tg.hold_answer("sendMessage", lambda p: "reply_markup" in p)
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[str(OWNER)], agent=AGENT)
    try:
        async with started_daemon(tmp_path, cfg):
            up = tg.inject_message(OWNER, OWNER, "fetch the page", first_name="Ann")
            mid = up["message"]["message_id"]
            await tg.wait_for(lambda: tg.holding or None, timeout=30, what="the buttons in flight")
            (request,) = buttons_messages(tg)
            tg.inject_message(OWNER, OWNER, "/stop", first_name="Ann")
            await tg.wait_for(
                lambda: any(m.text == "⏹ Stopped." for m in replies_to(tg, OWNER, mid)) or None,
                timeout=30,
                what="the stopped reply",
            )
            release.set()
            answer = await press(tg, request.message_id)
            assert "Already settled" in answer and "Cancelled" in answer, answer
            await tg.wait_for(lambda: not tg.buttons(OWNER, request.message_id) or None, timeout=30)
            typed = tg.inject_message(OWNER, OWNER, f"approve {code_of(request.text)}", first_name="Ann")
            note = await tg.wait_for(
                lambda: next((m.text for m in replies_to(tg, OWNER, typed["message"]["message_id"])), None),
                timeout=30,
                what="the typed answer's note",
            )
            assert "Already settled" in note
            calls = len(model.requests)
    finally:
        release.set()
    assert calls == 1, "nothing ran and nothing resumed"
    assert not any("MODEL-CALLED-AGAIN" in m.text for m in tg.bot_messages(OWNER))


def code_of(text: str) -> str:
    """The request's code, from "Or reply approve CODE or deny CODE"."""
    return text.split("approve ", 1)[1].split()[0].strip("`")
