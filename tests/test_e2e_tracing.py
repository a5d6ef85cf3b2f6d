"""End to end: traces of a turn (docs/tracing.md). `chital run` on the fake Telegram and the fake
model exports to a local OTLP/HTTP receiver (tests/fakes/otlp_server.py), and to a fake Langfuse.

What is asserted is what a tracing backend receives (the span tree, its names, token counts, what
text is in it), what the operator's log shows, and what the user sees in /status.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, free_port, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall
from tests.fakes.otlp_server import LANGFUSE_PATH, FakeOTLP, Span
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import OWNER, answered, telegram_config

API_KEY = "sk-test-key-never-logged"
"""The model API key of tests/daemon.py's base config."""
HEADER_SECRET = "otlp-header-secret-9f8e7d6c5b"
LANGFUSE_SECRET = "sk-lf-fake-secret-0a1b2c3d4e"
PROMPT_WORD = "TRACEPROMPT"


@pytest.fixture
async def otlp() -> AsyncIterator[FakeOTLP]:
    async with FakeOTLP() as fake:
        yield fake


@pytest.fixture(autouse=True)
def _quick_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's batch processor sends every 5 s by default; the daemon inherits a shorter wait."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    monkeypatch.setenv("HEADER_SECRET", HEADER_SECRET)
    monkeypatch.setenv("LANGFUSE_SK", LANGFUSE_SECRET)


def script_tool_and_subagent(model: FakeOpenAI) -> None:
    """The lead plans (a tool call), delegates to a sub-agent, and answers."""
    model.script(
        Reply(tool_calls=[ToolCall("write_todos", {"todos": [{"content": "look", "status": "in_progress"}]})],
              usage=(101, 11)),
        Reply(tool_calls=[ToolCall("task", {"description": "find it", "subagent_type": "general-purpose"})],
              usage=(102, 12)),
        Reply(text="the sub-agent found SUBRESULT", usage=(55, 5)),
        Reply(text="FINALANSWER done", usage=(103, 13)),
    )  # fmt: skip


async def traced_turn(otlp: FakeOTLP, path: str = "/v1/traces") -> list[Span]:
    """Spans of the one traced turn, once its turn span has arrived (it ends after its children)."""

    def done() -> bool:
        return any(s.name == "chital.turn" and "chital.turn.outcome" in s.attributes for s in otlp.spans())

    await _wait(done, "the turn span")
    turn = next(s for s in otlp.spans() if s.name == "chital.turn")
    return [s for s in otlp.spans(path) if s.trace_id == turn.trace_id]


async def _wait(check: Any, what: str, timeout: float = 30) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def tracing_config(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, **tracing: Any) -> dict[str, Any]:
    cfg = telegram_config(tmp_path, tg, model)
    cfg["tracing"] = {"enabled": True, **tracing}
    return cfg


async def ask(d: DaemonProcess, tg: FakeTelegram, text: str, needle: str) -> Any:
    return await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, text), needle, timeout=30)


def children(spans: list[Span], parent: Span) -> list[Span]:
    return [s for s in spans if s.parent_id == parent.span_id]


def one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {[s.name for s in spans]}"
    return found[0]


async def status_trace(tg: FakeTelegram) -> Any:
    """OWNER's ``/status`` reply once it shows a trace line."""
    update = tg.inject_command(OWNER, OWNER, "status", chat_type="private", at=None)
    return await answered(tg, OWNER, update, "Trace:", timeout=30)


