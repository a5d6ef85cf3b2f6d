"""WeCom template-card buttons and file uploads: WeComChannel against the fake long connection
(tests/fakes/wecom_cards.py), alone or with the real gateway (tests/fakes/gateway_rig.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from channels.base import (
    Action,
    ActionAnswer,
    Button,
    ChannelState,
    Inbound,
    OutFile,
    PermanentSendError,
    Rendered,
    ReplyTarget,
    TransientSendError,
)
from channels.wecom import cards
from channels.wecom.channel import WeComChannel
from tests.fakes.gateway_rig import Rig
from tests.fakes.gateway_rig import running as rig_running
from tests.fakes.malformed import SECRET, Case, leaked, malformed_total, put, variants
from tests.fakes.wecom_cards import TASK
from tests.fakes.wecom_server import FakeWeCom, Shown

ALICE = "alice"
GROUP = "wrgroup42"
BUTTONS = [
    Button("✅ Approve", "approval:approve:ABC", "primary"),
    Button("❌ Deny", "approval:deny:ABC", "danger"),
]


@pytest.fixture
def allowed_users() -> list[str]:
    return [f"wecom:{ALICE}"]


class Sink:
    async def __call__(self, inbound: Inbound) -> None:
        return None


@contextlib.asynccontextmanager
async def running(fake: FakeWeCom) -> AsyncIterator[WeComChannel]:
    channel = WeComChannel(fake.bot_id, fake.secret, ws_url=fake.url, heartbeat_interval=5.0)
    task = asyncio.create_task(channel.run(Sink()))
    try:
        await fake.wait_for(lambda: fake.connected, what="the subscription")
        yield channel
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await channel.close()


def _shown(fake: FakeWeCom, chat: str, kind: str, needle: str = "") -> Any:
    return lambda: next((m for m in fake.bot_messages(chat) if m.kind == kind and needle in m.text), None)


# -- the card itself ------------------------------------------------------------------------------
def test_card_bounds_labels_and_refuses_what_wecom_would() -> None:
    task = cards.task_id("approval:7", "some chat/with odd chars")
    assert TASK.match(task) and len(task) <= 128
    label = "Pick <@boss> @all \u202eevil\u200b and a tail far too long"
    card = cards.card_body(task, "Title line\nsecond", [Button(label, "v1"), Button("B", "v2")])
    text = card["button_list"][0]["text"]
    assert len(text) <= cards.LABEL_CHARS and "\u202e" not in text and "\u200b" not in text, text
    assert "<" not in text and "@" not in text and text.startswith("Pick ‹＠boss› ＠"), text
    with pytest.raises(PermanentSendError, match="1 to 6 buttons"):
        cards.card_body(task, "t", [Button(str(n), f"v{n}") for n in range(7)])
    with pytest.raises(PermanentSendError, match="card key"):
        cards.card_body(task, "t", [Button("big", "v" * 1025)])
    with pytest.raises(PermanentSendError, match="one value"):
        cards.card_body(task, "t", [Button("a", "v"), Button("b", "v")])


async def test_card_sent_then_closed_in_place_within_seconds_of_the_press(wecom: FakeWeCom) -> None:
    async with running(wecom) as channel:
        presses: list[Action] = []

        async def sink(action: Action) -> ActionAnswer:
            presses.append(action)
            return ActionAnswer("ok")

        channel.on_action(sink)
        target = ReplyTarget("wecom", GROUP)
        mid = await channel.send_buttons(target, Rendered("Run write_file?"), BUTTONS, idempotency_key="k1")
        assert (
            await channel.send_buttons(target, Rendered("Run write_file?"), BUTTONS, idempotency_key="k1")
            == mid
        )
        card: Shown = await wecom.wait_for(_shown(wecom, GROUP, "card"))
        assert len(wecom.cards_in(GROUP)) == 1, "a repeated send is the same card"
        wecom.inject_press(ALICE, card, "approval:approve:ABC", group=GROUP)
        await wecom.wait_for(lambda: presses, what="the press")
        assert presses[0].sender_id == ALICE and presses[0].chat_id == GROUP and presses[0].message_id == mid
        await channel.close_buttons(target, mid, Rendered("Run write_file?\n✅ Approved by alice"))
        assert card.card["card_type"] == "text_notice" and "Approved" in card.text
        assert "button_list" not in card.card


async def test_decision_after_the_update_window_is_a_message_and_the_buttons_stay(wecom: FakeWeCom) -> None:
    wecom.update_window = 0.0  # WeCom no longer takes the update
    async with running(wecom) as channel:
        channel.on_action(lambda a: asyncio.sleep(0, ActionAnswer("ok")))
        target = ReplyTarget("wecom", ALICE)
        mid = await channel.send_buttons(target, Rendered("Run it?"), BUTTONS, idempotency_key="k2")
        card: Shown = await wecom.wait_for(_shown(wecom, ALICE, "card"))
        wecom.inject_press(ALICE, card, "approval:deny:ABC")
        await asyncio.sleep(0.3)
        await channel.close_buttons(target, mid, Rendered("Run it?\n❌ Denied by alice"))
        await wecom.wait_for(_shown(wecom, ALICE, "markdown", "Denied by alice"), what="the decision")
        assert card.card["button_list"], "WeCom refused the update: the card still shows its buttons"


async def test_a_long_prompt_goes_first_as_text_then_the_card(wecom: FakeWeCom) -> None:
    async with running(wecom) as channel:
        text = "Run this?\n" + "x " * 400
        await channel.send_buttons(ReplyTarget("wecom", ALICE), Rendered(text), BUTTONS, idempotency_key="k3")
        md = await wecom.wait_for(_shown(wecom, ALICE, "markdown", "x x x"))
        card = await wecom.wait_for(_shown(wecom, ALICE, "card"))
        assert md.text.strip() == text.strip() and card.card["main_title"]["title"] == "Run this?"


async def test_an_event_sent_again_is_one_press_and_the_presser_is_the_events(wecom: FakeWeCom) -> None:
    """The same event twice (same msgid) reaches the gateway once; a key naming someone else (a
    forged payload) changes nothing about who pressed: the event's ``from.userid``."""
    async with running(wecom) as channel:
        presses: list[Action] = []

        async def sink(action: Action) -> ActionAnswer:
            presses.append(action)
            return ActionAnswer("ok")

        channel.on_action(sink)
        target = ReplyTarget("wecom", GROUP)
        await channel.send_buttons(target, Rendered("Pick"), BUTTONS, idempotency_key="k5")
        card: Shown = await wecom.wait_for(_shown(wecom, GROUP, "card"))
        body = good_press()
        body["event"].update(task_id=card.card["task_id"], event_key="approval:approve:ABC|user=boss")
        frame = {"cmd": "aibot_event_callback", "headers": {"req_id": "ev-again"}, "body": body}
        wecom._push(frame)
        wecom._push(frame)
        wecom.inject_press(ALICE, card, "approval:deny:ABC", group=GROUP)  # read after both
        await wecom.wait_for(lambda: len(presses) >= 2, what="the presses")
        assert [(p.sender_id, p.chat_id, p.value) for p in presses] == [
            (ALICE, GROUP, "approval:approve:ABC|user=boss"),
            (ALICE, GROUP, "approval:deny:ABC"),
        ]


