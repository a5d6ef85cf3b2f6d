"""End to end: approvals and choices as DingTalk buttons cards (channels/dingtalk/buttons.py).

`chital run` as a subprocess with a button template configured; the fake DingTalk shows the card
(its text and buttons now), and a press is the card callback frame DingTalk sends over the Stream
connection, with the presser's staff id set by the platform. What is asserted is what the users
see (the card, its buttons withdrawn and the decision shown, the refusal in the presser's 1:1 chat),
what the model saw (the tool's result, the chosen option), and the malformed-event metric.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from channels.dingtalk.buttons import LABEL_CHARS, label
from tests.daemon import DaemonProcess, started_daemon
from tests.dingtalk_daemon import FRIEND, GROUP, OWNER, STRANGER, answered, dingtalk_config
from tests.fakes.dingtalk_server import BUTTON_TEMPLATE, Card, FakeDingTalk
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall

OPTIONS = ["Small", "Large @all <@everyone> [x](https://evil.example)", "Medium\u202egnp.exe\u200b"]
ASK = ToolCall("ask_clarification", {"question": "Which size do you want?", "options": OPTIONS})
RUN = ToolCall("execute", {"command": "echo approved-run"})


def _config(
    tmp_path: Path, dingtalk: FakeDingTalk, model: FakeOpenAI, *, buttons: bool = True
) -> dict[str, Any]:
    cfg = dingtalk_config(tmp_path, dingtalk, model)
    if buttons:
        cfg["channels"]["dingtalk"]["button_template_id"] = BUTTON_TEMPLATE
    cfg["agent"].update({"memory": {"enabled": False}, "approvals": {"tools": ["execute"], "timeout": 600}})
    return cfg


@pytest.fixture
async def daemon(tmp_path: Path, dingtalk: FakeDingTalk, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, _config(tmp_path, dingtalk, model)) as d:
        await d.wait_channel_state("dingtalk", "connected")
        await dingtalk.wait_for(lambda: dingtalk.ws is not None, what="the stream connection")
        yield d


async def _card(dingtalk: FakeDingTalk, needle: str) -> tuple[str, Card]:
    """The buttons card whose text shows ``needle``: its outTrackId and what it shows."""
    return await dingtalk.wait_for(
        lambda: next(((k, c) for k, c in dingtalk.cards.items() if c.buttons and needle in c.text), None),
        timeout=30,
        what=f"a buttons card showing {needle!r}",
    )


def _ran(model: FakeOpenAI) -> bool:
    """Whether the model was given the command's output (the tool ran)."""
    return any("approved-run" in str(m.get("content")) for r in model.requests for m in r["messages"]
               if m.get("role") == "tool")  # fmt: skip


async def test_an_approval_is_buttons_and_only_the_requesters_press_runs_it(
    daemon: DaemonProcess, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[RUN]), Reply(text="Done running."))
    await dingtalk.inject_text(GROUP, OWNER, "run the check", group=True)
    out, card = await _card(dingtalk, "Approval needed")
    assert card.chat_id == GROUP
    assert card.buttons[0]["text"].endswith("Approve") and len(card.buttons) >= 2
    values = [b["value"] for b in card.buttons]
    assert all(v.startswith("appr:") for v in values)

    refused = await dingtalk.press(out, FRIEND, 0)  # another member presses Approve
    await dingtalk.wait_for(lambda: dingtalk.acked(refused), what="the ack of the refused press")
    note = await answered(dingtalk, FRIEND, "Not yours")  # told privately, in their 1:1 chat
    assert note.key == "sampleMarkdown"
    assert not any("Not yours" in m.text for m in dingtalk.messages_to(GROUP)), "not told the group"
    assert not _ran(model) and len(model.requests) == 1, "another user's press ran nothing"
    assert dingtalk.cards[out].buttons, "the buttons are still there for the requester"

    pressed = await dingtalk.press(out, OWNER, 0)
    await dingtalk.wait_for(lambda: not dingtalk.cards[out].buttons, timeout=30, what="buttons withdrawn")
    await answered(dingtalk, GROUP, "Done running.", timeout=30)
    assert _ran(model)
    shown = dingtalk.cards[out].text
    assert "Approved by" in shown and "Approval needed" in shown, shown

    await dingtalk.redeliver(pressed)  # DingTalk sends the press again (its ack was lost): once
    late = await dingtalk.press(out, OWNER, value=values[-1])  # a stale client presses Deny
    await dingtalk.wait_for(lambda: dingtalk.acked(late), what="the late press's ack")
    await answered(dingtalk, OWNER, "Already settled")
    assert len(model.requests) == 2 and "Approved by" in dingtalk.cards[out].text
    assert not any("Already settled" in m.text for m in dingtalk.messages_to(GROUP))


async def test_a_choice_is_buttons_with_inert_labels_and_a_press_answers_it(
    daemon: DaemonProcess, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[ASK]), Reply(text="Large it is."))
    await dingtalk.inject_text("", OWNER, "order a coffee")
    out, card = await _card(dingtalk, "Press a button")
    labels = [b["text"] for b in card.buttons]
    assert len(labels) == 3 and labels[0] == "Small"
    assert all(len(x) <= LABEL_CHARS for x in labels)
    joined = "".join(labels)
    assert "@" not in joined and "\u202e" not in joined and "\u200b" not in joined

    await dingtalk.press(out, OWNER, 1)
    await answered(dingtalk, OWNER, "Large it is.", timeout=30)
    user_texts = [str(m.get("content")) for m in model.requests[1]["messages"] if m.get("role") == "user"]
    assert user_texts[-1].endswith(OPTIONS[1]), user_texts[-1]
    await dingtalk.wait_for(lambda: not dingtalk.cards[out].buttons, timeout=20, what="closed")
    assert "chosen by" in dingtalk.cards[out].text