async def test_the_span_tree_of_a_turn_with_a_tool_and_a_sub_agent(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, otlp: FakeOTLP
) -> None:
    cfg = tracing_config(
        tmp_path, tg, model, otlp_endpoint=otlp.traces_url, headers={"Authorization": "$HEADER_SECRET"}
    )
    script_tool_and_subagent(model)
    async with started_daemon(tmp_path, cfg) as d:
        await ask(d, tg, f"{PROMPT_WORD} plan and delegate; my key is {API_KEY}", "FINALANSWER")
        spans = await traced_turn(otlp)

        root = one(spans, "chital.message")
        assert root.parent_id == "" and root.attributes["chital.platform"] == "telegram"
        assert {s.name for s in children(spans, root)} >= {
            "chital.journal.write",
            "chital.queue.wait",
            "chital.turn",
        }
        turn = one(spans, "chital.turn")
        assert turn.parent_id == root.span_id and turn.attributes["chital.turn.outcome"] == "ok"
        assert turn.attributes["chital.turn.resumed"] is False

        under_turn = children(spans, turn)
        chats = [s for s in under_turn if s.name == "chat fake-model"]
        assert len(chats) == 3, [s.name for s in under_turn]  # the lead's three model calls
        tokens = sorted((s.attributes["gen_ai.usage.input_tokens"], s.attributes["gen_ai.usage.output_tokens"])
                        for s in chats)  # fmt: skip
        assert tokens == [(101, 11), (102, 12), (103, 13)]
        assert all(s.attributes["gen_ai.operation.name"] == "chat" for s in chats)
        tool = one(spans, "execute_tool write_todos")
        assert tool.parent_id == turn.span_id and tool.attributes["gen_ai.tool.name"] == "write_todos"
        task = one(spans, "execute_tool task")
        assert task.parent_id == turn.span_id
        sub = one(spans, "invoke_agent general-purpose")
        assert sub.parent_id == task.span_id
        sub_chats = [s for s in spans if s.name == "chat fake-model" and s not in chats]
        assert len(sub_chats) == 1 and sub_chats[0].attributes["gen_ai.usage.input_tokens"] == 55
        parents = {s.span_id: s for s in spans}
        walk, seen = sub_chats[0], []
        while walk.parent_id in parents:
            walk = parents[walk.parent_id]
            seen.append(walk.name)
        assert seen[:2] == ["invoke_agent general-purpose", "execute_tool task"], seen
        sends = [s for s in spans if s.name.startswith("chital.delivery.")]
        assert sends, "the answer's platform calls are spans of the same trace"
        assert all(s.trace_id == root.trace_id for s in spans)

        # Content is off by default: the user's words, the answer and tool arguments are absent.
        raw = otlp.raw()
        for word in (PROMPT_WORD, "FINALANSWER", "SUBRESULT", "in_progress"):
            assert word.encode() not in raw, word
        for secret in (API_KEY, tg.token, HEADER_SECRET):
            assert secret.encode() not in raw, secret
        assert all(r.headers.get("Authorization") == HEADER_SECRET for r in otlp.received), "headers sent"

        # The operator's log carries the trace id on the turn's lines; /status shows it.
        trace_id = root.trace_id
        assert f"trace_id={trace_id}" in d.logs()
        assert HEADER_SECRET not in d.logs()
        status = await status_trace(tg)
        assert f"Trace: {trace_id}" in status.text


async def test_recorded_content_is_masked_and_langfuse_gets_the_same_trace(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, otlp: FakeOTLP
) -> None:
    """With ``record_content`` the prompt and answer are in the spans, every secret masked; Langfuse
    (its LangChain handler, OTLP at /api/public/otel/v1/traces) gets the model calls in the same
    trace, masked the same way."""
    langfuse = {"host": otlp.base_url, "public_key": "pk-lf-fake-public", "secret_key": "$LANGFUSE_SK"}
    cfg = tracing_config(
        tmp_path, tg, model, otlp_endpoint=otlp.traces_url, record_content=True, langfuse=langfuse
    )
    script_tool_and_subagent(model)
    async with started_daemon(tmp_path, cfg) as d:
        await ask(d, tg, f"{PROMPT_WORD} bot {tg.token} key {API_KEY}", "FINALANSWER")
        spans = await traced_turn(otlp)
        first = min(
            (s for s in spans if s.name == "chat fake-model"),
            key=lambda s: s.attributes["gen_ai.usage.input_tokens"] != 101,
        )
        prompt = first.attributes["gen_ai.input.messages"]
        assert PROMPT_WORD in prompt and "***" in prompt
        answers = [s.attributes.get("gen_ai.output.messages", "") for s in spans]
        assert any("FINALANSWER" in a for a in answers)
        assert any("in_progress" in s.attributes.get("gen_ai.tool.call.arguments", "") for s in spans)

        await _wait(lambda: otlp.spans(LANGFUSE_PATH), "Langfuse's export")
        await _wait(
            lambda: any(PROMPT_WORD in str(s.attributes) for s in otlp.spans(LANGFUSE_PATH)),
            "Langfuse's generation",
        )
        lf = otlp.spans(LANGFUSE_PATH)
        assert {s.trace_id for s in lf} == {spans[0].trace_id}, "one trace id in both backends"
        lf_request = next(r for r in otlp.received if r.path == LANGFUSE_PATH)
        assert lf_request.headers.get("Authorization", "").startswith("Basic ")
        raw = otlp.raw()
        for secret in (API_KEY, tg.token, LANGFUSE_SECRET):
            assert secret.encode() not in raw, secret
        assert LANGFUSE_SECRET not in d.logs() and API_KEY not in d.logs()


