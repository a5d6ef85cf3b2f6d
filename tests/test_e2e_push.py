"""Push-only targets (Bark, ntfy) end to end: ``chital run`` as a subprocess, ``chital send`` as a
subprocess, and the fake Bark and ntfy servers on the wire (docs/push.md).

What each test asserts is what the operator (the command's output, the daemon's log) or the
phone (the request the push server received) sees."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.send import Refused, parse_target
from gateway.config.schema import ConfigError, parse_config
from tests.daemon import DaemonProcess, base_config, free_port, started_daemon
from tests.fakes.bark_server import FakeBark
from tests.fakes.ntfy_server import FakeNtfy
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram

OWNER = 5151
BARK_KEY = "barkdevicekey0123456789"
NTFY_TOKEN = "tk_ntfytesttoken0123456789"
NTFY_TOPIC = "chital-alerts-7f3kq9"
WRONG_TOKEN = "tk_revokedtoken9876543210"
MODEL_KEY = "sk-test-key-never-logged"


def push_config(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, bark: FakeBark, ntfy: FakeNtfy
) -> dict[str, Any]:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["channels"]["telegram"] = tg.channel_settings(poll_timeout=1)
    cfg["access"] = {"allow_users": [str(OWNER)]}
    cfg["agent"]["memory"] = {"enabled": False}
    cfg["push"] = {
        "phone": {"kind": "bark", "server": bark.base_url, "device_key": BARK_KEY, "group": "chital"},
        "ops": {
            "kind": "ntfy",
            "server": ntfy.base_url,
            "topic": NTFY_TOPIC,
            "token": NTFY_TOKEN,
            "priority": 4,
            "tags": ["warning"],
            "schedules_from": [f"telegram:{OWNER}"],
        },
        "locked": {"kind": "ntfy", "server": ntfy.base_url, "topic": NTFY_TOPIC, "token": WRONG_TOKEN},
        "slow": {
            "kind": "ntfy",
            "server": ntfy.base_url,
            "topic": NTFY_TOPIC,
            "token": NTFY_TOKEN,
            "timeout": 1,
        },
        "stranger": {"kind": "bark", "server": bark.base_url, "device_key": "unknowndevicekey42424242"},
    }
    return cfg


@pytest.fixture
async def daemon(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, bark: FakeBark, ntfy: FakeNtfy
) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, push_config(tmp_path, tg, model, bark, ntfy)) as d:
        yield d


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in (BARK_KEY, NTFY_TOKEN, WRONG_TOKEN, NTFY_TOPIC, "unknowndevicekey42424242", MODEL_KEY):
            assert secret not in text, f"{secret!r} leaked: {text[-3000:]}"


async def test_send_reaches_bark_and_ntfy_once_with_title_and_settings(
    daemon: DaemonProcess, bark: FakeBark, ntfy: FakeNtfy
) -> None:
    code, out = await daemon.cli("send", "push:phone", "Deploy 42 finished ✅", "--title", "CI", "--wait")
    assert code == 0 and out.strip().endswith("delivered"), out
    (note,) = bark.notifications()
    assert note == {
        "device_key": BARK_KEY,
        "title": "CI",
        "body": "Deploy 42 finished ✅",
        "group": "chital",
    }, note

    code, out = await daemon.cli("send", "push:ops", "**disk** 91% full", "--title", "Déploy ✅", "--wait")
    assert code == 0 and out.strip().endswith("delivered"), out
    (pub,) = ntfy.notifications()
    assert pub.path == f"/{NTFY_TOPIC}" and pub.text() == "**disk** 91% full"
    assert FakeNtfy.title(pub) == "Déploy ✅"
    assert pub.headers["Authorization"] == f"Bearer {NTFY_TOKEN}"
    assert (pub.headers["Priority"], pub.headers["Tags"], pub.headers["Markdown"]) == ("4", "warning", "no")
    assert re.fullmatch(r"chital-[0-9a-f]{24}", pub.headers["X-Sequence-ID"])

    code, out = await daemon.cli("send", "push:nowhere", "x")
    assert (
        code == 2
        and "unknown push target 'nowhere'; known: push:locked, push:ops, push:phone, push:slow, push:stranger"
        in out
    ), out
    code, out = await daemon.cli("send", "telegram:5151", "x", "--title", "T")
    assert code == 2 and "--title is for push targets" in out, out
    await asyncio.sleep(1.5)
    assert len(bark.requests) == 1 and len(ntfy.requests) == 1, "each sent exactly once"


async def test_a_500_and_a_429_are_retried_and_one_notification_arrives(
    daemon: DaemonProcess, ntfy: FakeNtfy
) -> None:
    ntfy.script = [("status", 500, {}), ("status", 429, {"Retry-After": "1"}), "drop"]
    code, out = await daemon.cli("send", "push:ops", "backup done", "--wait", "--timeout", "40")
    assert code == 0 and out.strip().endswith("delivered"), out
    assert [r.answered for r in ntfy.requests] == [500, 429, None, 200]
    assert len(ntfy.notifications()) == 1
    assert len({r.headers["X-Sequence-ID"] for r in ntfy.requests}) == 1, "one notification, one id"
    metrics = await daemon.metrics()
    assert 'chital_pushes_total{outcome="retried",target="ops"} 3.0' in metrics, metrics
    assert 'chital_pushes_total{outcome="sent",target="ops"} 1.0' in metrics
    logs = daemon.logs()
    assert "answered HTTP 500; retrying" in logs and "answered HTTP 429; retrying" in logs, logs
    assert_no_secret(logs)


async def test_a_server_that_hangs_is_given_up_on_and_tried_again(
    daemon: DaemonProcess, ntfy: FakeNtfy
) -> None:
    ntfy.script = ["stall"]
    code, out = await daemon.cli("send", "push:slow", "after the hang", "--wait", "--timeout", "30")
    assert code == 0 and out.strip().endswith("delivered"), out
    assert [r.answered for r in ntfy.requests] == [None, 200]
    assert [p.text() for p in ntfy.notifications()] == ["after the hang"]
    assert re.search(
        r"could not reach the ntfy server \((TimeoutError|ReadTimeout)\); retrying", daemon.logs()
    )


async def test_a_refused_credential_stops_at_once_with_a_specific_token_free_error(
    daemon: DaemonProcess, ntfy: FakeNtfy, bark: FakeBark
) -> None:
    code, out = await daemon.cli("send", "push:locked", "will not go", "--wait", "--timeout", "20")
    assert code == 1, out
    assert "push target 'locked': the server refused the credentials (HTTP 401)" in out, out
    code2, out2 = await daemon.cli("send", "push:stranger", "nor this", "--wait", "--timeout", "20")
    assert code2 == 1 and "push target 'stranger': the Bark server rejected it (HTTP 400)" in out2, out2
    await asyncio.sleep(3)  # a retry loop would have tried again by now (backoff starts at 1 s)
    assert [r.answered for r in ntfy.requests] == [401] and [r.answered for r in bark.requests] == [400]
    logs = daemon.logs()
    assert "refused the credentials (HTTP 401)" in logs and "retrying" not in logs, logs
    assert 'chital_pushes_total{outcome="failed",target="locked"} 1.0' in await daemon.metrics()
    assert_no_secret(out, out2, logs)


async def test_long_text_is_cut_to_each_service_limit_and_secrets_are_masked(
    daemon: DaemonProcess, ntfy: FakeNtfy, bark: FakeBark
) -> None:
    text = (
        f"key {MODEL_KEY} and {BARK_KEY}, {NTFY_TOKEN} at {NTFY_TOPIC}\n" + "é" * 6000
    )  # 12 KB of two-byte characters
    assert (await daemon.cli("send", "push:ops", text, "--wait"))[0] == 0
    assert (await daemon.cli("send", "push:phone", text, "--wait"))[0] == 0
    (pub,) = ntfy.notifications()
    assert len(pub.body) <= 4096 and pub.text().endswith("… [truncated]"), len(pub.body)
    assert pub.text().startswith("key ") and "é" * 100 in pub.text()
    (note,) = bark.notifications()
    assert len(note["body"].encode()) <= 3000 and note["body"].endswith("… [truncated]")
    assert_no_secret(pub.text(), note["body"])
    assert "***" in pub.text() and "***" in note["body"]


async def test_a_title_with_cr_lf_cannot_add_a_header(
    daemon: DaemonProcess, ntfy: FakeNtfy, bark: FakeBark
) -> None:
    title = "Build\r\nX-Injected: yes\nPriority: 5"
    code, out = await daemon.cli("send", "push:ops", "body", "--title", title, "--wait")
    assert code == 0 and out.strip().endswith("delivered"), out
    (pub,) = ntfy.notifications()
    names = {k.decode().lower() for k, _ in pub.raw_headers}
    assert "x-injected" not in names and pub.headers["Priority"] == "4"
    assert FakeNtfy.title(pub) == "Build X-Injected: yes Priority: 5"
    code, out = await daemon.cli("send", "push:phone", "body", "--title", title, "--wait")
    assert code == 0 and bark.notifications()[0]["title"] == "Build X-Injected: yes Priority: 5"


async def test_a_push_survives_kill_9_before_it_was_sent(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, bark: FakeBark, ntfy: FakeNtfy
) -> None:
    """Journaled, then the daemon dies while the server drops every attempt: the restart sends it,
    once. And one sent while no daemon runs goes out at the next start."""
    d = DaemonProcess(tmp_path, push_config(tmp_path, tg, model, bark, ntfy))
    try:
        await d.start()
        ntfy.script = ["refuse"]
        code, out = await d.cli("send", "push:ops", "after the crash", "--key", "crash-1")
        assert code == 0, out
        await ntfy.wait_for(lambda: len(ntfy.requests) >= 1, what="the daemon's first attempt")
        d.kill9()
        await d.wait_exit()
        ntfy.script = []
        code, out = await d.cli("send", "push:phone", "while down")
        assert code == 0, out
        await d.start()
        await ntfy.wait_for(ntfy.notifications, what="the push after the restart")
        await bark.wait_for(bark.notifications, what="the push queued while down")
        await asyncio.sleep(2)
        assert [p.text() for p in ntfy.notifications()] == ["after the crash"]
        assert [n["body"] for n in bark.notifications()] == ["while down"]
        assert len({r.headers["X-Sequence-ID"] for r in ntfy.requests}) == 1
        code, out = await d.cli("send", "push:ops", "after the crash", "--key", "crash-1")
        assert code == 0 and "already journaled" in out
    finally:
        await d.close()


async def test_a_push_to_a_target_removed_from_the_config_fails_with_that_reason(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, bark: FakeBark, ntfy: FakeNtfy
) -> None:
    cfg = push_config(tmp_path, tg, model, bark, ntfy)
    d = DaemonProcess(tmp_path, cfg)
    try:
        await d.start()
        await d.terminate(timeout=60)  # a slow stop under load is not this test's subject
        assert (await d.cli("send", "push:phone", "for a phone that is gone"))[0] == 0
        cfg["push"] = {}  # the operator removed every target meanwhile
        await d.start()
        deadline = asyncio.get_running_loop().time() + 60  # a slow start under load
        while "is not in the config (push.phone)" not in d.logs():
            assert asyncio.get_running_loop().time() < deadline, d.logs()
            await asyncio.sleep(0.2)
        assert not bark.requests
    finally:
        await d.close()


async def test_a_kill_9_after_the_server_took_it_resends_with_the_same_sequence_id(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, bark: FakeBark, ntfy: FakeNtfy
) -> None:
    """The at-least-once window (docs/push.md, "Once"): the server has the request, the daemon dies
    before the answer. The restart sends it again, under the same X-Sequence-ID, so an ntfy 2.16+
    client updates the one notification instead of adding a second."""
    d = DaemonProcess(tmp_path, push_config(tmp_path, tg, model, bark, ntfy))
    try:
        await d.start()
        ntfy.script = ["stall"]
        assert (await d.cli("send", "push:ops", "window", "--key", "window-1"))[0] == 0
        await ntfy.wait_for(lambda: len(ntfy.requests) == 1, what="the request the server holds")
        d.kill9()
        await d.wait_exit()
        await d.start()
        await ntfy.wait_for(ntfy.notifications, what="the resend after the restart")
        first, second = ntfy.requests
        assert first.text() == second.text() == "window"
        assert first.headers["X-Sequence-ID"] == second.headers["X-Sequence-ID"]
    finally:
        await d.close()


async def test_a_schedule_posts_its_answer_to_the_chat_and_the_push_target(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI, ntfy: FakeNtfy, bark: FakeBark
) -> None:
    def brain(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last.get("role") == "tool":
            return Reply(text=f"Done: {last.get('content')}")
        text = last_user_text(body)
        if "[Scheduled task #" in text:
            return Reply(text="⏰ Time to stretch!")
        args = {"text": "Remind the user to stretch", "delay": "3s"}
        return Reply(tool_calls=[ToolCall("schedule_task", args)])

    model.add_rule(lambda _text: True, brain)
    tg.inject_message(OWNER, OWNER, "remind me in 3 seconds to stretch")
    await tg.wait_for(lambda: "⏰ Time to stretch!" in tg.bot_texts(OWNER), timeout=30, what="the firing")
    pub = (await ntfy.wait_for(ntfy.notifications, what="the firing's push"))[0]
    assert pub.text() == "⏰ Time to stretch!" and FakeNtfy.title(pub) == "Scheduled task #1"
    await asyncio.sleep(2)
    assert len(ntfy.notifications()) == 1, "the answer to the request itself is not pushed, nor twice"
    assert not bark.requests, "a target without schedules_from gets nothing"


async def test_check_online_tests_each_target_without_a_notification(
    daemon: DaemonProcess, ntfy: FakeNtfy, bark: FakeBark
) -> None:
    code, out = await daemon.cli("check", "--online")
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip().startswith("push:")}
    assert "OK the ntfy server accepts the credentials" in lines["push:ops"], out
    assert "FAILED: GET /v1/account: the server refused the credentials (HTTP 401)" in lines["push:locked"], (
        out
    )
    assert "OK the Bark server answers" in lines["push:phone"], out
    assert code == 1, "a refused credential fails the check"
    assert not ntfy.notifications() and not bark.notifications(), "a check sends no notification"
    assert_no_secret(out)


def test_the_push_section_refuses_what_could_not_work() -> None:
    base = {"models": [{"name": "default"}], "storage": {"path": "/tmp/x"}}
    bad = [
        ({"Phone": {"kind": "bark", "server": "https://api.day.app", "device_key": "k" * 22}}, "target name"),
        ({"p": {"kind": "bark", "server": "https://api.day.app"}}, "needs device_key"),
        ({"p": {"kind": "ntfy", "server": "https://ntfy.sh", "topic": "a/b"}}, "needs topic"),
        ({"p": {"kind": "ntfy", "server": "ftp://ntfy.sh", "topic": "ab"}}, "http"),
        ({"p": {"kind": "ntfy", "server": "https://u:pw@ntfy.sh", "topic": "ab"}}, "no user, password"),
        ({"p": {"kind": "ntfy", "server": "https://ntfy.sh", "topic": "ab", "username": "u"}}, "both"),
    ]
    for push, why in bad:
        with pytest.raises((ConfigError, ValueError), match=why):
            parse_config({**base, "push": push})
    cfg = parse_config(
        {**base, "push": {"ops": {"kind": "ntfy", "server": "https://ntfy.sh/", "topic": "alerts-1"}}}
    )
    assert cfg.push["ops"].server == "https://ntfy.sh"
    assert parse_target("push:ops", cfg) == ("push", "ops", None)
    with pytest.raises(Refused, match="unknown push target 'other'; known: push:ops"):
        parse_target("push:other", cfg)