async def test_a_press_in_another_conversation_is_refused(
    daemon: DaemonProcess, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    """The card was asked in the group; a callback naming another group (a card that travelled)
    answers nothing, even from the person asked."""
    model.script(Reply(tool_calls=[ASK]), Reply(text="Large it is."))
    await dingtalk.inject_text(GROUP, OWNER, "order a coffee", group=True)
    out, _ = await _card(dingtalk, "Press a button")
    mid = await dingtalk.press(out, OWNER, 1, space=("IM_GROUP", "cidSomeOtherGroup0002=="))
    await dingtalk.wait_for(lambda: dingtalk.acked(mid), what="the ack")
    await answered(dingtalk, OWNER, "no longer exists")
    assert len(model.requests) == 1 and dingtalk.cards[out].buttons


MALFORMED: list[dict[str, Any]] = [
    {"userId": None},  # no presser
    {"userId": "x" * 5000},  # an oversized id
    {"content": "{not json"},
    {"content": json.dumps({"cardPrivateData": {"params": {"value": ["appr", "approve"]}}})},
    {"content": json.dumps({"cardPrivateData": None})},
    {"spaceType": "IM_SPACE_UNKNOWN"},
    {"spaceType": "IM_GROUP", "spaceId": None},
    {"outTrackId": "someone-elses-card"},
    {"extension": 42},
]


async def test_malformed_and_forged_presses_are_counted_acked_and_never_stop_the_channel(
    daemon: DaemonProcess, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    model.script(Reply(tool_calls=[RUN]), Reply(text="Done running."))
    await dingtalk.inject_text("", OWNER, "run the check")
    out, _ = await _card(dingtalk, "Approval needed")
    mids = [await dingtalk.press(out, OWNER, 0, **bad) for bad in MALFORMED]
    mids.append(await dingtalk.inject("not json at all", topic="/v1.0/card/instances/callback"))
    mids.append(await dingtalk.inject([1, 2], topic="/v1.0/card/instances/callback"))
    forged = await dingtalk.press(out, STRANGER, 0, value="appr:approve:ZZZZ9999")  # no such request
    mids.append(forged)
    await dingtalk.wait_for(lambda: all(dingtalk.acked(m) for m in mids), timeout=30, what="every ack")
    assert not _ran(model) and dingtalk.cards[out].buttons, "nothing was approved"
    metrics = await daemon.metrics()
    found = re.search(r'chital_malformed_events_total\{kind="action",platform="dingtalk"\} (\d+)', metrics) or \
        re.search(r'chital_malformed_events_total\{platform="dingtalk",kind="action"\} (\d+)', metrics)  # fmt: skip
    assert found is not None and int(found.group(1)) >= len(MALFORMED) + 1, metrics
    await answered(dingtalk, OWNER, "couldn't read that button press")
    assert len([m for m in dingtalk.messages_to(OWNER) if "couldn't read" in m.text]) <= 3, "rate limited"
    logs = daemon.logs()
    assert "x" * 300 not in logs and "not json at all" not in logs
    # A flood of unreadable presses is counted in full but logged a few lines a minute.
    flood = [await dingtalk.press(out, OWNER, 0, userId=None) for _ in range(40)]
    await dingtalk.wait_for(
        lambda: all(dingtalk.acked(m) for m in flood), timeout=30, what="the flood's acks"
    )
    lines = [line for line in daemon.logs().splitlines() if "unreadable card callback" in line]
    assert 0 < len(lines) <= 5, lines

    await dingtalk.press(out, OWNER, 0)  # the channel still takes the real press
    await answered(dingtalk, OWNER, "Done running.", timeout=30)
    assert _ran(model)


async def test_without_a_button_template_an_approval_is_answered_in_words(
    tmp_path: Path, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    async with started_daemon(tmp_path, _config(tmp_path, dingtalk, model, buttons=False)) as d:
        await d.wait_channel_state("dingtalk", "connected")
        await dingtalk.wait_for(lambda: dingtalk.ws is not None, what="the stream connection")
        assert "/v1.0/card/instances/callback" not in dingtalk.subscribed
        model.script(Reply(tool_calls=[RUN]), Reply(text="Left it alone."))
        await dingtalk.inject_text("", OWNER, "run the check")
        prompt = await answered(dingtalk, OWNER, "Approval needed", timeout=30)
        code = re.search(r"`deny ([A-Za-z0-9]+)`", prompt.text)
        assert code is not None and "Or reply" not in prompt.text, prompt.text
        await dingtalk.inject_text("", OWNER, f"deny {code.group(1)}")
        await answered(dingtalk, OWNER, "Left it alone.", timeout=30)
        assert not dingtalk.cards and not _ran(model)


def test_a_label_is_one_bounded_line_without_hidden_characters_or_mentions() -> None:
    assert label("a\u202eb\u200bc\u2066d\ne") == "a b c d e"
    assert label("@all @everyone") == "＠all ＠everyone"
    assert len(label("x" * 500)) == LABEL_CHARS and label("x" * 500).endswith("…")
    assert label("\u200b\u202e") == "…"
