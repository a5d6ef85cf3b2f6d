"""A delegation to a coding agent over ACP, end to end: the real daemon on the Telegram and Slack
fakes, the fake model calling ``delegate_to_coding_agent``, our fake ACP agent (tests/fakes/
acp_agent.py) run by the daemon inside the conversation's bubblewrap sandbox.

Asserted as the user sees it (the progress line and the approval buttons in the chat, the answer in
the same reply), as the model sees it (the tool result or error in the next model request, the
agent's key masked there), and on the host (the file in the thread's workspace, no process left).
"""

from __future__ import annotations

import asyncio
import html
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, base_config, free_port, started_daemon
from tests.fakes.acp_agent import agent_entry
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.slack_daemon import CHANNEL, FRIEND, thread_shows
from tests.telegram_daemon import OTHER, OWNER, telegram_config

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
pytestmark = [pytest.mark.bwrap, needs_bwrap]
GROUP = -100555
WS = "/mnt/user-data/workspace"
KEY = "sk-coder-key-e2e-0123456789abcdef"
TASK = "Write hello.py that prints hi"
ASK = "Write hello.py"
SCRIPT: dict[str, Any] = {
    "steps": [
        {"plan": ["write hello.py"]},
        {"ask": ASK},
        {"write": f"{WS}/hello.py", "content": "print('hi')\n", "if_allowed": True},
        {"env": ["CODER_API_KEY", "TELEGRAM_BOT_TOKEN", "SLACK_BOT_TOKEN"]},
        {"say": "Done: hello.py prints hi."},
    ]
}
DELEGATE = Reply(tool_calls=[ToolCall("delegate_to_coding_agent", {"agent": "coder", "task": TASK})])
ANSWER = "The coding agent wrote hello.py; it prints hi."


def with_agent(cfg: dict[str, Any], script: dict[str, Any], marker: str) -> dict[str, Any]:
    entry = agent_entry(script, marker, env={"CODER_API_KEY": KEY}, description="writes code")
    cfg["agent"]["acp_agents"] = {"coder": entry}
    return cfg


def procs_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def workspace_file(daemon: DaemonProcess, name: str) -> list[Path]:
    return list(daemon.sandbox_root.glob(f"threads/*/workspace/{name}"))


def tool_result(model: FakeOpenAI, index: int = 1) -> str:
    return str([m for m in model.requests[index]["messages"] if m.get("role") == "tool"][-1]["content"])


def telegram_texts(tg: FakeTelegram) -> list[str]:
    """Every text the bot put in the group, sends and edits in order (what the user watched)."""
    return [
        str(c.params.get("text", ""))
        for c in tg.calls
        if c.method in ("sendMessage", "editMessageText") and str(c.params.get("chat_id")) == str(GROUP)
    ]


async def test_telegram_delegation_from_request_to_result(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    marker = f"acp-e2e-{uuid.uuid4().hex[:8]}"
    model.script(DELEGATE, Reply(text=ANSWER))
    async with started_daemon(
        tmp_path, with_agent(telegram_config(tmp_path, tg, model), SCRIPT, marker)
    ) as daemon:
        update = tg.inject_mention(GROUP, OWNER, "use the coding agent to write hello.py", first_name="Olga")
        request = await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(GROUP) if tg.buttons(GROUP, m.message_id)), None),
            timeout=60,
            what="the coding agent's permission request",
        )
        assert tg.buttons(GROUP, request.message_id) == ["✅ Approve", "❌ Deny"]  # answered once, live
        assert "coder" in request.text and ASK in request.text and "Olga" in request.text
        assert not workspace_file(daemon, "hello.py")  # nothing written before the yes
        stranger = tg.press_button(GROUP, request.message_id, OTHER, "Approve", first_name="Mallory")
        qid = stranger["callback_query"]["id"]
        refused = await tg.wait_for(lambda: tg.answered_queries.get(qid), what="the stranger's answer")
        assert "Not yours" in refused["text"]
        tg.press_button(GROUP, request.message_id, OWNER, "Approve", first_name="Olga")
        reply = await tg.wait_for(
            lambda: next(
                (
                    m
                    for m in tg.bot_messages(GROUP)
                    if m.reply_to == update["message"]["message_id"] and ANSWER in m.text
                ),
                None,
            ),
            timeout=60,
            what="the answer",
        )
        assert reply.text.strip().endswith(ANSWER)
        assert reply.message_id < request.message_id  # the reply first, the buttons under it
        assert [p.read_text() for p in workspace_file(daemon, "hello.py")] == ["print('hi')\n"]
        assert tg.message(GROUP, request.message_id).text.endswith("✅ Approved by Olga")
        seen = telegram_texts(tg)
        assert any("🤖" in t and "coder" in t for t in seen), seen  # progress showed in the reply
        assert not [t for t in seen if KEY[-8:] in t or KEY[:12] in t]  # no piece of the agent key
        result = tool_result(model)
        assert "Coding agent coder stopped: end_turn." in result
        assert f"Files it wrote (through this client): {WS}/hello.py." in result
        assert "approved by the user" in result and "[permission granted]" in result
        assert "<coding_agent_output" in result and "Done: hello.py prints hi." in result
        # The agent saw its own key (masked before the model saw it), no chat token of the daemon.
        assert KEY not in result and '"CODER_API_KEY": ""' not in result
        assert '"TELEGRAM_BOT_TOKEN": ""' in result
        assert KEY not in daemon.logs()
        assert procs_with(marker) == []


