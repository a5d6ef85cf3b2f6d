"""What the sandbox controls cannot size the daemon's memory or time (docs/sandbox.md, "Bounded reads").

End to end: `chital run` with the Telegram SDK against its fake; the fake model has the agent plant
hostile files with ``execute`` (a sparse 1 GB file whose first line never ends, a FIFO) and then
read them with the file tools. What is checked is what the model received as tool results.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.sandbox import bounded
from agent.sandbox.files import HostFiles
from agent.sandbox.paths import PathMapper, ThreadDirs
from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.telegram_server import FakeTelegram

USER = 3003
WS = "/mnt/user-data/workspace"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture
async def daemon(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> AsyncIterator[DaemonProcess]:
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[f"telegram:{USER}"])
    async with started_daemon(tmp_path, cfg) as d:
        yield d


def tool_results(model: FakeOpenAI) -> dict[str, str]:
    """The content of each tool result in the last model request, by tool call id."""
    last = model.requests[-1]["messages"]
    return {m["tool_call_id"]: str(m["content"]) for m in last if m.get("role") == "tool"}


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM), in kB."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    assert match
    return int(match.group(1))


@pytest.mark.bwrap
@needs_bwrap
async def test_hostile_files_reach_the_model_capped_and_marked(
    daemon: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    plant = (
        f"cd {WS} && head -c 20000 /dev/zero | tr '\\0' 'a' > big.txt && truncate -s 1G big.txt"
        " && mkfifo pipe && printf 'one\\ntwo\\n' > small.txt && echo planted"
    )
    model.script(
        Reply(tool_calls=[ToolCall("execute", {"command": plant}, id="c_plant")]),
        Reply(
            tool_calls=[
                ToolCall("read_file", {"file_path": f"{WS}/big.txt"}, id="c_big"),
                ToolCall("read_file", {"file_path": f"{WS}/pipe"}, id="c_pipe"),
                ToolCall("read_file", {"file_path": f"{WS}/small.txt"}, id="c_small"),
                ToolCall(
                    "edit_file",
                    {"file_path": f"{WS}/big.txt", "old_string": "aaa", "new_string": "b"},
                    id="c_edit",
                ),
                ToolCall("grep", {"pattern": "aaa", "path": WS}, id="c_grep"),
            ]
        ),
        Reply(text="read them all"),
    )
    up = tg.inject_message(USER, USER, "look at the files")
    mid = up["message"]["message_id"]
    await tg.wait_for(
        lambda: any(m.reply_to == mid and "read them all" in m.text for m in tg.bot_messages(USER)),
        timeout=90,
        what="the answer",
    )
    results = tool_results(model)
    assert "planted" in results["c_plant"], results["c_plant"]

    big = results["c_big"]
    assert len(big) < 20_000, f"the model got {len(big)} characters of one line"
    assert "line cut" in big and "a" * 1000 in big, big[-300:]
    assert "not a regular file" in results["c_pipe"], results["c_pipe"]
    assert "one" in results["c_small"] and "two" in results["c_small"]
    assert "too large for edit_file" in results["c_edit"], results["c_edit"]
    assert "big.txt" not in results["c_grep"], "a 1 GB file is not grepped in the daemon"

    assert daemon.proc is not None
    assert peak_rss_kb(daemon.proc.pid) < 900_000, "a loose bound: far below the 1 GB the file holds"


# -- in process: the budgets themselves ------------------------------------------------------------


@pytest.fixture
def host_files(tmp_path: Path) -> HostFiles:
    dirs = ThreadDirs.for_thread(tmp_path / "sbx", "t1", None)
    dirs.ensure(None)
    return HostFiles(PathMapper(dirs))


def test_a_window_stops_at_its_byte_budget_and_says_where_to_go_on(host_files: HostFiles) -> None:
    host = host_files.mapper.resolve(f"{WS}/many.txt").host
    line = "x" * 1000 + "\n"
    Path(host).write_text(line * 2000)
    window = host_files.read_text(f"{WS}/many.txt", 0, 2000)
    assert window.end_line < 2000 and len(window.text) <= bounded.MAX_WINDOW_BYTES + len(line)
    assert window.total_lines == 2000


def test_an_offset_beyond_the_scan_budget_is_refused_with_advice(
    host_files: HostFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bounded, "MAX_SCAN_BYTES", 64 * 1024)
    host = host_files.mapper.resolve(f"{WS}/log.txt").host
    Path(host).write_text("entry\n" * 100_000)
    with pytest.raises(Exception, match="lies beyond the first .* use execute"):
        host_files.read_text(f"{WS}/log.txt", 90_000, 10)
    window = host_files.read_text(f"{WS}/log.txt", 0, 5)
    assert window.text == "entry\n" * 5 and window.total_lines is None  # not counted to the end


def test_a_huge_directory_is_listed_in_part(host_files: HostFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "MAX_LS_ENTRIES", 50)
    host = Path(host_files.mapper.resolve(f"{WS}").host)
    for i in range(80):
        (host / f"f{i}").write_text("")
    entries = host_files.ls(WS)
    assert len(entries) == 51 and any("listing cut at 50 entries" in e.path for e in entries)


def test_device_nodes_and_sockets_are_refused(host_files: HostFiles) -> None:
    import socket

    host = Path(host_files.mapper.resolve(WS).host)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(host / "sock"))
    os.mkfifo(host / "fifo")
    try:
        for name in ("sock", "fifo"):
            with pytest.raises(Exception, match="not a regular file|No such device"):
                host_files.read_bytes(f"{WS}/{name}")
            with pytest.raises(Exception, match="not a regular file|No such device"):
                host_files.read_text(f"{WS}/{name}")
            with pytest.raises(Exception, match="not a regular file|No such device"):
                host_files.write(f"{WS}/{name}", "x")
    finally:
        sock.close()


def test_any_tool_result_is_capped_before_it_joins_the_history() -> None:
    """An MCP server or a skill's tool answering 50 MB: the model gets the cap and a note."""
    from langchain_core.messages import ToolMessage

    from agent.tool_output import MAX_BLOB_CHARS, MAX_TEXT_CHARS, capped

    huge = ToolMessage(content="z" * (50 * 1024 * 1024), tool_call_id="c1", name="mcp_dump")
    out = capped(huge)
    assert isinstance(out.content, str) and len(out.content) < MAX_TEXT_CHARS + 500
    assert "mcp_dump output cut" in out.content and f"{50 * 1024 * 1024 - MAX_TEXT_CHARS:,}" in out.content
    blocks = ToolMessage(
        content=[
            {"type": "text", "text": "y" * (MAX_TEXT_CHARS + 10)},
            {"type": "image", "base64": "A" * (MAX_BLOB_CHARS + 4), "mime_type": "image/png"},
        ],
        tool_call_id="c2",
        name="shot",
    )
    parts = capped(blocks).content
    assert isinstance(parts, list) and "output cut" in str(parts[0]) and "too large to show" in str(parts[1])
    small = ToolMessage(content="fine", tool_call_id="c3", name="x")
    assert capped(small) is small


def test_blocks_of_any_shape_share_one_cap() -> None:
    """An image as a data URL (no ``base64`` key), a JSON block a tool invented, and many images
    each under the cap: none of them carries more than the cap into the history."""
    from langchain_core.messages import ToolMessage

    from agent.tool_output import MAX_BLOB_CHARS, capped

    data_url = "data:image/png;base64," + "A" * (MAX_BLOB_CHARS + 4)
    shapes: list[Any] = [
        [{"type": "image_url", "image_url": {"url": data_url}}],
        [{"type": "json", "json": {"rows": ["r" * 1000] * (MAX_BLOB_CHARS // 1000 + 1)}}],
        [{"type": "image", "base64": "B" * (MAX_BLOB_CHARS // 4), "mime_type": "image/png"}] * 10,
    ]
    for i, content in enumerate(shapes):
        out = capped(ToolMessage(content=content, tool_call_id=f"s{i}", name="mcp_shot"))
        kept = sum(len(str(b)) for b in out.content)
        assert kept <= MAX_BLOB_CHARS + 1000, f"shape {i}: {kept:,} characters kept"
        assert "too large to show" in str(out.content), f"shape {i}"
