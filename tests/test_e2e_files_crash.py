"""Files go through delivery like text: recorded before they are sent, sent once, even across kill -9.

Through `chital run`, a real bubblewrap sandbox and the fake Telegram: the answer's text goes out,
the file upload fails (sendDocument answers 502), the daemon is killed; after the restart the file
is delivered exactly once and the text is neither lost nor doubled.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest

from tests.daemon import DaemonProcess
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, answered, replies_to

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


async def test_kill9_between_text_and_file_delivers_the_file_once(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.script(
        Reply(tool_calls=[ToolCall("execute", {"command": "echo 42 > /mnt/user-data/outputs/r.txt"})]),
        Reply(tool_calls=[ToolCall("present_files", {"paths": ["r.txt"], "caption": "the result"})]),
        Reply(text="Here is r.txt."),
    )
    tg.down_methods.add("sendDocument")
    up = tg.inject_message(OWNER, OWNER, "compute it")
    await answered(tg, OWNER, up, "Here is r.txt.", timeout=40)
    await tg.wait_for(lambda: tg.calls_to("sendDocument"), timeout=15, what="an upload attempt")
    telegram_daemon.kill9()
    await telegram_daemon.wait_exit()
    tg.down_methods.clear()
    await telegram_daemon.start()
    docs = await tg.wait_for(
        lambda: [m for m in tg.bot_messages(OWNER) if m.document], timeout=30, what="the file after restart"
    )
    mid = up["message"]["message_id"]
    await asyncio.sleep(3)  # anything doubled would show by now
    assert len(docs) == 1 and tg.file_bytes(docs[0].document["file_id"]) == b"42\n"
    assert docs[0].text == "the result"
    texts = [m for m in replies_to(tg, OWNER, mid) if not m.document]
    assert [m.text for m in texts] == ["Here is r.txt."]
