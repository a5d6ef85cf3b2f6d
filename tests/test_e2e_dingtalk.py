"""End to end: `chital run` as a subprocess, the DingTalk adapter (Stream mode on the
dingtalk-stream SDK's frames, the robot OpenAPI) against a fake DingTalk
(tests/fakes/dingtalk_server.py) and the fake model.

What is asserted is what a DingTalk user would see (the robot messages the fake received per chat),
what DingTalk sees (acks, connections, token requests), and /readyz, /metrics and the logs for the
operator.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess, clean_env, run_chital, started_daemon
from tests.dingtalk_daemon import FRIEND, GROUP, OWNER, STRANGER, answered, dingtalk_config
from tests.fakes.dingtalk_server import FakeDingTalk
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text


@pytest.fixture
async def daemon(tmp_path: Path, dingtalk: FakeDingTalk, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, dingtalk_config(tmp_path, dingtalk, model)) as d:
        await d.wait_channel_state("dingtalk", "connected")
        await dingtalk.wait_for(lambda: dingtalk.ws is not None, what="the stream connection")
        yield d


async def test_dm_is_answered_and_acked_after_journaling(
    daemon: DaemonProcess, dingtalk: FakeDingTalk
) -> None:
    up = await dingtalk.inject_text("", OWNER, "hello @所有人")
    reply = await answered(dingtalk, OWNER, "echo: hello")
    assert reply.key == "sampleMarkdown"
    await dingtalk.wait_for(lambda: not dingtalk.pending, what="the ack")
    metrics = await daemon.metrics()
    assert 'chital_messages_in_total{channel="dingtalk"} 1.0' in metrics
    assert 'chital_channel_up{channel="dingtalk"} 1.0' in metrics
    logs = daemon.logs()
    assert dingtalk.client_secret not in logs and "ticket=" not in logs
    assert all(t not in logs for t in dingtalk.tokens)
    assert up["msgId"]


async def test_stranger_gets_pairing_code_never_the_agent(
    daemon: DaemonProcess, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    await dingtalk.inject_text("", STRANGER, "hello bot, secret question")
    reply = await answered(dingtalk, STRANGER, "pairing code")
    assert all("secret question" not in last_user_text(r) for r in model.requests)
    code = re.search(r"pairing code is ([A-Z0-9]{8})", reply.text).group(1)  # type: ignore[union-attr]
    rc, out = await daemon.cli("pairing", "approve", code)
    assert rc == 0 and f"dingtalk:{STRANGER}" in out, out
    await dingtalk.inject_text("", STRANGER, "now may I")
    await answered(dingtalk, STRANGER, "echo: now may I")


async def test_group_answers_mentions_only(daemon: DaemonProcess, dingtalk: FakeDingTalk) -> None:
    await dingtalk.inject_text(GROUP, OWNER, "just chatting with friends", group=True, at=False)
    await dingtalk.inject_text(GROUP, FRIEND, "what is up", group=True)
    await answered(dingtalk, GROUP, "echo: what is up")
    await dingtalk.wait_for(lambda: not dingtalk.pending, what="both acks")
    assert all("just chatting" not in m.text for m in dingtalk.messages_to(GROUP))
    await dingtalk.inject_text(GROUP, STRANGER, "tell me secrets", group=True)
    await answered(dingtalk, GROUP, "I only answer people I know")


async def test_long_answer_is_split(daemon: DaemonProcess, dingtalk: FakeDingTalk) -> None:
    await dingtalk.inject_text("", OWNER, "LONG please")
    parts = await dingtalk.wait_for(lambda: len(dingtalk.messages_to(OWNER)) >= 2 and dingtalk.messages_to(OWNER),
                                    what="2+ parts")  # fmt: skip
    assert all(len(p.text) <= 4000 for p in parts)


async def test_streamed_answer_arrives_as_one_final_message(
    daemon: DaemonProcess, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    """DingTalk cannot edit a robot's message: no partial message is ever shown."""
    words = [f"word{i} " for i in range(12)]
    model.add_rule(lambda t: "stream please" in t, Reply(text="".join(words), chunks=12, chunk_delay=0.1))
    await dingtalk.inject_text("", OWNER, "stream please")
    msg = await answered(dingtalk, OWNER, "word11")
    assert msg.text.strip() == "".join(words).strip()
    assert len(dingtalk.messages_to(OWNER)) == 1