async def test_an_accepted_press_whose_card_stays_open_is_answered_in_the_chat(wecom: FakeWeCom) -> None:
    """A press the gateway accepts without closing the card (a skill draft's) is not silent: its
    note comes as a message once the card could no longer have been closed."""
    async with running(wecom) as channel:

        async def sink(action: Action) -> ActionAnswer:
            return ActionAnswer("✅ Approved the skill `tidy` by <@boss>")

        channel.on_action(sink)
        await channel.send_buttons(
            ReplyTarget("wecom", ALICE), Rendered("Skill draft"), BUTTONS, idempotency_key="k6"
        )
        card: Shown = await wecom.wait_for(_shown(wecom, ALICE, "card"))
        wecom.inject_press(ALICE, card, "approval:approve:ABC")
        note = await wecom.wait_for(_shown(wecom, ALICE, "markdown", "Approved the skill"), what="the note")
        assert "<@boss>" not in note.text, "the note pings nobody"


# -- presses WeCom (or someone) sends that cannot be answered ---------------------------------------
def good_press() -> dict[str, Any]:
    task = cards.task_id("approval:1", GROUP)
    return {"msgid": "ev-1", "aibotid": "aib", "chattype": "group", "chatid": GROUP, "from": {"userid": ALICE},
            "msgtype": "event", "event": {"eventtype": "template_card_event", "event_key": "approval:approve:X",
                                          "task_id": task}}  # fmt: skip