async def test_telegram_denied_permission_and_a_crashing_agent(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    marker = f"acp-e2e-{uuid.uuid4().hex[:8]}"
    script = {
        "steps": [{"ask": ASK}, {"write": f"{WS}/hello.py", "content": "x", "if_allowed": True}, {"crash": 9}]
    }
    unknown = Reply(tool_calls=[ToolCall("delegate_to_coding_agent", {"agent": "nope", "task": TASK})])
    model.script(unknown, DELEGATE, Reply(text="The coding agent failed."))
    async with started_daemon(
        tmp_path, with_agent(telegram_config(tmp_path, tg, model), script, marker)
    ) as daemon:
        tg.inject_mention(GROUP, OWNER, "use the coding agent", first_name="Olga")
        request = await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(GROUP) if tg.buttons(GROUP, m.message_id)), None),
            timeout=60,
            what="the permission request",
        )
        tg.press_button(GROUP, request.message_id, OWNER, "Deny", first_name="Olga")
        await tg.wait_for(
            lambda: any("The coding agent failed." in t for t in tg.bot_texts(GROUP)) or None,
            timeout=60,
            what="the answer",
        )
        assert "no coding agent named 'nope'; configured: coder" in tool_result(model, 1)
        result = tool_result(model, 2)
        assert "coder exited during session/prompt (exit status 9)" in result
        assert not workspace_file(daemon, "hello.py")
        assert procs_with(marker) == []