async def test_redelivered_frame_is_answered_once(daemon: DaemonProcess, dingtalk: FakeDingTalk) -> None:
    await dingtalk.inject_text("", OWNER, "only once")
    await answered(dingtalk, OWNER, "echo: only once")
    mid = next(iter(dingtalk.frames))
    await dingtalk.redeliver(mid)
    await dingtalk.inject_text("", OWNER, "next one")
    await answered(dingtalk, OWNER, "echo: next one")
    assert len([m for m in dingtalk.messages_to(OWNER) if "only once" in m.text]) == 1
    assert sum(a["headers"]["messageId"] == mid for a in dingtalk.acks) == 2, "the copy is acked too"
    assert 'reason="duplicate"' in await daemon.metrics()


async def test_dropped_and_half_open_connections_lose_nothing(
    daemon: DaemonProcess, dingtalk: FakeDingTalk
) -> None:
    await dingtalk.drop()
    await dingtalk.inject_text("", OWNER, "through the drop")  # no socket: kept until acked
    await answered(dingtalk, OWNER, "echo: through the drop", timeout=30)
    assert dingtalk.connections >= 2
    dingtalk.half_open = True  # no pongs, no frames: the client must notice by itself
    before = dingtalk.connections
    await dingtalk.inject_text("", OWNER, "while half open")
    await dingtalk.wait_for(lambda: dingtalk.ws is None or dingtalk.connections > before, timeout=30,
                            what="the half-open socket dropped by the client")  # fmt: skip
    dingtalk.half_open = False
    await answered(dingtalk, OWNER, "echo: while half open", timeout=30)
    await dingtalk.system("disconnect")  # the server announces a restart of its side
    await dingtalk.wait_for(lambda: dingtalk.connections > before + 1, timeout=30, what="a reconnect")
    await dingtalk.inject_text("", OWNER, "after the disconnect")
    await answered(dingtalk, OWNER, "echo: after the disconnect", timeout=30)
    assert [m.text for m in dingtalk.messages_to(OWNER)].count("echo: while half open") <= 1