TABLE: dict[tuple[str, ...], tuple[tuple[str, ...], bool]] = {
    ("event", "event_key"): (
        ("missing", "null", "number", "object", "list", "huge id", "control chars"),
        True,
    ),
    ("event", "task_id"): (
        ("missing", "null", "number", "object", "huge id", "control chars", "string"),
        True,
    ),
    ("from", "userid"): (("missing", "null", "number", "object", "huge id", "control chars"), False),
    ("chatid",): (("missing", "null", "number", "huge id", "control chars"), False),
}


@pytest.mark.parametrize("case", variants(TABLE), ids=lambda c: c.id)
async def test_malformed_press_is_counted_told_and_never_stops_the_loop(
    case: Case, wecom: FakeWeCom, adapter_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    channel = WeComChannel(wecom.bot_id, wecom.secret, ws_url=wecom.url, heartbeat_interval=5.0)
    async with rig_running(channel, adapter_rig):
        body = put(good_press(), case.path, case.value)
        wecom._push({"cmd": "aibot_event_callback", "headers": {"req_id": "ev-req-1"}, "body": body})
        wecom.inject_text(ALICE, "after the press")
        await wecom.wait_for(_shown(wecom, ALICE, "stream", "echo: after the press"), what="the next message")
        if case.told:
            await wecom.wait_for(
                _shown(wecom, GROUP, "markdown", "couldn't read that button"), what="the note"
            )
        assert channel.state is ChannelState.CONNECTED
    assert malformed_total(adapter_rig, "wecom") == 1
    assert not leaked(caplog.records)
    assert all(SECRET not in m.text for m in wecom.messages)


# -- files out ------------------------------------------------------------------------------------
async def test_upload_refused_midway_or_busy_or_too_big_is_a_specific_error(wecom: FakeWeCom) -> None:
    target = ReplyTarget("wecom", ALICE)
    data = b"%PDF" + b"x" * (700 * 1024)
    async with running(wecom) as channel:
        wecom.fail_upload = ("aibot_upload_media_chunk", 40008)
        with pytest.raises(PermanentSendError, match=r"report\.pdf.*chunk 1 of 2"):
            await channel.send_file(target, OutFile("report.pdf", data), idempotency_key="f1")
        wecom.fail_upload = ("aibot_upload_media_finish", -1)
        with pytest.raises(TransientSendError, match="busy"):
            await channel.send_file(target, OutFile("report.pdf", data), idempotency_key="f2")
        assert not [m for m in wecom.messages if m.kind == "file"], "nothing was shown as sent"
        frames = len(wecom.received)
        with pytest.raises(PermanentSendError, match="up to 20 MB"):
            await channel.send_file(
                target, OutFile("huge.bin", b"0" * (20 * 1024 * 1024 + 1)), idempotency_key="f3"
            )
        assert len(wecom.received) == frames, "an over-limit file is refused before any frame"
        await channel.send_file(
            target, OutFile("../../etc/pic\u202e.png", b"\x89PNG" + b"p" * 100), idempotency_key="f4"
        )
        pic = await wecom.wait_for(_shown(wecom, ALICE, "image"))
        assert pic.media.startswith(b"\x89PNG") and "/" not in pic.text and "\u202e" not in pic.text
