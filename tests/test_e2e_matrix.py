"""End to end: `chital run` as a subprocess with the real matrix-nio client against a fake
homeserver (tests/fakes/matrix_server.py) and the fake model.

What is asserted is what a Matrix user would see in the room (the fake's view of the bot's
messages after edits, their reply and thread relations), and /readyz, /metrics and the logs for
the operator.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess, clean_env, run_chital, started_daemon
from tests.fakes.matrix_server import FakeMatrix
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.matrix_daemon import DM, GROUP, OWNER, STRANGER, STRANGER_DM, answered, matrix_config


@pytest.fixture
async def daemon(tmp_path: Path, matrix_hs: FakeMatrix, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, matrix_config(tmp_path, matrix_hs, model)) as d:
        await d.wait_channel_state("matrix", "connected")
        await matrix_hs.wait_for(lambda: matrix_hs.syncs >= 2, what="the first long poll")
        yield d


async def test_dm_is_answered_as_a_reply_that_pings_nobody(
    daemon: DaemonProcess, matrix_hs: FakeMatrix
) -> None:
    up = matrix_hs.inject_text(DM, OWNER, "hello @room")
    reply = await answered(matrix_hs, up, "echo: hello")
    assert reply.content["m.mentions"] == {}, "an echoed @room must notify nobody"
    assert reply.reply_to == up["event_id"]
    metrics = await daemon.metrics()
    assert 'chital_messages_in_total{channel="matrix"} 1.0' in metrics
    assert 'chital_channel_up{channel="matrix"} 1.0' in metrics
    assert matrix_hs.token not in daemon.logs()


async def test_stranger_gets_pairing_code_never_the_agent(
    daemon: DaemonProcess, matrix_hs: FakeMatrix, model: FakeOpenAI
) -> None:
    up = matrix_hs.inject_text(STRANGER_DM, STRANGER, "hello bot, secret question")
    reply = await answered(matrix_hs, up, "pairing code")
    assert all("secret question" not in last_user_text(r) for r in model.requests)
    code = re.search(r"pairing code is ([A-Z0-9]{8})", reply.text).group(1)  # type: ignore[union-attr]
    rc, out = await daemon.cli("pairing", "approve", code)
    assert rc == 0 and f"matrix:{STRANGER}" in out, out
    await answered(matrix_hs, matrix_hs.inject_text(STRANGER_DM, STRANGER, "now may I"), "echo: now may I")


async def test_room_answers_mentions_replies_and_threads_only(
    daemon: DaemonProcess, matrix_hs: FakeMatrix, model: FakeOpenAI
) -> None:
    quiet = matrix_hs.inject_text(GROUP, OWNER, "just chatting with friends")
    loud = matrix_hs.inject_text(GROUP, OWNER, "Chital: what is up")
    reply = await answered(matrix_hs, loud, "echo: what is up")
    assert "Chital" not in reply.text, "the address is stripped before the agent sees the text"
    pill = matrix_hs.inject_text(
        GROUP, OWNER, "hey there", **{"m.mentions": {"user_ids": [matrix_hs.user_id]}}
    )
    await answered(matrix_hs, pill, "echo: hey there")
    follow = matrix_hs.inject_text(
        GROUP, OWNER, "and more", **{"m.relates_to": {"m.in_reply_to": {"event_id": reply.event_id}}}
    )
    await answered(matrix_hs, follow, "and more")
    asked = next(last_user_text(r) for r in reversed(model.requests) if "and more" in last_user_text(r))
    assert "echo: what is up" in asked and "not requests" in asked, "the replied-to answer is quoted context"
    thread = {"rel_type": "m.thread", "event_id": quiet["event_id"], "is_falling_back": True,
              "m.in_reply_to": {"event_id": quiet["event_id"]}}  # fmt: skip
    threaded = matrix_hs.inject_text(GROUP, OWNER, "Chital: in a thread", **{"m.relates_to": thread})
    in_thread = await answered(matrix_hs, threaded, "echo: in a thread")
    assert in_thread.thread == quiet["event_id"], "the answer stays in the thread"
    assert matrix_hs.replies_to(GROUP, quiet["event_id"]) == []
    assert all("just chatting" not in m.text for m in matrix_hs.bot_messages(GROUP))


async def test_long_answer_is_split(daemon: DaemonProcess, matrix_hs: FakeMatrix) -> None:
    up = matrix_hs.inject_text(DM, OWNER, "LONG please")
    parts = await matrix_hs.wait_for(
        lambda: (p := matrix_hs.replies_to(DM, up["event_id"])) and len(p) >= 2 and p, what="2+ parts"
    )
    assert all(len(p.text) <= 4000 for p in parts)
    assert any("<pre><code" in p.content.get("formatted_body", "") for p in parts), "code kept as code"


async def test_answer_streams_by_editing(
    daemon: DaemonProcess, matrix_hs: FakeMatrix, model: FakeOpenAI
) -> None:
    words = [f"word{i} " for i in range(12)]
    model.add_rule(lambda t: "stream please" in t, Reply(text="".join(words), chunks=12, chunk_delay=0.3))
    up = matrix_hs.inject_text(DM, OWNER, "stream please")
    msg = await answered(matrix_hs, up, "word11")
    assert len(matrix_hs.replies_to(DM, up["event_id"])) == 1
    edits = [e for e in matrix_hs.edits() if e["m.relates_to"]["event_id"] == msg.event_id]
    assert edits and all(e["m.new_content"]["body"] and e["body"].startswith("* ") for e in edits)
    assert msg.text.strip() == "".join(words).strip()


async def test_redelivered_event_is_answered_once(daemon: DaemonProcess, matrix_hs: FakeMatrix) -> None:
    up = matrix_hs.inject_text(DM, OWNER, "only once")
    await answered(matrix_hs, up, "echo: only once")
    matrix_hs.redeliver(up)
    await answered(matrix_hs, matrix_hs.inject_text(DM, OWNER, "next one"), "echo: next one")
    assert len(matrix_hs.replies_to(DM, up["event_id"])) == 1
    assert 'reason="duplicate"' in await daemon.metrics()


async def test_dropped_sync_loses_nothing(daemon: DaemonProcess, matrix_hs: FakeMatrix) -> None:
    matrix_hs.drop_syncs(2)
    up = matrix_hs.inject_text(DM, OWNER, "through the drop")
    await answered(matrix_hs, up, "echo: through the drop", timeout=30)
    matrix_hs.fail_next("sync", 429, errcode="M_LIMIT_EXCEEDED", retry_after_ms=300)
    after = matrix_hs.inject_text(DM, OWNER, "after a rate limit")
    await answered(matrix_hs, after, "echo: after a rate limit", timeout=30)


async def test_kill9_mid_turn_is_answered_once_after_restart(
    daemon: DaemonProcess, matrix_hs: FakeMatrix, model: FakeOpenAI
) -> None:
    up = matrix_hs.inject_text(DM, OWNER, "SLOW crash test")
    await matrix_hs.wait_for(lambda: matrix_hs.replies_to(DM, up["event_id"]), what="streaming started")
    daemon.kill9()
    await daemon.wait_exit()
    model.add_rule(lambda t: True, lambda body: Reply(text=f"resumed answer to {last_user_text(body)}"))
    model._rules.insert(0, model._rules.pop())
    await daemon.start()
    await answered(matrix_hs, up, "resumed answer to SLOW crash test", timeout=30)
    replies = matrix_hs.replies_to(DM, up["event_id"])
    assert len(replies) == 1, [r.text for r in replies]
    later = matrix_hs.inject_text(DM, OWNER, "after the restart")
    await answered(matrix_hs, later, "resumed answer to after the restart")
    assert len(matrix_hs.replies_to(DM, up["event_id"])) == 1, "the restart replayed nothing"


async def test_malformed_events_are_counted_and_skipped(daemon: DaemonProcess, matrix_hs: FakeMatrix) -> None:
    bad_body = matrix_hs.event(OWNER, {"msgtype": "m.text", "body": 12345})
    for event in ("a string", None, {"type": "m.room.message"}, bad_body,
                  matrix_hs.event(OWNER, {"anything": 1}, etype="org.example.unknown"),
                  matrix_hs.event(OWNER, None), {**matrix_hs.event(OWNER, {}), "event_id": "$" + "x" * 600}):  # type: ignore[arg-type]  # fmt: skip
        matrix_hs.inject_event(DM, event)
    huge = matrix_hs.inject_text(DM, OWNER, "x" * 40_000)
    await answered(matrix_hs, huge, "characters long")
    beyond = matrix_hs.inject_text(DM, OWNER, "y" * 1_000_001)  # more than any platform sends
    await answered(matrix_hs, beyond, "couldn't read that message")
    await answered(matrix_hs, bad_body, "couldn't read that message")
    ok = matrix_hs.inject_text(DM, OWNER, "still fine")
    await answered(matrix_hs, ok, "echo: still fine")
    metrics = await daemon.metrics()
    assert 'chital_malformed_events_total{kind="message",platform="matrix"}' in metrics, metrics
    assert "12345" not in daemon.logs(), "the unreadable payload is not logged"
    _, body = await daemon.get("/readyz")
    assert body["channels"]["matrix"]["state"] == "connected"


async def test_encrypted_and_unusable_events_get_a_clear_note(
    daemon: DaemonProcess, matrix_hs: FakeMatrix
) -> None:
    enc = matrix_hs.event(OWNER, {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AAAA",
                                  "session_id": "s", "sender_key": "k", "device_id": "D"}, "m.room.encrypted")  # fmt: skip
    matrix_hs.inject_event(DM, enc)
    await answered(matrix_hs, enc, "encrypted")
    sticker = matrix_hs.inject_event(
        DM, matrix_hs.event(OWNER, {"body": "a cat", "url": "mxc://x/y"}, "m.sticker")
    )
    await answered(matrix_hs, sticker, "can't use stickers")
    matrix_hs.inject_event(
        DM, matrix_hs.event(OWNER, {"key": "👍"}, "m.reaction")
    )  # ignored, as the spec says
    await answered(matrix_hs, matrix_hs.inject_text(DM, OWNER, "after"), "echo: after")
    assert 'platform="matrix"' not in await daemon.metrics(), "nothing here was malformed"


async def test_file_in_is_downloaded_through_the_media_repository(
    daemon: DaemonProcess, matrix_hs: FakeMatrix, model: FakeOpenAI
) -> None:
    mxc = matrix_hs.add_media(b"name,score\nada,3\n", "text/csv")
    up = matrix_hs.inject_text(DM, OWNER, "scores.csv", msgtype="m.file", url=mxc,
                               info={"size": 17, "mimetype": "text/csv"})  # fmt: skip
    await answered(matrix_hs, up, "echo:")
    assert any(p.startswith("/client/v1/media/download/") for _, p in matrix_hs.calls)
    uploaded = list(daemon.sandbox_root.glob("**/uploads/scores.csv"))
    assert uploaded and uploaded[0].read_bytes() == b"name,score\nada,3\n"
    assert any("scores.csv" in last_user_text(r) for r in model.requests), "the agent was told"


async def test_oversized_file_is_refused_before_download(
    daemon: DaemonProcess, matrix_hs: FakeMatrix
) -> None:
    """The announced size is checked first; a server that lies is cut off at the limit anyway."""
    mxc = matrix_hs.add_media(b"x" * 1024)
    up = matrix_hs.inject_text(DM, OWNER, "big.bin", msgtype="m.file", url=mxc, info={"size": 10**10})
    reply = await answered(matrix_hs, up, "big.bin")
    assert not any(p.startswith("/client/v1/media/download/") for _, p in matrix_hs.calls), reply.text


async def test_platform_429_on_send_is_honoured(daemon: DaemonProcess, matrix_hs: FakeMatrix) -> None:
    matrix_hs.fail_next("send", 429, errcode="M_LIMIT_EXCEEDED", retry_after_ms=500)
    up = matrix_hs.inject_text(DM, OWNER, "despite limits")
    await answered(matrix_hs, up, "echo: despite limits")
    assert len(matrix_hs.replies_to(DM, up["event_id"])) == 1


async def test_revoked_token_is_fatal_in_readyz(daemon: DaemonProcess, matrix_hs: FakeMatrix) -> None:
    matrix_hs.revoke_token()
    info = await daemon.wait_channel_state("matrix", "failed", timeout=20)
    assert "access token" in (info.get("reason") or "")
    assert 'chital_channel_up{channel="matrix"} 0.0' in await daemon.metrics()
    syncs = matrix_hs.syncs
    await asyncio.sleep(3)
    assert matrix_hs.syncs == syncs, "a revoked token is not retried"
    status, body = await daemon.get("/readyz")
    assert status == 503 and matrix_hs.token not in str(body)
    assert matrix_hs.token not in daemon.logs()


async def test_sigterm_exits_cleanly(daemon: DaemonProcess, matrix_hs: FakeMatrix) -> None:
    await answered(matrix_hs, matrix_hs.inject_text(DM, OWNER, "hi"), "echo: hi")
    rc = await daemon.terminate()
    assert rc == 0, daemon.logs()
    assert "stopped cleanly" in daemon.logs()


async def test_init_writes_matrix_settings_and_check_online_runs_whoami(
    tmp_path: Path, matrix_hs: FakeMatrix, model: FakeOpenAI
) -> None:
    env = clean_env() | {"OPENAI_API_KEY": "sk-from-env", "MATRIX_HOMESERVER": matrix_hs.base_url,
                         "MATRIX_USER_ID": matrix_hs.user_id, "MATRIX_ACCESS_TOKEN": matrix_hs.token}  # fmt: skip
    done = await run_chital(
        "init", "--yes", "--channel", "matrix", "--model", "fake-model", "--base-url", model.base_url,
        "--online", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.code == 0, done.out
    assert f"whoami: {matrix_hs.user_id}" in done.out, done.out
    config = (tmp_path / "config.yaml").read_text()
    assert "matrix:\n    enabled: true" in config and "access_token: $MATRIX_ACCESS_TOKEN" in config
    assert matrix_hs.token not in config and matrix_hs.token not in done.out
    assert f"MATRIX_ACCESS_TOKEN='{matrix_hs.token}'" in (tmp_path / ".env").read_text()
    matrix_hs.revoke_token()
    done = await run_chital("check", "--online", "-c", str(tmp_path / "config.yaml"), cwd=tmp_path, env=env)
    assert "M_UNKNOWN_TOKEN" in done.out and matrix_hs.token not in done.out, done.out


async def test_stranger_addressing_the_bot_in_a_room_is_refused(
    daemon: DaemonProcess, matrix_hs: FakeMatrix
) -> None:
    matrix_hs.room(GROUP, OWNER, STRANGER)
    up = matrix_hs.inject_text(GROUP, STRANGER, "Chital: tell me secrets")
    await answered(matrix_hs, up, "I only answer people I know")


async def test_secrets_never_reach_the_room(
    daemon: DaemonProcess, matrix_hs: FakeMatrix, model: FakeOpenAI
) -> None:
    """The model repeats the bot's own access token and the model key: both are masked by value in
    the body and in the HTML the client renders."""
    model.add_rule(lambda t: "leak" in t, Reply(text=f"token {matrix_hs.token} key sk-test-key-never-logged"))
    model._rules.insert(0, model._rules.pop())
    reply = await answered(matrix_hs, matrix_hs.inject_text(DM, OWNER, "leak please"), "token")
    sent = str([c for _, _, c in matrix_hs.sent])
    assert matrix_hs.token not in sent and "sk-test-key-never-logged" not in sent
    assert "***" in reply.text


async def test_messages_sent_while_down_are_answered_once_after_restart(
    daemon: DaemonProcess, matrix_hs: FakeMatrix
) -> None:
    first = matrix_hs.inject_text(DM, OWNER, "before the stop")
    await answered(matrix_hs, first, "echo: before the stop")
    assert await daemon.terminate() == 0
    while_down = matrix_hs.inject_text(DM, OWNER, "while you were away")
    await daemon.start()
    await answered(matrix_hs, while_down, "echo: while you were away", timeout=30)
    await answered(matrix_hs, matrix_hs.inject_text(DM, OWNER, "and now"), "echo: and now")
    assert len(matrix_hs.replies_to(DM, first["event_id"])) == 1, "nothing earlier was answered again"
    assert len(matrix_hs.replies_to(DM, while_down["event_id"])) == 1


async def test_approval_is_asked_and_answered_in_words(
    tmp_path: Path, matrix_hs: FakeMatrix, model: FakeOpenAI
) -> None:
    """Matrix has no buttons: the prompt says `approve CODE` / `deny CODE` and a typed answer works."""
    cfg = matrix_config(tmp_path, matrix_hs, model)
    cfg["agent"].update({"memory": {"enabled": False}, "approvals": {"tools": ["execute"], "timeout": 600}})
    async with started_daemon(tmp_path, cfg):
        await matrix_hs.wait_for(lambda: matrix_hs.syncs >= 2, what="the first long poll")
        model.script(
            Reply(tool_calls=[ToolCall("execute", {"command": "echo approved-run"})]),
            Reply(text="Left it alone."),
        )
        matrix_hs.inject_text(DM, OWNER, "run the check")
        prompt = await matrix_hs.wait_for(
            lambda: next((m for m in matrix_hs.bot_messages(DM) if "deny " in m.text), None),
            what="the prompt",
        )
        code = re.search(r"`deny ([A-Za-z0-9]+)`", prompt.text)
        assert code is not None, prompt.text
        matrix_hs.inject_text(DM, OWNER, f"deny {code.group(1)}")
        await matrix_hs.wait_for(
            lambda: any("Left it alone." in m.text for m in matrix_hs.bot_messages(DM)), what="the answer"
        )
        tool_result = model.requests[-1]["messages"][-1]
        assert tool_result["role"] == "tool" and "rejected" in tool_result["content"], "the command never ran"


async def test_chital_send_posts_into_a_room_whose_id_holds_a_colon(
    daemon: DaemonProcess, matrix_hs: FakeMatrix
) -> None:
    """`chital send matrix:!room:server TEXT` (a room id carries its server after a colon) posts
    the notice into that room once; a room alias or a thread is refused naming what is expected."""
    rc, out = await daemon.cli("send", f"matrix:{GROUP}", "deploy finished", "--wait")
    assert rc == 0 and out.strip().startswith(f"matrix:{GROUP}:push-"), out
    await matrix_hs.wait_for(
        lambda: [m for m in matrix_hs.bot_messages(GROUP) if m.text == "deploy finished"], what="the notice"
    )
    rc, out = await daemon.cli("send", "matrix:#general:example.org", "hi")
    assert rc == 2 and "is not a matrix chat id: expected a room id" in out, out
    rc, out = await daemon.cli("send", f"matrix:{GROUP}:$thread", "hi")
    assert rc == 2 and "matrix threads cannot be posted into directly" in out, out
    assert len([m for m in matrix_hs.bot_messages(GROUP) if m.text == "deploy finished"]) == 1


async def test_a_gap_longer_than_one_sync_is_read_back_and_answered_in_order(
    daemon: DaemonProcess, matrix_hs: FakeMatrix
) -> None:
    """More messages arrive while the daemon is down than one sync serves (the homeserver here
    serves 5 per room): the timeline comes back ``limited`` and the rest is paginated back from
    ``prev_batch`` to the last batch, so every message is answered once, in the order sent."""
    await answered(matrix_hs, matrix_hs.inject_text(DM, OWNER, "before"), "echo: before")
    assert await daemon.terminate() == 0
    matrix_hs.timeline_cap = 5
    missed = [matrix_hs.inject_text(DM, OWNER, f"missed {i:02d}") for i in range(12)]
    await daemon.start()
    for up in missed:
        await answered(matrix_hs, up, f"echo: {up['content']['body']}", timeout=60)
    assert all(len(matrix_hs.replies_to(DM, up["event_id"])) == 1 for up in missed)
    answers = [m.text for m in matrix_hs.bot_messages(DM) if "echo: missed" in m.text]
    assert answers == [f"echo: missed {i:02d}" for i in range(12)], answers
    assert len(matrix_hs.paginations) >= 2 and all(q["dir"] == "b" for q in matrix_hs.paginations)
    assert "the oldest were not read" not in daemon.logs()


async def test_a_gap_the_homeserver_will_not_show_is_logged_and_the_rest_answered(
    daemon: DaemonProcess, matrix_hs: FakeMatrix
) -> None:
    """The homeserver refuses the back-pagination (the room's history hidden from the bot): the
    gap is given up with a log line naming the room, the newest messages are still answered, and
    the channel stays connected."""
    await answered(matrix_hs, matrix_hs.inject_text(DM, OWNER, "before"), "echo: before")
    assert await daemon.terminate() == 0
    matrix_hs.timeline_cap = 3
    missed = [matrix_hs.inject_text(DM, OWNER, f"missed {i}") for i in range(6)]
    matrix_hs.fail_next("messages", 403, errcode="M_FORBIDDEN")
    await daemon.start()
    for up in missed[-3:]:
        await answered(matrix_hs, up, f"echo: {up['content']['body']}", timeout=60)
    await daemon.wait_channel_state("matrix", "connected")
    assert f"room {DM} got while the daemon was away could not be read" in daemon.logs()
    assert matrix_hs.token not in daemon.logs()
