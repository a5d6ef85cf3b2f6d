"""Coding agents over ACP (agent/acp/): the official SDK's client against our fake ACP agent
(tests/fakes/acp_agent.py), started for real inside a bubblewrap sandbox.

Each test asserts what the model would be told (the delegation's result or its error), what lands
in the workspace on the host, what the chat's progress lines say, and that no process of the
session survives it (a scan of /proc for the session's unique marker, with a bounded deadline).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.acp.session import DelegationError, delegate
from agent.acp.settings import AcpAgent
from agent.config import AgentSettings
from agent.safety import Redactor
from agent.sandbox import SandboxUnavailable
from agent.sandbox.local import LocalProvider, LocalSandbox
from tests.fakes.acp_agent import agent_entry
from tests.fakes.gateway_rig import until

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
pytestmark = [pytest.mark.bwrap, needs_bwrap]
WS = "/mnt/user-data/workspace"
KEY = "sk-coder-key-0123456789abcdef"


@pytest.fixture
async def sandbox(root: Path) -> AsyncIterator[LocalSandbox]:
    provider = LocalProvider(root / "sbx", None)
    await provider.reconcile()
    yield await provider.acquire("telegram:acp")
    await provider.close()


def procs_with(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found.append(cmd[:120])
    return found


async def gone(marker: str) -> bool:
    return bool(await until(lambda: not procs_with(marker), 15, f"no process with {marker} left"))


class Chat:
    """The person on the other side: answers permission requests, collects progress lines."""

    def __init__(self, approve: bool = True) -> None:
        self.approve = approve
        self.asked: list[tuple[str, str]] = []
        self.lines: list[str] = []

    async def ask(self, title: str, detail: str) -> bool:
        self.asked.append((title, detail))
        return self.approve

    def progress(self, line: str) -> None:
        self.lines.append(line)


def entry(script: dict[str, Any], marker: str, **extra: Any) -> AcpAgent:
    return AcpAgent.model_validate(agent_entry(script, marker, **{"init_timeout": 10, **extra}))


async def run(
    sandbox: LocalSandbox, script: dict[str, Any], chat: Chat | None = None, mask: Any = None, **extra: Any
) -> Any:
    marker = f"acp-{uuid.uuid4().hex[:10]}"
    chat = chat or Chat()
    settings = entry(script, marker, **extra)
    try:
        return await delegate(
            sandbox, "coder", settings, "make hello.py", ask=chat.ask, progress=chat.progress,
            mask=mask or (lambda text: text),
        )  # fmt: skip
    finally:
        assert await gone(marker), "a process of the session outlived it"


async def test_a_delegation_streams_asks_writes_and_answers(sandbox: LocalSandbox) -> None:
    chat = Chat(approve=True)
    script = {
        "steps": [
            {"plan": ["write hello.py", "run it"]},  # the first update shows at once; later ones fold
            {"cwd": True},
            {"tool": "Write hello.py"},
            {"ask": "Write hello.py"},
            {"write": f"{WS}/src/hello.py", "content": "print('hi')\n", "if_allowed": True},
            {"read": f"{WS}/src/hello.py"},
            {"env": ["CODER_API_KEY", "OPENAI_API_KEY"]},
            {"say": "Done: hello.py prints hi."},
        ]
    }
    os.environ["OPENAI_API_KEY_TEST_ACP"] = "sk-daemon-secret-should-not-leak"
    try:
        result = await run(sandbox, script, chat, env={"CODER_API_KEY": KEY})
    finally:
        del os.environ["OPENAI_API_KEY_TEST_ACP"]
    # The file landed in the thread's workspace on the host, through our confined fs methods.
    assert (sandbox.dirs.workspace / "src" / "hello.py").read_text() == "print('hi')\n"
    assert result.written == (f"{WS}/src/hello.py",) and result.stop_reason == "end_turn"
    assert f"[cwd {WS}]" in result.answer  # the workspace is its working directory
    assert "[permission granted]" in result.answer and result.permissions == (("Write hello.py", True),)
    assert chat.asked[0][0] == "Write hello.py" and "kind: edit" in chat.asked[0][1]
    assert "[read: print('hi')" in result.answer
    # Its own key reaches it; nothing of the daemon's environment does.
    assert f'"CODER_API_KEY": "{KEY}"' in result.answer and '"OPENAI_API_KEY": ""' in result.answer
    assert "OPENAI_API_KEY_TEST_ACP" not in result.answer and "sk-daemon-secret" not in result.answer
    # Progress: bounded lines, the agent's words inside code spans.
    assert any("📋 plan: 0/2" in line for line in chat.lines)
    assert any("asks: `Write hello.py`" in line for line in chat.lines)
    assert all(len(line) < 400 for line in chat.lines)
    # The sandbox's other commands never see the agent's key.
    res = await sandbox.exec("env")
    assert KEY not in res.output and "CODER_API_KEY" not in res.output


async def test_secrets_are_masked_before_anything_is_cut(sandbox: LocalSandbox) -> None:
    """A key cut in half by a length limit would not be recognised: masked first, cut after."""
    chat = Chat()
    long = "x" * 490 + KEY + "y" * 150  # the key straddles both the 500-char result cut and the progress tail
    script = {"steps": [{"tool": "t" * 70 + KEY}, {"say": long}, {"ask": "a" * 190 + KEY}]}
    result = await run(sandbox, script, chat, mask=Redactor([KEY]), max_result_chars=500)
    shown = " ".join([*chat.lines, result.answer, *(t + d for t, d in chat.asked)])
    for part in (KEY[:8], KEY[-8:], KEY[10:18]):
        assert part not in shown
    assert "more characters cut" in result.answer


async def test_a_refused_permission_is_returned_to_the_agent(sandbox: LocalSandbox) -> None:
    script = {"steps": [{"ask": "Delete everything"}, {"write": f"{WS}/gone.txt", "if_allowed": True}]}
    result = await run(sandbox, script, Chat(approve=False))
    assert "[permission refused]" in result.answer and "[not written]" in result.answer
    assert not (sandbox.dirs.workspace / "gone.txt").exists() and result.written == ()


class SlowChat(Chat):
    """A person who takes a moment to answer, and a count of prompts shown at the same time."""

    def __init__(self) -> None:
        super().__init__(approve=False)
        self.open = self.most_open = 0

    async def ask(self, title: str, detail: str) -> bool:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await asyncio.sleep(0.2)  # every other request of the flood has arrived by now
            return await super().ask(title, detail)
        finally:
            self.open -= 1


@pytest.mark.parametrize("asks", [3, 40])
async def test_a_flood_of_permission_requests_posts_one_prompt_at_a_time(
    sandbox: LocalSandbox, asks: int
) -> None:
    """Requests the agent sends all at once are asked one after another (one set of buttons in
    the chat at a time), and past ``max_permission_requests`` the session ends as flooding: an
    agent cannot bury the chat under approval prompts."""
    chat = SlowChat()
    script = {"steps": [{"asks": asks}, {"say": "after"}]}
    if asks <= 5:
        result = await run(sandbox, script, chat, max_permission_requests=5)
        assert "[asks answered]" in result.answer and len(chat.asked) == asks
    else:
        with pytest.raises(DelegationError, match="more than 5 permission requests"):
            await run(sandbox, script, chat, max_permission_requests=5)
        assert len(chat.asked) <= 5
    assert chat.most_open == 1


async def test_reads_the_agent_never_collects_do_not_pile_up_in_memory(sandbox: LocalSandbox) -> None:
    """Forty reads of a 1 MB file sent at once by an agent that never reads its stdin: we serve
    one at a time, only once the previous answers were taken, so memory holds a few copies (not
    forty) until the timeout ends the session."""
    (sandbox.dirs.workspace / "big.txt").write_text("x" * 1_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(DelegationError, match="did not finish within"):
            await run(sandbox, {"steps": [{"reads": 40, "path": f"{WS}/big.txt"}]}, timeout=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16_000_000, f"{peak} bytes at the peak"


@pytest.mark.parametrize(
    "path",
    [f"{WS}/../../../etc/acp-escape", "/etc/acp-escape", "/mnt/user-data/outputs/x", "relative.txt", f"{WS}"],
)
async def test_writes_outside_the_workspace_end_the_session(sandbox: LocalSandbox, path: str) -> None:
    script = {"steps": [{"write": path, "content": "pwned"}, {"say": "should not get here"}]}
    with pytest.raises(DelegationError, match="tried to write .*the session was ended"):
        await run(sandbox, script)
    assert not Path("/etc/acp-escape").exists()
    assert not (sandbox.dirs.outputs / "x").exists()


@pytest.mark.parametrize("verb", ["read", "write"])
async def test_a_planted_symlink_to_a_host_file_is_refused(
    sandbox: LocalSandbox, root: Path, verb: str
) -> None:
    host = root / "host-secret.txt"
    host.write_text("host secret\n")
    step: dict[str, Any] = {verb: f"{WS}/link/secret.txt"}
    if verb == "write":
        step["content"] = "overwritten"
    # A dir link (the agent can plant one inside its sandbox) to a host dir, then a file through it.
    script = {"steps": [{"symlink": [str(root), f"{WS}/link"]}, step]}
    with pytest.raises(DelegationError, match=f"tried to {verb} .*link"):
        await run(sandbox, script)
    assert host.read_text() == "host secret\n"


async def test_an_agent_that_never_answers_initialize(sandbox: LocalSandbox) -> None:
    with pytest.raises(DelegationError, match="did not answer initialize within 2 s"):
        await run(sandbox, {"init": "silent"}, init_timeout=2)


async def test_a_malformed_answer_is_a_specific_error(sandbox: LocalSandbox) -> None:
    with pytest.raises(DelegationError, match="answered initialize with something that is not ACP"):
        await run(sandbox, {"init": "malformed"})


async def test_an_agent_that_floods_updates_is_stopped(sandbox: LocalSandbox) -> None:
    chat = Chat()
    with pytest.raises(DelegationError, match="flooded the session with more than 50 updates"):
        await run(sandbox, {"steps": [{"flood": 100_000}]}, chat, max_updates=50)
    assert len(chat.lines) < 10  # rate-limited: a flood is not a flood of chat edits


async def test_a_flood_of_garbage_lines_is_stopped(sandbox: LocalSandbox) -> None:
    with pytest.raises(DelegationError, match="flooded the session with more than 1100 messages"):
        await run(sandbox, {"steps": [{"garbage": 50_000}]}, max_updates=50)


async def test_the_agents_words_are_shown_inert(sandbox: LocalSandbox) -> None:
    chat = Chat()
    words = "<!everyone> @channel [click](http://evil.example) \u202egnp.exe\u200b `x`"
    await run(sandbox, {"steps": [{"tool": words}, {"say": words}]}, chat, progress_interval=0.2)
    for line in chat.lines[1:]:
        assert line.startswith("🤖 coder") and line.endswith("`") and line.count("`") == 2, line
        assert "\u202e" not in line and "\u200b" not in line and "\n" not in line


async def test_an_oversized_message_ends_the_session(sandbox: LocalSandbox) -> None:
    with pytest.raises(DelegationError, match="sent a message larger than 65536 bytes"):
        await run(sandbox, {"steps": [{"big": 200_000}]}, max_message_bytes=65_536)


async def test_a_crash_mid_session(sandbox: LocalSandbox) -> None:
    with pytest.raises(DelegationError, match=r"exited during session/prompt \(exit status 3\)"):
        await run(sandbox, {"steps": [{"say": "working"}, {"crash": 3}]})
    with pytest.raises(DelegationError, match="exited during initialize"):
        await run(sandbox, {"init": "crash"})


async def test_a_timeout_kills_the_agent_and_its_children(sandbox: LocalSandbox) -> None:
    marker = f"child-{uuid.uuid4().hex[:8]}"
    with pytest.raises(DelegationError, match="did not finish within 3 s .*killed"):
        await run(sandbox, {"steps": [{"hang": "forever", "marker": marker}]}, timeout=3)
    assert await gone(marker)


async def test_a_timeout_sends_session_cancel_first(sandbox: LocalSandbox) -> None:
    note = f"{WS}/cancelled.txt"
    with pytest.raises(DelegationError, match="did not finish within 3 s"):
        await run(sandbox, {"steps": [{"hang": True, "note": note}]}, timeout=3)
    assert (sandbox.dirs.workspace / "cancelled.txt").read_text() == "session/cancel received"


async def test_cancel_sends_session_cancel_then_kills(sandbox: LocalSandbox) -> None:
    marker = f"child-{uuid.uuid4().hex[:8]}"
    chat = Chat()
    task = asyncio.ensure_future(
        run(
            sandbox,
            {"steps": [{"say": "busy"}, {"hang": True, "marker": marker, "note": f"{WS}/stopped.txt"}]},
            chat,
        )
    )
    await until(lambda: procs_with(marker), 30, "the agent's child process")
    task.cancel()  # what /stop does to the turn
    with pytest.raises(asyncio.CancelledError):
        await task
    assert procs_with(marker) == []  # gone by the time the cancelled call returns
    assert (sandbox.dirs.workspace / "stopped.txt").read_text() == "session/cancel received"


def test_settings_refuse_bad_names_and_reserved_env() -> None:
    with pytest.raises(ValidationError, match="must be letters"):
        AgentSettings.model_validate({"acp_agents": {"bad name!": {"command": "x"}}})
    with pytest.raises(ValidationError, match="PATH, HOME and LANG"):
        AcpAgent.model_validate({"command": "x", "env": {"PATH": "/tmp"}})
    agent = AcpAgent.model_validate({"command": "x", "env": {"K": KEY}})
    assert KEY not in repr(agent) and agent.secrets() == [KEY]


async def test_the_agent_sees_no_host_files_and_no_network_unless_opted_in(
    sandbox: LocalSandbox, root: Path
) -> None:
    host = root / "host-only.txt"
    host.write_text("host only\n")
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        steps = [{"open": str(host)}, {"connect": ["127.0.0.1", port]}]
        closed = await run(sandbox, {"steps": steps})
        assert "[open error 2]" in closed.answer and "host only" not in closed.answer
        assert "[connected]" not in closed.answer and "[connect error" in closed.answer
        opened = await run(sandbox, {"steps": [{"connect": ["127.0.0.1", port]}]}, network=True)
        assert "[connected]" in opened.answer  # the per-agent opt-in shares the host's network
    finally:
        server.close()
        await server.wait_closed()


async def test_no_coding_agent_without_bubblewrap(root: Path) -> None:
    provider = LocalProvider(root / "plain", None, bwrap=None, allow_unsandboxed=True)
    sandbox = await provider.acquire("telegram:plain")
    with pytest.raises(SandboxUnavailable, match="coding agents need bubblewrap"):
        await run(sandbox, {"steps": []})
    await provider.close()