async def test_an_agent_that_exits_during_its_permission_prompt_withdraws_the_buttons(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """The agent asks, then dies before anyone answers: the prompt's buttons go (a later press
    could approve nothing), the model hears it exited, and a press afterwards is refused."""
    marker = f"acp-e2e-{uuid.uuid4().hex[:8]}"
    script = {"steps": [{"ask_then_exit": "Run rm -rf build", "when": f"{WS}/go"}]}
    model.script(DELEGATE, Reply(text="The coding agent died."))
    async with started_daemon(
        tmp_path, with_agent(telegram_config(tmp_path, tg, model), script, marker)
    ) as daemon:
        tg.inject_mention(GROUP, OWNER, "use the coding agent", first_name="Olga")
        request = await tg.wait_for(
            lambda: next((m for m in tg.bot_messages(GROUP) if tg.buttons(GROUP, m.message_id)), None),
            timeout=60,
            what="the permission request",
        )
        workspace = next(daemon.sandbox_root.glob("threads/*/workspace"))
        (workspace / "go").write_text("")  # now the agent exits, the prompt unanswered
        await tg.wait_for(
            lambda: any("The coding agent died." in t for t in tg.bot_texts(GROUP)) or None,
            timeout=60,
            what="the answer",
        )
        assert "coder exited during session/prompt (exit status 3)" in tool_result(model)
        await tg.wait_for(
            lambda: not tg.buttons(GROUP, request.message_id) or None, timeout=30, what="buttons withdrawn"
        )
        prompt = tg.message(GROUP, request.message_id).text
        assert prompt.endswith("❌ Cancelled: the coding agent's session ended before an answer"), prompt
        assert procs_with(marker) == []


def agent_processes(marker: str) -> int:
    """The fake agents running now (the interpreter itself, not bwrap's wrapper around it)."""
    return sum(
        1
        for pid in filter(str.isdigit, os.listdir("/proc"))
        if (cmd := _cmdline(pid)).startswith(b"/usr/bin/python3\0-c") and marker.encode() in cmd
    )


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def test_one_reply_cannot_start_more_coding_agents_than_the_cap(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """Five delegations in one model reply: two agents run (each a whole process tree), the
    others are refused at once in words the model can act on."""
    marker = f"acp-e2e-{uuid.uuid4().hex[:8]}"
    script = {"steps": [{"wait_for": f"{WS}/go"}, {"say": "finished"}]}
    calls = [
        ToolCall("delegate_to_coding_agent", {"agent": "coder", "task": f"{TASK} {i}"}) for i in range(5)
    ]
    model.script(Reply(tool_calls=calls), Reply(text="Two ran."))
    async with started_daemon(
        tmp_path, with_agent(telegram_config(tmp_path, tg, model), script, marker)
    ) as daemon:
        tg.inject_mention(GROUP, OWNER, "use five coding agents", first_name="Olga")
        await tg.wait_for(lambda: agent_processes(marker) >= 2 or None, timeout=60, what="two agents running")
        workspace = next(daemon.sandbox_root.glob("threads/*/workspace"))
        (workspace / "go").write_text("")
        await tg.wait_for(
            lambda: any("Two ran." in t for t in tg.bot_texts(GROUP)) or None, timeout=90, what="the answer"
        )
        results = [str(m["content"]) for m in model.requests[1]["messages"] if m.get("role") == "tool"]
        assert len(results) == 5
        assert sum("Coding agent coder stopped: end_turn." in r for r in results) == 2, results
        refused = "2 coding agents are already running in this conversation; wait for one to finish"
        assert sum(refused in r for r in results) == 3, results
        assert procs_with(marker) == []


async def test_stop_ends_the_session_and_its_processes(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    marker = f"acp-e2e-{uuid.uuid4().hex[:8]}"
    child = f"child-{uuid.uuid4().hex[:8]}"
    script = {
        "steps": [{"say": "working on it"}, {"hang": True, "marker": child, "note": f"{WS}/stopped.txt"}]
    }
    model.script(DELEGATE, Reply(text="unused"))
    async with started_daemon(
        tmp_path, with_agent(telegram_config(tmp_path, tg, model), script, marker)
    ) as daemon:
        tg.inject_mention(GROUP, OWNER, "use the coding agent", first_name="Olga")
        await tg.wait_for(lambda: procs_with(child) or None, timeout=60, what="the agent's child process")
        tg.inject_command(GROUP, OWNER, "/stop")
        await tg.wait_for(lambda: (not procs_with(child) and not procs_with(marker)) or None, timeout=30,
                          what="every process of the session gone")  # fmt: skip
        assert [p.read_text() for p in workspace_file(daemon, "stopped.txt")] == ["session/cancel received"]
        await asyncio.sleep(0.5)
        assert len(model.requests) == 1  # the stopped turn never reached the model again


async def test_slack_delegation_with_block_kit_approval(
    tmp_path: Path, slack: FakeSlack, model: FakeOpenAI
) -> None:
    marker = f"acp-e2e-{uuid.uuid4().hex[:8]}"
    model.script(DELEGATE, Reply(text=ANSWER))
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"]["slack"] = slack.channel_settings()
    cfg["access"] = {"allow_users": [f"slack:{FRIEND}"], "group_policy": "mention"}
    async with started_daemon(tmp_path, with_agent(cfg, SCRIPT, marker), slack) as daemon:
        post = await slack.inject_mention(CHANNEL, FRIEND, "use the coding agent to write hello.py")
        request = await slack.wait_for(
            lambda: next((p for p in slack.posts if p.buttons()), None), timeout=60
        )
        section = html.unescape(request.blocks[0]["text"]["text"])
        assert request.thread_ts == post.ts and "coder" in section and ASK in section
        press = await slack.press_button(CHANNEL, request.ts, FRIEND, "Approve", name="friend")
        await slack.wait_for(lambda: slack.is_acked(press) or None, timeout=10)
        await thread_shows(slack, CHANNEL, post.ts, ANSWER, timeout=60)
        assert [p.read_text() for p in workspace_file(daemon, "hello.py")] == ["print('hi')\n"]
        watched = [t for p in slack.posts if p.thread_ts == post.ts for t in p.history]
        assert any("🤖" in t and "coder" in t for t in watched), watched
        result = tool_result(model)
        assert f"{WS}/hello.py" in result and KEY not in result and '"SLACK_BOT_TOKEN": ""' in result
        assert procs_with(marker) == []