async def test_kill9_mid_turn_is_answered_once_after_restart(
    daemon: DaemonProcess, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    model.add_rule(lambda t: "SLOW" in t, Reply(text="slow answer", chunks=4, chunk_delay=2.0))
    model._rules.insert(0, model._rules.pop())
    await dingtalk.inject_text("", OWNER, "SLOW crash test")
    await dingtalk.wait_for(lambda: not dingtalk.pending, what="the ack (journaled)")
    daemon.kill9()
    await daemon.wait_exit()
    model.add_rule(lambda t: True, lambda body: Reply(text=f"resumed answer to {last_user_text(body)}"))
    model._rules.insert(0, model._rules.pop())
    await daemon.start()
    await answered(dingtalk, OWNER, "resumed answer to SLOW crash test", timeout=30)
    await dingtalk.inject_text("", OWNER, "after the restart")
    await answered(dingtalk, OWNER, "resumed answer to after the restart")
    texts = [m.text for m in dingtalk.messages_to(OWNER)]
    assert sum("SLOW crash test" in t or "slow answer" in t for t in texts) == 1, texts


async def test_malformed_frames_are_counted_and_skipped(
    daemon: DaemonProcess, dingtalk: FakeDingTalk
) -> None:
    for raw in ("not json", "[1, 2]", '{"type": "CALLBACK"}', '{"headers": {"messageId": "m1"}, "type": 5}'):
        await dingtalk.send_frame(raw)
    await dingtalk.inject("not json either", mid="bad-data-1")
    await dingtalk.inject({"anything": 1}, topic="/v1.0/unknown/topic")
    await dingtalk.inject({"x": 1}, kind="WHATEVER")
    await dingtalk.inject({"x": 1}, kind="EVENT", topic="chat_update_title")
    bad = dingtalk.message("", OWNER, "z")
    bad["text"] = {"content": 12345}
    await dingtalk.inject(bad)
    await answered(dingtalk, OWNER, "couldn't read that message")
    await dingtalk.inject(dingtalk.message("", OWNER, "y" * 1_100_000), mid="huge-1")
    await dingtalk.inject_text("", OWNER, "x" * 40_000)
    await answered(dingtalk, OWNER, "characters long")
    await dingtalk.inject_text("", OWNER, "still fine")
    await answered(dingtalk, OWNER, "echo: still fine")
    assert dingtalk.acked("bad-data-1") and dingtalk.acked("huge-1"), (
        "skipped frames are acked, not redelivered"
    )
    metrics = await daemon.metrics()
    assert 'chital_malformed_events_total{kind="envelope",platform="dingtalk"}' in metrics, metrics
    assert 'chital_malformed_events_total{kind="message",platform="dingtalk"}' in metrics, metrics
    assert "12345" not in daemon.logs() and "yyyyyyyy" not in daemon.logs()
    _, body = await daemon.get("/readyz")
    assert body["channels"]["dingtalk"]["state"] == "connected"


async def test_frames_nested_too_deep_are_skipped_acked_and_the_stream_goes_on(
    daemon: DaemonProcess, dingtalk: FakeDingTalk
) -> None:
    """A faulty gateway sends JSON nested deeper than the decoder goes, in the frame itself or in its
    data string: before, the RecursionError escaped the frame loop (no ack, the channel restarted,
    and the redelivered frame would crash it again); now each is skipped, counted, acknowledged."""
    deep = "[" * 200_000 + "]" * 200_000
    mid = await dingtalk.inject(deep, mid="deep-data-1")
    await dingtalk.send_frame(
        '{"type": "CALLBACK", "headers": {"messageId": "deep-frame-1"}, "x": ' + deep + "}"
    )
    await dingtalk.inject_text("", OWNER, "after the deep ones")
    await answered(dingtalk, OWNER, "echo: after the deep ones")
    assert dingtalk.acked(mid), "the frame with deep data is acknowledged, not redelivered forever"
    assert dingtalk.opens == 1, "the stream was never dropped and opened again"
    metrics = await daemon.metrics()
    assert 'chital_malformed_events_total{kind="envelope",platform="dingtalk"} 2.0' in metrics, metrics
    assert "RecursionError" not in daemon.logs()


async def test_revoked_secret_is_fatal_in_readyz(daemon: DaemonProcess, dingtalk: FakeDingTalk) -> None:
    dingtalk.revoke()
    await dingtalk.drop()
    info = await daemon.wait_channel_state("dingtalk", "failed", timeout=30)
    assert "credentials" in (info.get("reason") or "")
    opens = dingtalk.opens
    await asyncio.sleep(3)
    assert dingtalk.opens == opens, "a revoked secret is not retried"
    status, body = await daemon.get("/readyz")
    assert status == 503 and dingtalk.client_secret not in str(body)
    assert dingtalk.client_secret not in daemon.logs()


async def test_throttled_send_is_retried(daemon: DaemonProcess, dingtalk: FakeDingTalk) -> None:
    dingtalk.fail_next("send", 403, "Forbidden.AccessDenied.QpsLimitForApi")
    await dingtalk.inject_text("", OWNER, "despite limits")
    await answered(dingtalk, OWNER, "echo: despite limits")
    assert len(dingtalk.messages_to(OWNER)) == 1


async def test_expired_token_is_renewed_once(daemon: DaemonProcess, dingtalk: FakeDingTalk) -> None:
    await dingtalk.inject_text("", OWNER, "first")
    await answered(dingtalk, OWNER, "echo: first")
    requests = dingtalk.token_requests
    dingtalk.tokens.clear()  # DingTalk expired the cached token early
    await dingtalk.inject_text("", OWNER, "second")
    await answered(dingtalk, OWNER, "echo: second")
    assert dingtalk.token_requests == requests + 1


async def test_sigterm_exits_cleanly(daemon: DaemonProcess, dingtalk: FakeDingTalk) -> None:
    await dingtalk.inject_text("", OWNER, "hi")
    await answered(dingtalk, OWNER, "echo: hi")
    rc = await daemon.terminate()
    assert rc == 0, daemon.logs()
    assert "stopped cleanly" in daemon.logs()


async def test_secrets_never_reach_the_chat(
    daemon: DaemonProcess, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    model.add_rule(
        lambda t: "leak" in t, Reply(text=f"secret {dingtalk.client_secret} key sk-test-key-never-logged")
    )
    model._rules.insert(0, model._rules.pop())
    await dingtalk.inject_text("", OWNER, "leak please")
    reply = await answered(dingtalk, OWNER, "secret")
    sent = str([m.param for m in dingtalk.sent])
    assert dingtalk.client_secret not in sent and "sk-test-key-never-logged" not in sent
    assert "***" in reply.text


async def test_messages_sent_while_down_are_answered_once_after_restart(
    daemon: DaemonProcess, dingtalk: FakeDingTalk
) -> None:
    await dingtalk.inject_text("", OWNER, "before the stop")
    await answered(dingtalk, OWNER, "echo: before the stop")
    assert await daemon.terminate() == 0
    await dingtalk.inject_text("", OWNER, "while you were away")
    await daemon.start()
    await answered(dingtalk, OWNER, "echo: while you were away", timeout=30)
    texts = [m.text for m in dingtalk.messages_to(OWNER)]
    assert texts.count("echo: before the stop") == 1 and texts.count("echo: while you were away") == 1


async def test_init_writes_dingtalk_settings_and_check_online_asks_for_a_token(
    tmp_path: Path, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    env = clean_env() | {"OPENAI_API_KEY": "sk-from-env", "DINGTALK_CLIENT_ID": dingtalk.client_id,
                         "DINGTALK_CLIENT_SECRET": dingtalk.client_secret}  # fmt: skip
    done = await run_chital(
        "init", "--yes", "--channel", "dingtalk", "--model", "fake-model", "--base-url", model.base_url,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.code == 0, done.out
    config_path = tmp_path / "config.yaml"
    config = config_path.read_text()
    assert "dingtalk:\n    enabled: true" in config and "client_secret: $DINGTALK_CLIENT_SECRET" in config
    assert dingtalk.client_secret not in config and dingtalk.client_secret not in done.out
    assert f"DINGTALK_CLIENT_SECRET='{dingtalk.client_secret}'" in (tmp_path / ".env").read_text()
    config_path.write_text(
        config.replace("    enabled: true", f"    enabled: true\n    api_base: {dingtalk.base_url}", 1)
    )
    done = await run_chital("check", "--online", "-c", str(config_path), cwd=tmp_path, env=env)
    assert "accessToken: granted" in done.out, done.out
    dingtalk.revoke()
    done = await run_chital("check", "--online", "-c", str(config_path), cwd=tmp_path, env=env)
    assert "invalidClientSecret" in done.out and dingtalk.client_secret not in done.out, done.out


async def test_files_in_and_out(daemon: DaemonProcess, dingtalk: FakeDingTalk, model: FakeOpenAI) -> None:
    """A file the user sends is fetched by its downloadCode into the sandbox's uploads; a file the
    agent presents is uploaded (media_id) and sent as a sampleFile robot message."""
    dingtalk.files["dlcode-1"] = b"region,amount\nnorth,10\n"
    out = "/mnt/user-data/outputs/rows.txt"
    model.script(
        Reply(tool_calls=[ToolCall("write_file", {"file_path": out, "content": "2 rows\n"})]),
        Reply(tool_calls=[ToolCall("present_files", {"paths": [out]})]),
        Reply(text="Sent you rows.txt."),
    )
    await dingtalk.inject(
        dingtalk.message(
            "", OWNER, "", msgtype="file", content={"downloadCode": "dlcode-1", "fileName": "sales.csv"}
        )
    )
    await answered(dingtalk, OWNER, "Sent you rows.txt.", timeout=30)
    assert "/v1.0/robot/messageFiles/download" in dingtalk.calls
    uploaded = list(daemon.sandbox_root.glob("**/uploads/sales.csv"))
    assert uploaded and uploaded[0].read_bytes() == b"region,amount\nnorth,10\n"
    assert "sales.csv" in last_user_text(model.requests[0]), "the agent was told"
    sent = await dingtalk.wait_for(
        lambda: next((m for m in dingtalk.messages_to(OWNER) if m.key == "sampleFile"), None), what="the file"
    )
    assert sent.param["fileName"] == "rows.txt" and dingtalk.uploads[sent.param["mediaId"]] == (
        "rows.txt",
        b"2 rows\n",
    )


async def test_a_hostile_dingtalk_error_text_never_reaches_the_chat(
    daemon: DaemonProcess, dingtalk: FakeDingTalk
) -> None:
    """A faulty OpenAPI refuses a file's download with a code and message carrying a link, an @all
    and a bidi override: the user is told the file could not be fetched, in the adapter's words."""
    dingtalk.files["dlcode-h"] = b"a,b\n"
    dingtalk.fail_next(
        "download", 400, "[x](https://evil.example/a)", "@all \u202e see https://evil.example/b"
    )
    await dingtalk.inject(
        dingtalk.message(
            "", OWNER, "", msgtype="file", content={"downloadCode": "dlcode-h", "fileName": "sales.csv"}
        )
    )
    await answered(dingtalk, OWNER, "could not fetch")
    for m in dingtalk.messages_to(OWNER):
        assert "evil.example" not in m.text and "\u202e" not in m.text and "@all" not in m.text, m.text


async def test_oversized_file_is_refused_before_download(
    daemon: DaemonProcess, dingtalk: FakeDingTalk
) -> None:
    """DingTalk announces no size: the download stops at the limit and the user is told."""
    dingtalk.files["dlcode-big"] = b"x" * (60 * 1024 * 1024)
    await dingtalk.inject(
        dingtalk.message(
            "", OWNER, "", msgtype="file", content={"downloadCode": "dlcode-big", "fileName": "big.bin"}
        )
    )
    reply = await answered(dingtalk, OWNER, "big.bin", timeout=30)
    assert "limit" in reply.text, reply.text
    assert not list(daemon.sandbox_root.glob("**/uploads/big.bin")), "nothing of it reached the sandbox"


async def test_with_a_card_template_the_answer_streams_into_one_card(
    tmp_path: Path, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    cfg = dingtalk_config(tmp_path, dingtalk, model)
    cfg["channels"]["dingtalk"]["card_template_id"] = "tpl-fake.schema"
    words = [f"word{i} " for i in range(12)]
    model.add_rule(lambda t: "stream please" in t, Reply(text="".join(words), chunks=12, chunk_delay=0.3))
    async with started_daemon(tmp_path, cfg) as d:
        await d.wait_channel_state("dingtalk", "connected")
        await dingtalk.wait_for(lambda: dingtalk.ws is not None, what="the stream connection")
        await dingtalk.inject_text("", OWNER, "stream please")
        card = await dingtalk.wait_for(
            lambda: next((c for c in dingtalk.cards.values() if c.final), None),
            timeout=30,
            what="a finished card",
        )
    assert card.chat_id == OWNER and card.text.strip() == "".join(words).strip()
    assert card.updates >= 2, "the answer was streamed into the card, not sent at once"
    assert len(dingtalk.cards) == 1 and not dingtalk.sent, "one card, no plain message"


async def test_a_streamed_card_never_shows_a_secret_even_split_across_chunks(
    tmp_path: Path, dingtalk: FakeDingTalk, model: FakeOpenAI
) -> None:
    """Card streaming shows partial answers: the app secret, streamed in pieces across chunks, is in
    none of the texts the card ever showed (each one is redacted, not only the final one)."""
    cfg = dingtalk_config(tmp_path, dingtalk, model)
    cfg["channels"]["dingtalk"]["card_template_id"] = "tpl-fake.schema"
    text = f"start {'pad ' * 10}secret {dingtalk.client_secret} and {'more ' * 10}end"
    model.add_rule(lambda t: "stream a leak" in t, Reply(text=text, chunks=10, chunk_delay=0.3))
    model._rules.insert(0, model._rules.pop())
    async with started_daemon(tmp_path, cfg) as d:
        await d.wait_channel_state("dingtalk", "connected")
        await dingtalk.wait_for(lambda: dingtalk.ws is not None, what="the stream connection")
        await dingtalk.inject_text("", OWNER, "stream a leak")
        card = await dingtalk.wait_for(
            lambda: next((c for c in dingtalk.cards.values() if c.final), None), timeout=30, what="a card"
        )
    assert card.updates >= 2 and "end" in card.text
    half = dingtalk.client_secret[: len(dingtalk.client_secret) // 2 + 2]
    assert all(half not in shown for shown in card.shown), card.shown
    assert "***" in card.text
