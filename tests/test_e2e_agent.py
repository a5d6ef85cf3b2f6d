"""End to end through `chital run` and Telegram: the harness's tools as a user meets them.

The fake model is scripted to call real tools (the sandbox's `execute`, `present_files`); the
sandbox is the real bubblewrap one; memory extraction is a real background model call.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from agent.memory import EXTRACTION_MARKER
from tests.daemon import DaemonProcess
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, answered, replies_to


def system_text(body: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "system")


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_uploaded_file_is_read_and_a_produced_file_delivered(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(
        Reply(
            tool_calls=[
                ToolCall(
                    "execute",
                    {
                        "command": "wc -l < /mnt/user-data/uploads/sales.csv > /mnt/user-data/outputs/rows.txt"
                        " && cat /mnt/user-data/outputs/rows.txt"
                    },
                )
            ]
        ),
        Reply(tool_calls=[ToolCall("present_files", {"paths": ["/mnt/user-data/outputs/rows.txt"]})]),
        Reply(text="Your file has 3 lines; I sent you rows.txt."),
    )
    doc = tg.add_file(b"region,amount\nnorth,10\nsouth,20\n", file_name="sales.csv", mime_type="text/csv")
    up = tg.inject_message(OWNER, OWNER, "count the rows please", document=doc)
    await answered(tg, OWNER, up, "Your file has 3 lines", timeout=30)
    # The agent was told where the upload is, and its shell saw the real file.
    first = model.requests[0]
    assert "/mnt/user-data/uploads/sales.csv" in last_user_text(first)
    tool_result = [m for m in model.requests[1]["messages"] if m.get("role") == "tool"]
    assert tool_result and "3" in str(tool_result[-1]["content"])
    # The produced file came back to the chat as a document.
    await tg.wait_for(lambda: [m for m in tg.bot_messages(OWNER) if m.document], timeout=10, what="document")
    sent = [m for m in tg.bot_messages(OWNER) if m.document][-1]
    assert sent.document is not None and sent.document.get("file_name") == "rows.txt"
    assert tg.file_bytes(sent.document["file_id"]).strip() == b"3"


async def test_memory_learned_used_in_new_conversation_and_forgotten(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    plan = {"add": ["The user's name is Bob and he loves Rust."], "update": [], "delete": []}
    model.add_rule(lambda t: EXTRACTION_MARKER in t, Reply(text=json.dumps(plan)))
    await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "I am Bob and I love Rust"), "echo: I am Bob")
    await tg.wait_for(
        lambda: any(EXTRACTION_MARKER in last_user_text(r) for r in model.requests) or None,
        timeout=15,
        what="memory extraction",
    )
    await answered(tg, OWNER, tg.inject_command(OWNER, OWNER, "new", chat_type="private", at=None), "fresh")

    async def ask(text: str) -> dict[str, Any]:
        up = tg.inject_message(OWNER, OWNER, text)
        await answered(tg, OWNER, up, f"echo: {text}")
        return next(r for r in reversed(model.requests) if last_user_text(r) == text)

    body = await ask("what language do I like?")
    assert "loves Rust" in json.dumps(body["messages"]), "the fact reached the new conversation"
    shown = await answered(
        tg, OWNER, tg.inject_command(OWNER, OWNER, "memory", chat_type="private", at=None), "What I remember"
    )
    assert "loves Rust" in shown.text
    await answered(
        tg, OWNER, tg.inject_command(OWNER, OWNER, "forget", chat_type="private", at=None), "erased 1"
    )
    body = await ask("and now?")
    assert "loves Rust" not in json.dumps(body["messages"])
    assert replies_to(tg, OWNER, 0) == []
