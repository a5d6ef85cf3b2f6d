"""``chital chat`` as a person meets it: a real subprocess on a pseudo-terminal (pexpect), talking to
the fake OpenAI server through langchain-openai. Every assertion is on what the terminal shows (and
on the log file the banner names)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest
import yaml

from agent.memory import EXTRACTION_MARKER
from tests.daemon import REPO, base_config, chat_env, free_port
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text

PROMPT = "you> "
KEY = "sk-test-key-never-logged"


class Terminal:
    """One ``chital chat`` on a pseudo-terminal; ``shown`` is everything it printed so far."""

    def __init__(self, tmp_path: Path, base_url: str, **agent: Any) -> None:
        cfg = base_config(tmp_path / "data", base_url, free_port())
        cfg["agent"].update(agent)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.data = tmp_path / "data"
        self._out = io.StringIO()
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "gateway.cli.main", "chat", "-c", str(path)],
            cwd=str(REPO),
            env=chat_env(),
            encoding="utf-8",
            codec_errors="replace",
            timeout=60,
            dimensions=(40, 200),
        )
        self.child.logfile_read = self._out
        self.child.expect_exact(PROMPT)

    @property
    def shown(self) -> str:
        return self._out.getvalue()

    def ask(self, text: str, timeout: float = 60) -> str:
        """Type a line; return what was printed until the next prompt (the echoed line excluded)."""
        self.child.sendline(text)
        self.child.expect_exact(PROMPT, timeout=timeout)
        before: str = self.child.before
        return before.replace("\r\n", "\n").split("\n", 1)[-1]

    def wait_exit(self, timeout: float = 30) -> int:
        self.child.expect(pexpect.EOF, timeout=timeout)
        self.child.close()
        assert self.child.signalstatus is None, f"killed by signal {self.child.signalstatus}"
        return int(self.child.exitstatus)

    def log(self) -> str:
        path = self.data / "chat.log"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        if self.child.isalive():
            self.child.kill(signal.SIGKILL)
        self.child.close(force=True)

    def assert_clean(self) -> None:
        """No traceback on the terminal nor in the log, no key anywhere."""
        for where, text in (("terminal", self.shown), ("log", self.log())):
            assert "Traceback" not in text, f"{where}:\n{text}"
            assert KEY not in text, f"{where} shows the API key"


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    made: list[Terminal] = []
    yield made
    for t in made:
        t.close()


def open_chat(terminals: list[Terminal], tmp_path: Path, base_url: str, **agent: Any) -> Terminal:
    t = Terminal(tmp_path, base_url, **agent)
    terminals.append(t)
    return t


def test_answers_commands_and_a_quiet_terminal(
    threaded_model: FakeOpenAI, tmp_path: Path, terminals: list[Terminal]
) -> None:
    t = open_chat(terminals, tmp_path, threaded_model.base_url)
    banner = t.shown
    assert "fake-model" in banner and threaded_model.base_url in banner, banner
    assert "sandbox: local" in banner
    assert f"logs:    {t.data / 'chat.log'}" in banner

    assert "echo: hello there" in t.ask("hello there")

    helped = t.ask("/help")
    for name in ("/new", "/status", "/memory", "/forget", "/help", "/quit"):
        assert name in helped, helped
    assert "/stop" not in helped and "Ctrl-C" in helped

    status = t.ask("/status")
    assert re.search(r"Thread: [0-9a-f]{8} — 2 messages", status), status
    assert f"fake-model at {threaded_model.base_url}" in status

    assert "Started a fresh conversation" in t.ask("/new")
    assert re.search(r"Thread: [0-9a-f]{8} — 0 messages", t.ask("/status"))
    assert "echo: second" in t.ask("second")
    last = [m["content"] for m in threaded_model.requests[-1]["messages"] if m["role"] == "user"]
    assert last == ["second"], "after /new the model sees only the new conversation"

    assert "Unknown command /frobnicate" in t.ask("/frobnicate")
    assert "chital pairing" in t.ask("/approve ABCD1234")

    t.child.sendeof()  # Ctrl-D
    assert t.wait_exit() == 0
    # Log records went to the file, none to the terminal.
    assert "HTTP Request" not in t.shown and " INFO " not in t.shown and " WARNING " not in t.shown
    assert " INFO " in t.log()
    t.assert_clean()


def test_memory_and_forget(threaded_model: FakeOpenAI, tmp_path: Path, terminals: list[Terminal]) -> None:
    plan = {"add": ["Likes green tea."], "update": [], "delete": []}
    threaded_model.add_rule(lambda text: text.startswith(EXTRACTION_MARKER), Reply(text=json.dumps(plan)))
    t = open_chat(terminals, tmp_path, threaded_model.base_url)
    assert "I don't remember anything about you yet." in t.ask("/memory")
    assert "echo: I like green tea" in t.ask("I like green tea")
    deadline = time.monotonic() + 20
    while "Likes green tea." not in (shown := t.ask("/memory")):
        assert time.monotonic() < deadline, f"nothing remembered: {shown}"
        time.sleep(0.3)
    assert "What I remember about you (1):" in shown
    assert "erased 1 thing(s)" in t.ask("/forget")
    assert "I don't remember anything about you yet." in t.ask("/memory")
    t.child.sendline("/quit")
    assert t.wait_exit() == 0
    t.assert_clean()


def test_ctrl_c_cancels_the_answer_and_the_thread_goes_on(
    threaded_model: FakeOpenAI, tmp_path: Path, terminals: list[Terminal]
) -> None:
    threaded_model.add_rule(
        lambda text: "SLOW" in text, Reply(text="slow words keep coming " * 10, chunks=60, chunk_delay=0.5)
    )
    t = open_chat(terminals, tmp_path, threaded_model.base_url)
    t.child.sendline("SLOW please")
    t.child.expect_exact("slow words")
    started = time.monotonic()
    t.child.sendintr()  # Ctrl-C: the terminal sends SIGINT to the chat
    t.child.expect_exact(PROMPT, timeout=10)
    assert time.monotonic() - started < 5, "cancelling took too long"
    assert "Cancelled" in t.child.before
    assert "slow words keep coming " * 10 not in t.shown, "the answer was not cut short"

    assert "echo: and now?" in t.ask("and now?")
    users = [m["content"] for m in threaded_model.requests[-1]["messages"] if m["role"] == "user"]
    assert users == ["SLOW please", "and now?"], "the thread goes on after the cancelled turn"

    t.child.sendintr()  # Ctrl-C at the prompt leaves
    assert t.wait_exit() == 0
    t.assert_clean()


def test_two_quick_ctrl_c_leave_cleanly(
    threaded_model: FakeOpenAI, tmp_path: Path, terminals: list[Terminal]
) -> None:
    threaded_model.add_rule(lambda text: "SLOW" in text, Reply(text="tick " * 60, chunks=60, chunk_delay=0.5))
    t = open_chat(terminals, tmp_path, threaded_model.base_url)
    t.child.sendline("SLOW again")
    t.child.expect_exact("tick")
    os.kill(t.child.pid, signal.SIGINT)
    time.sleep(0.1)  # two signals sent at once merge into one: the kernel keeps one pending
    os.kill(t.child.pid, signal.SIGINT)
    assert t.wait_exit(timeout=15) == 0
    t.assert_clean()


def test_a_model_that_is_down_is_named_with_its_cause_within_seconds(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    # The default retry schedule (3 retries from 1 s): a refused connection is retried once only.
    t = open_chat(terminals, tmp_path, url, model_retries=3, retry_backoff=1.0)
    started = time.monotonic()
    shown = t.ask("anyone there?", timeout=30)
    took = time.monotonic() - started
    assert "The model service cannot be reached" in shown, shown
    assert f"connection refused: {url}/chat/completions" in shown, shown
    assert "busy" not in shown
    assert took < 6, f"the cause came after {took:.1f} s"
    assert "connection refused" in t.log()  # the operator's log says it too
    t.child.sendeof()
    assert t.wait_exit() == 0
    t.assert_clean()


def test_a_refused_key_is_named(
    threaded_model: FakeOpenAI, tmp_path: Path, terminals: list[Terminal]
) -> None:
    threaded_model.add_rule(
        lambda text: True, Reply(status=401, error_message=f"Incorrect API key provided: {KEY}")
    )
    t = open_chat(terminals, tmp_path, threaded_model.base_url)
    shown = t.ask("hello?")
    assert "refused our credentials" in shown, shown
    assert "HTTP 401" in shown and "the API key was refused" in shown and threaded_model.base_url in shown
    assert len(threaded_model.requests) == 1, "a refused key is not retried"
    t.child.sendeof()
    assert t.wait_exit() == 0
    t.assert_clean()


def test_wrong_model_name_and_unknown_host(
    threaded_model: FakeOpenAI, tmp_path: Path, terminals: list[Terminal]
) -> None:
    threaded_model.add_rule(lambda text: "model?" in text, Reply(status=404))
    t = open_chat(terminals, tmp_path, threaded_model.base_url)
    shown = t.ask("which model?")
    assert "does not know the configured model" in shown and "HTTP 404" in shown, shown
    assert "wrong model name or base URL" in shown
    t.child.sendeof()
    assert t.wait_exit() == 0

    url = "http://chital-no-such-host.invalid/v1"
    (tmp_path / "dns").mkdir()
    t2 = open_chat(terminals, tmp_path / "dns", url, model_retries=3, retry_backoff=1.0)
    shown = t2.ask("hello?", timeout=30)
    assert f"DNS failure: cannot resolve the host of {url}/chat/completions" in shown, shown
    t2.child.sendeof()
    assert t2.wait_exit() == 0
    t2.assert_clean()


def test_piped_input_answers_and_ends_at_eof(threaded_model: FakeOpenAI, tmp_path: Path) -> None:
    """Not a terminal: lines come from a pipe, the last one without a newline, then end of input."""
    import subprocess

    cfg = base_config(tmp_path / "data", threaded_model.base_url, free_port())
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "chat", "-c", str(path)],
        cwd=str(REPO),
        env=chat_env(),
        input=b"one\n/status\ntwo",
        capture_output=True,
        timeout=60,
    )
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 0, out
    assert "echo: one" in out and "echo: two" in out and "Thread:" in out
    assert "Traceback" not in out
    assert [
        last_user_text(r)
        for r in threaded_model.requests
        if not last_user_text(r).startswith(EXTRACTION_MARKER)
    ][-2:] == ["one", "two"]


async def test_chat_users_get_the_failure_without_the_url(tmp_path: Path) -> None:
    """What reaches a chat platform (``TurnFailed.message``, the retry note) names no host; the
    operator's ``detail`` does. Real langchain-openai against a closed port, then a 503."""
    from contextlib import aclosing

    from agent.config import AgentSettings, ModelSpec
    from agent.events import StatusUpdate, TurnFailed
    from agent.harness import Harness

    port = free_port()
    settings = AgentSettings(retry_backoff=0.01, model_retries=3, model_timeout=5)
    spec = ModelSpec(model="fake-model", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    harness = Harness(settings, spec, tmp_path / "cp.sqlite")
    await harness.start()
    try:
        async with aclosing(harness.run("t1", user_id="u1", message_id="m1", text="hi")) as run:
            events = [event async for event in run]
    finally:
        await harness.close()
    notes = [e.text for e in events if isinstance(e, StatusUpdate)]
    assert notes == ["The model service cannot be reached; retrying (1/1)…"]  # once, not 3 times
    failed = events[-1]
    assert isinstance(failed, TurnFailed) and failed.retryable
    assert failed.message == "The model service cannot be reached right now. Please try again later."
    assert f"connection refused: http://127.0.0.1:{port}/v1/chat/completions" in failed.detail
    for text in [*notes, failed.message]:
        assert "127.0.0.1" not in text and str(port) not in text

    failing_model = FakeOpenAI()
    failing_model.script(*[Reply(status=503)] * 4)
    await failing_model.start()
    harness = Harness(
        settings, ModelSpec(model="m", base_url=failing_model.base_url, api_key=KEY), tmp_path / "cp2"
    )
    await harness.start()
    try:
        async with aclosing(harness.run("t1", user_id="u1", message_id="m1", text="hi")) as run:
            events = [event async for event in run]
    finally:
        await harness.close()
        await failing_model.aclose()
    notes = [e.text for e in events if isinstance(e, StatusUpdate)]
    assert notes[0] == "The model service failed (HTTP 503); retrying (1/3)…" and len(notes) == 3
    assert events[-1] == TurnFailed("The model service failed. Please try again later.", retryable=True)
    assert (
        isinstance(events[-1], TurnFailed) and "HTTP 503 from " + failing_model.base_url in events[-1].detail
    )


def test_the_plan_checklist_is_printed_as_it_changes_bounded_and_inert(
    threaded_model: FakeOpenAI, tmp_path: Path, terminals: list[Terminal]
) -> None:
    """The agent's ``write_todos`` plan shows in the terminal as in the chats: printed when it
    changes, each item one bounded line, with no escape sequence, bidi or zero-width character and
    no secret; ``/plan`` shows it afterwards; the tool's own progress line is not printed."""
    from tests.fakes.openai_server import ToolCall

    hostile = [
        "open the page \x1b]52;c;ZXZpbA==\x07 now",  # OSC 52: would set the clipboard
        f"read it \u202eexe.txt with key {KEY} \u200bhidden",
        "@everyone <!channel> " + "x" * 170,  # within the tool's 200, over the 100 shown
    ]

    def todos(*statuses: str) -> Reply:
        items = [{"content": c, "status": s} for c, s in zip(hostile, statuses, strict=True)]
        return Reply(tool_calls=[ToolCall("write_todos", {"todos": items})])

    threaded_model.script(
        todos("in_progress", "pending", "pending"),
        todos("completed", "completed", "in_progress"),
        Reply(text="ANSWER-TEXT"),
    )
    t = open_chat(terminals, tmp_path, threaded_model.base_url, memory={"enabled": False})
    out = t.ask("plan and do it")
    assert "ANSWER-TEXT" in out
    assert out.count("Plan (0/3 done)") == 1 and out.count("Plan (2/3 done)") == 1, out
    assert "[write_todos" not in out
    assert "\x1b]52" not in out and "\x07" not in out and "\u202e" not in out and "\u200b" not in out
    assert KEY not in out
    items = [ln for ln in out.splitlines() if ln.lstrip().startswith(("☐", "◐", "☑"))]
    assert len(items) == 9 and all(len(ln) <= 120 for ln in items), items  # 2 updates + the final state
    # Unfinished when the turn ended: the final state says so.
    assert "2 of 3 steps done; the rest was not finished" in out and "(not done)" in out
    shown = t.ask("/plan")
    assert "Plan (2/3 done)" in shown and "as the last answer left it" in shown and KEY not in shown
    t.assert_clean()
