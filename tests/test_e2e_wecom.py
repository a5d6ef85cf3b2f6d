"""End to end: `chital run` as a subprocess, its WeCom channel against the fake long connection
(tests/fakes/wecom_server.py) and the fake model.

What is asserted is what a WeCom user would see (the fake's view of the bot's stream replies after
their updates, and its proactive messages), and /readyz, /metrics and the logs for the operator.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.daemon import DaemonProcess, clean_env, run_chital, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text
from tests.fakes.wecom_server import FakeWeCom
from tests.wecom_daemon import FRIEND, GROUP, OWNER, STRANGER, answered, sent_to, wecom_config


@pytest.fixture
async def daemon(tmp_path: Path, wecom: FakeWeCom, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, wecom_config(tmp_path, wecom, model), wecom) as d:
        await d.wait_channel_state("wecom", "connected")
        yield d


async def test_dm_is_answered_by_a_finished_stream(daemon: DaemonProcess, wecom: FakeWeCom) -> None:
    up = wecom.inject_text(OWNER, "hello <@boss>")
    reply = await answered(wecom, up, "echo: hello")
    assert reply.kind == "stream" and reply.frames[-1]["body"]["stream"]["finish"] is True
    assert all(f["headers"]["req_id"] == up["headers"]["req_id"] for f in reply.frames)
    assert all(not f["body"]["stream"]["finish"] for f in reply.frames[:-1]), "finish only on the last frame"
    assert "<@boss>" not in reply.text, "an echoed mention pings nobody"
    metrics = await daemon.metrics()
    assert 'chital_messages_in_total{channel="wecom"} 1.0' in metrics
    assert 'chital_channel_up{channel="wecom"} 1.0' in metrics
    assert wecom.secret not in daemon.logs()


async def test_answer_streams_by_updating_one_stream(
    daemon: DaemonProcess, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    words = [f"word{i} " for i in range(12)]
    model.add_rule(lambda t: "stream please" in t, Reply(text="".join(words), chunks=12, chunk_delay=0.3))
    up = wecom.inject_text(OWNER, "stream please")
    reply = await answered(wecom, up, "word11")
    assert len(wecom.replies_to(up)) == 1 and reply.updates >= 2, reply.updates
    assert reply.text.strip() == "".join(words).strip()


async def test_stranger_gets_pairing_code_never_the_agent(
    daemon: DaemonProcess, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    up = wecom.inject_text(STRANGER, "hello bot, secret question")
    reply = await answered(wecom, up, "pairing code")
    assert all("secret question" not in last_user_text(r) for r in model.requests)
    code = re.search(r"pairing code is ([A-Z0-9]{8})", reply.text).group(1)  # type: ignore[union-attr]
    rc, out = await daemon.cli("pairing", "approve", code)
    assert rc == 0 and f"wecom:{STRANGER}" in out, out
    await answered(wecom, wecom.inject_text(STRANGER, "now may I"), "echo: now may I")


async def test_group_mentions_of_known_people_are_answered_strangers_refused(
    daemon: DaemonProcess, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    up = wecom.inject_text(FRIEND, "@Chital what is up", group=GROUP)
    reply = await answered(wecom, up, "echo: what is up")
    assert "@Chital" not in reply.text, "the mention is cut before the agent reads the text"
    refused = wecom.inject_text(STRANGER, "@Chital tell me secrets", group=GROUP)
    await answered(wecom, refused, "I only answer people I know")
    assert all("tell me secrets" not in last_user_text(r) for r in model.requests)


async def test_group_policy_off_answers_no_group(tmp_path: Path, wecom: FakeWeCom, model: FakeOpenAI) -> None:
    cfg = wecom_config(tmp_path, wecom, model)
    cfg["access"]["group_policy"] = "off"
    async with started_daemon(tmp_path, cfg, wecom) as d:
        await d.wait_channel_state("wecom", "connected")
        wecom.inject_text(OWNER, "@Chital anyone here", group=GROUP)
        dm = wecom.inject_text(OWNER, "and in private")
        await answered(wecom, dm, "echo: and in private")
        assert wecom.bot_messages(GROUP) == []
        assert all("anyone here" not in last_user_text(r) for r in model.requests)


async def test_long_answer_is_split_into_a_stream_and_proactive_parts(
    daemon: DaemonProcess, wecom: FakeWeCom
) -> None:
    up = wecom.inject_text(OWNER, "LONG please")
    await wecom.wait_for(lambda: [m for m in wecom.replies_to(up) if m.finished], what="the first part")
    parts = await wecom.wait_for(
        lambda: (p := wecom.bot_messages(OWNER)) and len(p) >= 2 and p, what="2+ parts"
    )
    assert all(len(p.text.encode()) <= 20480 for p in parts)
    assert parts[0].reply_to == up["body"]["msgid"] and parts[1].kind == "markdown"


async def test_redelivered_callback_is_answered_once(daemon: DaemonProcess, wecom: FakeWeCom) -> None:
    up = wecom.inject_text(OWNER, "only once")
    await answered(wecom, up, "echo: only once")
    again = wecom.redeliver(up)
    await answered(wecom, wecom.inject_text(OWNER, "next one"), "echo: next one")
    assert wecom.replies_to(again) == wecom.replies_to(up) and len(wecom.replies_to(up)) == 1
    assert len([m for m in wecom.bot_messages(OWNER) if "only once" in m.text]) == 1
    assert 'reason="duplicate"' in await daemon.metrics()


async def test_dropped_and_half_open_connections_lose_nothing(
    daemon: DaemonProcess, wecom: FakeWeCom
) -> None:
    await wecom.drop()
    up = wecom.inject_text(OWNER, "through the drop")
    await answered(wecom, up, "echo: through the drop", timeout=30)
    wecom.half_open()
    after = wecom.inject_text(OWNER, "through the silence")
    await answered(wecom, after, "echo: through the silence", timeout=30)
    assert wecom.subscribes >= 3


async def test_kill9_mid_turn_is_answered_once_after_restart(
    daemon: DaemonProcess, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    up = wecom.inject_text(OWNER, "SLOW crash test")
    await wecom.wait_for(lambda: wecom.replies_to(up), what="streaming started")
    daemon.kill9()
    await daemon.wait_exit()
    model.add_rule(lambda t: True, lambda body: Reply(text=f"resumed answer to {last_user_text(body)}"))
    model._rules.insert(0, model._rules.pop())
    await daemon.start()
    await sent_to(wecom, OWNER, "resumed answer to SLOW crash test", timeout=30)
    later = wecom.inject_text(OWNER, "after the restart")
    await answered(wecom, later, "resumed answer to after the restart")
    finals = [m for m in wecom.bot_messages(OWNER) if "SLOW crash test" in m.text and m.finished]
    assert len(finals) == 1, [(m.kind, m.text) for m in wecom.bot_messages(OWNER)]


async def test_sigterm_exits_cleanly(daemon: DaemonProcess, wecom: FakeWeCom) -> None:
    await answered(wecom, wecom.inject_text(OWNER, "hi"), "echo: hi")
    rc = await daemon.terminate()
    assert rc == 0, daemon.logs()
    assert "stopped cleanly" in daemon.logs()


async def test_messages_sent_while_down_are_answered_once_after_restart(
    daemon: DaemonProcess, wecom: FakeWeCom
) -> None:
    first = wecom.inject_text(OWNER, "before the stop")
    await answered(wecom, first, "echo: before the stop")
    assert await daemon.terminate() == 0
    while_down = wecom.inject_text(OWNER, "while you were away")
    await daemon.start()
    await answered(wecom, while_down, "echo: while you were away", timeout=30)
    assert len(wecom.replies_to(first)) == 1 and len(wecom.replies_to(while_down)) == 1


async def test_malformed_frames_are_counted_and_skipped(daemon: DaemonProcess, wecom: FakeWeCom) -> None:
    for raw in ("not json", "null", '{"cmd": "aibot_brand_new_cmd", "headers": {"req_id": "x"}}',
                "z" * (5 * 1024 * 1024)):  # fmt: skip
        wecom.send_raw(raw)
    bad = wecom.inject_body({"msgid": "bad-1", "chattype": "single", "from": {"userid": OWNER},
                             "msgtype": "text", "text": {"content": 12345}})  # fmt: skip
    await answered(wecom, bad, "couldn't read that message")
    huge = wecom.inject_text(OWNER, "x" * 40_000)
    await answered(wecom, huge, "characters long")
    ok = wecom.inject_text(OWNER, "still fine")
    await answered(wecom, ok, "echo: still fine")
    metrics = await daemon.metrics()
    assert 'chital_malformed_events_total{kind="envelope",platform="wecom"} 4.0' in metrics, metrics
    assert 'chital_malformed_events_total{kind="message",platform="wecom"} 1.0' in metrics, metrics
    assert "12345" not in daemon.logs(), "the unreadable payload is not logged"
    _, body = await daemon.get("/readyz")
    assert body["channels"]["wecom"]["state"] == "connected"


async def test_refused_secret_is_fatal_in_readyz_and_not_retried(
    daemon: DaemonProcess, wecom: FakeWeCom
) -> None:
    await wecom.revoke()
    info = await daemon.wait_channel_state("wecom", "failed", timeout=30)
    assert "refused the subscription" in (info.get("reason") or "")
    assert 'chital_channel_up{channel="wecom"} 0.0' in await daemon.metrics()
    tries = wecom.subscribes
    await asyncio.sleep(3)
    assert wecom.subscribes == tries, "a refused secret is not retried"
    status, body = await daemon.get("/readyz")
    assert status == 503 and wecom.secret not in str(body)
    assert wecom.secret not in daemon.logs()


async def test_answer_after_the_reply_window_is_sent_proactively(
    daemon: DaemonProcess, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    """WeCom takes stream updates for 6 minutes: an answer that ends later is a message of its own."""
    text = "late but complete " * 8
    model.add_rule(lambda t: "take your time" in t, Reply(text=text, chunks=16, chunk_delay=0.4))
    model._rules.insert(0, model._rules.pop())
    up = wecom.inject_text(OWNER, "take your time")
    await wecom.wait_for(lambda: wecom.replies_to(up), what="streaming started")
    wecom.expire(up)
    late = await sent_to(wecom, OWNER, text.strip())
    assert late.kind == "markdown" and late.reply_to is None
    (stream,) = wecom.replies_to(up)
    assert not stream.finished and text.strip() not in stream.text, "the stream was cut off, not duplicated"


async def test_secrets_never_reach_the_chat(
    daemon: DaemonProcess, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    model.add_rule(lambda t: "leak" in t, Reply(text=f"secret {wecom.secret} key sk-test-key-never-logged"))
    model._rules.insert(0, model._rules.pop())
    reply = await answered(wecom, wecom.inject_text(OWNER, "leak please"), "secret")
    sent = str([f for f in wecom.received if f.get("cmd") != "aibot_subscribe"])
    assert wecom.secret not in sent and "sk-test-key-never-logged" not in sent
    assert "***" in reply.text


async def test_init_writes_wecom_settings_and_check_online_subscribes(
    tmp_path: Path, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    env = clean_env() | {"OPENAI_API_KEY": "sk-from-env", "WECOM_BOT_ID": wecom.bot_id,
                         "WECOM_BOT_SECRET": wecom.secret}  # fmt: skip
    done = await run_chital(
        "init", "--yes", "--channel", "wecom", "--model", "fake-model", "--base-url", model.base_url,
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.code == 0, done.out
    path = tmp_path / "config.yaml"
    config = path.read_text()
    assert "wecom:\n    enabled: true" in config and "secret: $WECOM_BOT_SECRET" in config, config
    assert wecom.secret not in config and wecom.secret not in done.out
    assert f"WECOM_BOT_SECRET='{wecom.secret}'" in (tmp_path / ".env").read_text()
    path.write_text(
        config.replace(
            "    enabled: true\n    bot_id:", f"    enabled: true\n    ws_url: {wecom.url}\n    bot_id:", 1
        )
    )
    done = await run_chital("check", "--online", "-c", str(path), cwd=tmp_path, env=env)
    assert f"aibot_subscribe: accepted for robot {wecom.bot_id}" in done.out, done.out
    await wecom.revoke()
    done = await run_chital("check", "--online", "-c", str(path), cwd=tmp_path, env=env)
    assert "aibot_subscribe refused: errcode 40001" in done.out and wecom.secret not in done.out, done.out


async def test_file_in_is_downloaded_and_decrypted(
    daemon: DaemonProcess, wecom: FakeWeCom, model: FakeOpenAI
) -> None:
    media = wecom.add_media(b"name,score\nada,3\n")
    up = wecom.inject_text(OWNER, "", msgtype="file", file={**media, "filename": "scores.csv"})
    await answered(wecom, up, "echo:")
    uploaded = list(daemon.sandbox_root.glob("**/uploads/scores.csv"))
    assert uploaded and uploaded[0].read_bytes() == b"name,score\nada,3\n"
    assert any("scores.csv" in last_user_text(r) for r in model.requests), "the agent was told"


async def test_oversized_file_is_refused_before_download(daemon: DaemonProcess, wecom: FakeWeCom) -> None:
    media = wecom.add_media(b"x" * 1024)
    up = wecom.inject_text(OWNER, "", msgtype="file", file={**media, "filename": "big.bin", "size": 10**10})
    reply = await answered(wecom, up, "big.bin")
    assert wecom.downloads == 0, reply.text
