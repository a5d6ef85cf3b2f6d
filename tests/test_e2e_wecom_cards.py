"""End to end: WeCom template-card buttons (approvals, choices) and files out, `chital run` against
the fake long connection (tests/fakes/wecom_cards.py) and the fake model, the real agent and
sandbox. What is asserted is what WeCom users see: the card, its buttons, the card after the
decision, the refusal, the uploaded file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.daemon import started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.wecom_server import FakeWeCom, Shown
from tests.wecom_daemon import FRIEND, GROUP, OWNER, sent_to, wecom_config

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
OUT = "/mnt/user-data/outputs"


async def _card(wecom: FakeWeCom, chat: str, needle: str = "") -> Shown:
    return await wecom.wait_for(
        lambda: next((c for c in wecom.cards_in(chat) if needle in c.text and c.card.get("button_list")), None),
        timeout=30, what="a card with buttons",
    )  # fmt: skip


def _key(card: Shown, label: str) -> str:
    return next(b["key"] for b in card.card["button_list"] if label in b["text"])


async def test_approval_card_refuses_others_and_runs_on_the_askers_press(
    tmp_path: Path, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    """In a group: the approval is a card with buttons; a press by someone else is refused in the
    chat and nothing runs; the asker's press runs the tool and the card then shows the decision
    without buttons; a press replayed after the decision is refused as settled; a press of the
    card relayed from another chat is refused; a forged task id is counted as malformed."""
    report = f"{OUT}/report.txt"
    model.script(
        Reply(tool_calls=[ToolCall("write_file", {"file_path": report, "content": "all good\n"})]),
        Reply(text="Wrote the report."),
    )
    cfg = wecom_config(tmp_path, wecom, model, agent={"approvals": {"tools": ["write_file"], "timeout": 600},
                                                      "memory": {"enabled": False}})  # fmt: skip
    async with started_daemon(tmp_path, cfg, wecom) as daemon:
        await daemon.wait_channel_state("wecom", "connected")
        wecom.inject_text(OWNER, "@Chital write the report", group=GROUP)
        card = await _card(wecom, GROUP)
        labels = [b["text"] for b in card.card["button_list"]]
        assert any("Approve" in x for x in labels) and any("Deny" in x for x in labels), labels
        approve = _key(card, "Approve")

        wecom.inject_press(FRIEND, card, approve, group=GROUP)
        await sent_to(wecom, GROUP, "Not yours to answer")
        wecom.inject_press(OWNER, card, approve)  # the same card, pressed in the owner's 1:1 chat
        await sent_to(wecom, OWNER, "belongs to another chat")
        assert card.card.get("button_list"), "nobody allowed has answered yet"
        assert len(model.requests) == 1, "nothing ran"

        wecom.inject_press(OWNER, card, approve, group=GROUP)
        await sent_to(wecom, GROUP, "Wrote the report.", timeout=30)
        await wecom.wait_for(lambda: not card.card.get("button_list"), what="the card closed")
        assert card.card["card_type"] == "text_notice" and "Approved" in card.text, card.card

        wecom.inject_press(OWNER, card, approve, group=GROUP)
        await sent_to(wecom, GROUP, "Already settled")
        wecom.inject_press(OWNER, card, approve, group=GROUP, task_id="forged_task")
        await sent_to(wecom, GROUP, "couldn't read that button press")
        metrics = await daemon.metrics()
        assert 'chital_malformed_events_total{kind="action",platform="wecom"}' in metrics, metrics
        assert wecom.secret not in daemon.logs()


async def test_choice_buttons_answer_the_question(
    tmp_path: Path, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    """The model's options are card buttons, their labels bounded and their mentions broken; the
    press is the answer the model reads next."""
    options = ["Small", "Large <@boss> @all and a very long tail of words", "Medium\u202egnp.exe"]
    ask = ToolCall("ask_clarification", {"question": "Which size do you want?", "options": options})
    model.script(Reply(tool_calls=[ask]), Reply(text="Large it is."))
    cfg = wecom_config(tmp_path, wecom, model, agent={"memory": {"enabled": False}})
    async with started_daemon(tmp_path, cfg, wecom):
        wecom.inject_text(OWNER, "order a coffee")
        card = await _card(wecom, OWNER)
        labels = [b["text"] for b in card.card["button_list"]]
        assert len(labels) == 3 and all(len(x) <= 16 for x in labels), labels
        assert not any("<@" in x or "\u202e" in x for x in labels), labels
        wecom.inject_press(OWNER, card, card.card["button_list"][1]["key"])
        await sent_to(wecom, OWNER, "Large it is.", timeout=30)
        await wecom.wait_for(lambda: not card.card.get("button_list"), what="the card closed")
        assert "Large" in card.text, card.text
        assert any("Large" in str(m) for m in model.requests[-1]["messages"])


async def test_file_out_is_uploaded_in_chunks_and_sent(
    tmp_path: Path, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    """A file the agent makes arrives as an uploaded file; an upload WeCom refuses midway is told
    to the user, not shown as sent."""
    big = f"{OUT}/big.txt"
    content = "line of text\n" * 50_000  # 650 kB: two chunks
    model.script(
        Reply(tool_calls=[ToolCall("write_file", {"file_path": big, "content": content})]),
        Reply(tool_calls=[ToolCall("present_files", {"paths": [big], "caption": "the data"})]),
        Reply(text="Here it is."),
    )
    cfg = wecom_config(tmp_path, wecom, model, agent={"memory": {"enabled": False}})
    async with started_daemon(tmp_path, cfg, wecom):
        wecom.inject_text(OWNER, "make the data")
        sent = await wecom.wait_for(
            lambda: next((m for m in wecom.bot_messages(OWNER) if m.kind == "file"), None),
            timeout=40,
            what="file",
        )
        assert sent.content == "big.txt" and sent.media == content.encode()
        chunks = [f for f in wecom.received if f.get("cmd") == "aibot_upload_media_chunk"]
        assert [c["body"]["chunk_index"] for c in chunks] == [0, 1]


async def test_upload_refused_midway_is_told_to_the_user(
    tmp_path: Path, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    """WeCom refuses a chunk: no file is shown as sent, the answer stays, and a note under it names
    the file and WeCom's refusal (which chunk, the errcode), as one code span; the log has it too."""
    data = f"{OUT}/data.txt"
    model.script(
        Reply(tool_calls=[ToolCall("write_file", {"file_path": data, "content": "row\n" * 200_000})]),
        Reply(tool_calls=[ToolCall("present_files", {"paths": [data]})]),
        Reply(text="Here it is."),
    )
    wecom.fail_upload = ("aibot_upload_media_chunk", 40008)
    cfg = wecom_config(tmp_path, wecom, model, agent={"memory": {"enabled": False}})
    async with started_daemon(tmp_path, cfg, wecom) as daemon:
        wecom.inject_text(OWNER, "make the data")
        await sent_to(wecom, OWNER, "Here it is.", timeout=40)
        note = await sent_to(wecom, OWNER, "I could not send `data.txt`: `WeCom refused", timeout=30)
        assert "chunk 1 of 2" in note.text and "40008" in note.text, note.text
        assert not [m for m in wecom.bot_messages(OWNER) if m.kind == "file"], "nothing shown as sent"
        assert wecom.fail_upload is None, "the upload reached the refused chunk"
        await wecom.wait_for(
            lambda: "WeCom refused the upload of data.txt (chunk 1 of 2" in daemon.logs(), what="log"
        )