async def test_content_is_not_in_langfuse_unless_recorded(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, otlp: FakeOTLP
) -> None:
    langfuse = {"host": otlp.base_url, "public_key": "pk-lf-fake-public", "secret_key": "$LANGFUSE_SK"}
    cfg = tracing_config(tmp_path, tg, model, langfuse=langfuse)  # no OTLP: Langfuse alone
    model.script(Reply(text="FINALANSWER plain", usage=(7, 3)))
    async with started_daemon(tmp_path, cfg) as d:
        await ask(d, tg, f"{PROMPT_WORD} hello {API_KEY}", "FINALANSWER")
        await _wait(
            lambda: any(
                s.attributes.get("gen_ai.usage.input_tokens") == 7
                or "langfuse.observation.usage_details" in s.attributes
                for s in otlp.spans(LANGFUSE_PATH)
            ),
            "Langfuse's generation",
        )
        raw = otlp.raw()
        assert PROMPT_WORD.encode() not in raw and b"FINALANSWER" not in raw
        assert API_KEY.encode() not in raw
        assert "not recorded" in str([s.attributes for s in otlp.spans(LANGFUSE_PATH)])
        assert "trace_id=" in d.logs()


async def test_an_unreachable_collector_neither_blocks_nor_fails_turns(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"  # nothing listens there
    cfg = tracing_config(
        tmp_path, tg, model, otlp_endpoint=dead, headers={"Authorization": "$HEADER_SECRET"}, export_timeout=1
    )
    async with started_daemon(tmp_path, cfg) as d:
        for i in range(3):
            await ask(d, tg, f"hello {i}", f"echo: hello {i}")
        await _wait(lambda: "could not export spans" in d.logs(), "the export failure's log line")
        await ask(d, tg, "hello again", "echo: hello again")
        logs = d.logs()
        assert logs.count("could not export spans") == 1, "logged once per outage"
        assert HEADER_SECRET not in logs
        assert "Traceback" not in logs
        status = await status_trace(tg)
        assert "Trace: " in status.text


async def test_a_turn_resumed_after_kill9_stays_in_the_messages_trace(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, otlp: FakeOTLP
) -> None:
    """The message's trace context is journaled with it: the turn the restarted daemon resumes is
    one more ``chital.turn`` (resumed) in the same trace, and /status shows that trace id."""
    cfg = tracing_config(tmp_path, tg, model, otlp_endpoint=otlp.traces_url)
    model.script(Reply(text="never sent", first_byte_delay=120), Reply(text="RESUMED answer"))
    async with started_daemon(tmp_path, cfg) as d:
        up = tg.inject_message(OWNER, OWNER, "crash while you think")
        await _wait(lambda: len(model.requests) >= 1, "the model call")
        await _wait(lambda: any(s.name == "chital.message" for s in otlp.spans()), "the root span's export")
        root = next(s for s in otlp.spans() if s.name == "chital.message")
        d.kill9()
        await d.wait_exit()
        await d.start()
        await answered(tg, OWNER, up, "RESUMED answer", timeout=30)
        await _wait(lambda: any(s.name == "chital.turn" for s in otlp.spans()), "the resumed turn")
        turn = next(s for s in otlp.spans() if s.name == "chital.turn")
        assert turn.trace_id == root.trace_id and turn.parent_id == root.span_id
        assert turn.attributes["chital.turn.resumed"] is True
        assert turn.attributes["chital.turn.attempt"] == 2
        status = await status_trace(tg)
        assert f"Trace: {root.trace_id}" in status.text


async def test_a_message_queued_behind_another_has_a_trace_of_its_own(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, otlp: FakeOTLP
) -> None:
    """The conversation's queue worker, started by the first message, runs the second one: the
    second's turn and its sends are in the second's trace, not the first's."""
    cfg = tracing_config(tmp_path, tg, model, otlp_endpoint=otlp.traces_url)
    model.script(Reply(text="FIRST answer " * 5, chunks=5, chunk_delay=0.3), Reply(text="SECOND answer"))
    async with started_daemon(tmp_path, cfg):
        first = tg.inject_message(OWNER, OWNER, "first")
        await _wait(lambda: len(model.requests) >= 1, "the first model call")
        second = tg.inject_message(OWNER, OWNER, "second")
        await answered(tg, OWNER, first, "FIRST answer", timeout=30)
        await answered(tg, OWNER, second, "SECOND answer", timeout=30)
        await _wait(lambda: len([s for s in otlp.spans() if s.name == "chital.turn"]) >= 2, "both turns")
        spans = otlp.spans()
        roots = {s.attributes["chital.message.key"]: s for s in spans if s.name == "chital.message"}
        assert len(roots) == 2
        for turn in (s for s in spans if s.name == "chital.turn"):
            root = roots[turn.attributes["chital.message.key"]]
            assert (turn.trace_id, turn.parent_id) == (root.trace_id, root.span_id)
            sends = [
                s for s in spans if s.name.startswith("chital.delivery.") and s.trace_id == turn.trace_id
            ]
            assert sends, "each message's answer is delivered within its own trace"


async def test_a_turn_resumed_by_an_approval_is_in_the_same_trace(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, otlp: FakeOTLP
) -> None:
    """Paused for a person's yes, then continued: two ``chital.turn`` spans (waiting, then ok)
    under the one message."""
    cfg = tracing_config(tmp_path, tg, model, otlp_endpoint=otlp.traces_url)
    cfg["agent"].update({"memory": {"enabled": False}, "approvals": {"tools": ["web_fetch"], "timeout": 600}})
    model.script(
        Reply(tool_calls=[ToolCall("web_fetch", {"url": "http://127.0.0.1:9/x"})]),
        Reply(text="APPROVED answer"),
    )
    async with started_daemon(tmp_path, cfg):
        up = tg.inject_message(OWNER, OWNER, "fetch it")

        def request() -> Any:
            return next((m for m in tg.bot_messages(OWNER) if "Approval needed" in m.text), None)

        asked = await tg.wait_for(request, timeout=30, what="the approval request")
        tg.press_button(OWNER, asked.message_id, OWNER, "Approve")
        await answered(tg, OWNER, up, "APPROVED answer", timeout=30)
        await _wait(lambda: len([s for s in otlp.spans() if s.name == "chital.turn"]) >= 2, "both turns")
        spans = otlp.spans()
        root = one(spans, "chital.message")
        turns = sorted(
            (s for s in spans if s.name == "chital.turn"), key=lambda s: s.attributes["chital.turn.attempt"]
        )
        assert [t.attributes["chital.turn.outcome"] for t in turns] == ["waiting", "ok"]
        assert all((t.trace_id, t.parent_id) == (root.trace_id, root.span_id) for t in turns)
        assert turns[1].attributes["chital.turn.resumed"] is True
        assert any(s.name == "execute_tool web_fetch" and s.trace_id == root.trace_id for s in spans)


async def test_chital_status_puts_the_trace_id_beside_the_error_a_failed_turn_logged(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, otlp: FakeOTLP
) -> None:
    """The operator's first question after a failed turn is "show me the trace": ``chital status``
    says tracing is on and where it goes, and the error the turn logged carries its trace id (the
    id the exporter got), never the exporter's address or headers."""
    cfg = tracing_config(
        tmp_path, tg, model, otlp_endpoint=otlp.traces_url, headers={"Authorization": "$HEADER_SECRET"}
    )
    model.script(Reply(status=400, error_message="the request was refused"))
    async with started_daemon(tmp_path, cfg) as d:
        await ask(d, tg, "this turn fails", "")
        turn = one(await traced_turn(otlp), "chital.turn")
        assert turn.attributes["chital.turn.outcome"] == "error"
        code, out = await d.cli("status", "--json")
        assert code == 0, out
        body = json.loads(out)
        assert body["tracing"] == {"enabled": True, "exporters": ["otlp"], "sample_ratio": 1.0}
        logged = [e for e in body["errors"] + body["warnings"] if e.get("trace_id") == turn.trace_id]
        assert logged, body
        code, out = await d.cli("status")
        assert code == 0, out
        assert "tracing: on, exported to otlp" in out, out
        assert f"trace_id={turn.trace_id}" in out.split("recent errors")[1], out
        assert otlp.traces_url not in out and HEADER_SECRET not in out


async def test_chital_status_says_tracing_is_off(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> None:
    async with started_daemon(tmp_path, telegram_config(tmp_path, tg, model)) as d:
        code, out = await d.cli("status")
        assert code == 0 and "tracing: off (tracing.enabled)" in out, out
