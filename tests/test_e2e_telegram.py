"""End to end: `chital run` as a subprocess against a fake Telegram Bot API and a fake model.

Everything asserted is what the Telegram user would see in the chat (the fake's view of messages
after edits), plus /readyz and /metrics for the operator.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from tests.daemon import DaemonProcess
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.telegram_daemon import (
    GROUP,
    OTHER,
    OWNER,
    STRANGER,
    answered,
    drafted,
    replies_to,
    telegram_config,
)


async def test_dm_is_streamed_as_drafts_then_one_message(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    """In a private chat the answer streams as an ephemeral draft (sendMessageDraft): a crash
    mid-stream leaves nothing behind; only the final text becomes a message, sent once."""
    words = [f"word{i} " for i in range(12)]
    model.add_rule(lambda t: "stream please" in t, Reply(text="".join(words), chunks=12, chunk_delay=0.25))
    up = tg.inject_message(OWNER, OWNER, "stream please")
    msg = await answered(tg, OWNER, up, "word11")
    assert len(replies_to(tg, OWNER, up["message"]["message_id"])) == 1
    drafts = [text for chat, _, text in tg.drafts if chat == OWNER]
    assert len(drafts) >= 2 and "word11" not in drafts[0], "the answer grew in the draft"
    assert len({d for _, d, _ in tg.drafts}) == 1, "one draft id per answer (animated updates)"
    sends = [c for c in tg.calls_to("sendMessage") if c.params.get("chat_id") in (OWNER, str(OWNER))]
    assert len(sends) == 1 and msg.edits == 0
    assert msg.text.strip() == "".join(words).strip()
    assert tg.calls_to("sendChatAction"), "a typing action was shown while working"
    metrics = await telegram_daemon.metrics()
    assert 'chital_messages_in_total{channel="telegram"} 1.0' in metrics


async def test_group_needs_a_mention(telegram_daemon: DaemonProcess, tg: FakeTelegram) -> None:
    quiet = tg.inject_message(GROUP, OWNER, "just chatting with friends", chat_type="supergroup")
    loud = tg.inject_mention(GROUP, OWNER, "what is up")
    reply = await answered(tg, GROUP, loud, "echo: what is up")
    assert "@" not in reply.text, "the bot mention is stripped before the agent sees the text"
    # Same conversation, handled in order: the unmentioned message had its chance and got nothing.
    assert replies_to(tg, GROUP, quiet["message"]["message_id"]) == []
    assert all("just chatting" not in m.text for m in tg.bot_messages(GROUP))


async def test_commands_new_status_stop(telegram_daemon: DaemonProcess, tg: FakeTelegram) -> None:
    status1 = await answered(
        tg, OWNER, tg.inject_command(OWNER, OWNER, "status", chat_type="private", at=None), "Thread:"
    )
    assert "Model: fake-model" in status1.text
    await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "remember me"), "echo: remember me")
    new = await answered(
        tg, OWNER, tg.inject_command(OWNER, OWNER, "new", chat_type="private", at=None), "fresh conversation"
    )
    assert new.text
    status2 = await answered(
        tg, OWNER, tg.inject_command(OWNER, OWNER, "status", chat_type="private", at=None), "Thread:"
    )
    assert status2.text.splitlines()[0] != status1.text.splitlines()[0] or "0 messages" in status2.text
    assert "0 messages" in status2.text

    slow = tg.inject_message(OWNER, OWNER, "SLOW story")
    await tg.wait_for(lambda: drafted(tg, OWNER), timeout=10, what="slow start (a draft preview)")
    stop = tg.inject_command(OWNER, OWNER, "stop", chat_type="private", at=None)
    await answered(tg, OWNER, stop, "Stopping")
    await answered(tg, OWNER, slow, "Stopped")
    help_ = await answered(
        tg, OWNER, tg.inject_command(OWNER, OWNER, "help", chat_type="private", at=None), "/new"
    )
    assert "/stop" in help_.text and "/status" in help_.text
    unknown = await answered(
        tg,
        OWNER,
        tg.inject_command(OWNER, OWNER, "frobnicate", chat_type="private", at=None),
        "Unknown command /frobnicate",
    )
    assert "/help" in unknown.text


async def test_long_answer_is_split_without_breaking_code(
    telegram_daemon: DaemonProcess, tg: FakeTelegram
) -> None:
    up = tg.inject_message(OWNER, OWNER, "LONG please")
    mid = up["message"]["message_id"]
    await tg.wait_for(lambda: len(replies_to(tg, OWNER, mid)) >= 3 or None, timeout=20, what="3+ parts")
    await asyncio.sleep(0.5)  # let the last parts land
    parts = replies_to(tg, OWNER, mid)
    assert all(len(p.text.encode("utf-16-le")) // 2 <= 4096 for p in parts)
    code_parts = [p for p in parts if p.spans("pre")]
    assert code_parts, "the code block keeps its pre entity"
    joined = "".join(p.text for p in parts)
    assert "```" not in joined, "Markdown was rendered, not sent raw"


async def test_redelivered_update_is_answered_once(telegram_daemon: DaemonProcess, tg: FakeTelegram) -> None:
    up = tg.inject_message(OWNER, OWNER, "only once")
    await answered(tg, OWNER, up, "echo: only once")
    tg.redeliver(up)
    after = tg.inject_message(OWNER, OWNER, "next one")
    await answered(tg, OWNER, after, "echo: next one")
    assert len(replies_to(tg, OWNER, up["message"]["message_id"])) == 1
    assert 'reason="duplicate"' in await telegram_daemon.metrics()


async def test_kill9_mid_turn_resumes_once(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    up = tg.inject_message(OWNER, OWNER, "SLOW crash test")
    mid = up["message"]["message_id"]
    # Kill while the answer streams: in a DM it is an ephemeral draft, so nothing half-written
    # stays in the chat and the resumed answer is the one and only message.
    await tg.wait_for(lambda: len(drafted(tg, OWNER)) >= 2, timeout=10, what="streamed drafts")
    telegram_daemon.kill9()
    await telegram_daemon.wait_exit()
    model.add_rule(lambda t: True, lambda body: Reply(text=f"resumed answer to {last_user_text(body)}"))
    # Rules are checked in order: put the catch-all first so the SLOW rule does not fire again.
    model._rules.insert(0, model._rules.pop())
    await telegram_daemon.start()
    await answered(tg, OWNER, up, "resumed answer to SLOW crash test", timeout=20)
    replies = replies_to(tg, OWNER, mid)
    assert len(replies) == 1, [r.text for r in replies]
    assert "SLOW crash test" in replies[0].text


async def test_stranger_gets_pairing_code_never_the_agent(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    up = tg.inject_message(STRANGER, STRANGER, "hello bot, secret question")
    reply = await answered(tg, STRANGER, up, "pairing code")
    assert all("secret question" not in last_user_text(r) for r in model.requests)
    code = re.search(r"pairing code is ([A-Z0-9]{8})", reply.text).group(1)  # type: ignore[union-attr]
    rc, out = await telegram_daemon.cli("pairing", "approve", code)
    assert rc == 0 and f"telegram:{STRANGER}" in out, out
    again = tg.inject_message(STRANGER, STRANGER, "now may I")
    await answered(tg, STRANGER, again, "echo: now may I")


async def test_bad_input_gets_clear_answers(telegram_daemon: DaemonProcess, tg: FakeTelegram) -> None:
    huge = tg.inject_message(OWNER, OWNER, "x" * 40_000)
    await answered(tg, OWNER, huge, "characters long")
    rate = tg.inject_message(OWNER, OWNER, "FAIL429 now")
    msg = await answered(tg, OWNER, rate, "rate", timeout=30)
    assert "⚠️" in msg.text
    odd = tg.inject_message(OWNER, OWNER, "héllo \u200b 🦌 \U0001f9ea עברית")
    await answered(tg, OWNER, odd, "echo: héllo")


async def test_revoked_token_shows_in_readyz(telegram_daemon: DaemonProcess, tg: FakeTelegram) -> None:
    tg.revoke_token()
    info = await telegram_daemon.wait_channel_state("telegram", "failed", timeout=15)
    assert "401" in (info.get("reason") or "")
    status, body = await telegram_daemon.get("/readyz")
    assert status == 503 and body["ready"] is False
    assert tg.token not in str(body)
    assert tg.token not in telegram_daemon.logs()


async def test_sigterm_exits_cleanly(telegram_daemon: DaemonProcess, tg: FakeTelegram) -> None:
    await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "hi"), "echo: hi")
    rc = await telegram_daemon.terminate()
    assert rc == 0, telegram_daemon.logs()
    assert "stopped cleanly" in telegram_daemon.logs()


async def test_busy_chat_queues_visibly_and_blocks_no_one_else(
    telegram_daemon: DaemonProcess, tg: FakeTelegram
) -> None:
    tg.inject_message(OWNER, OWNER, "SLOW first")
    await tg.wait_for(lambda: drafted(tg, OWNER), timeout=10, what="slow started (a draft preview)")
    second = tg.inject_message(OWNER, OWNER, "second in line")
    queued = await answered(tg, OWNER, second, "Queued")
    # Another chat is not held up by the busy one.
    other = tg.inject_message(OTHER, OTHER, "meanwhile here")
    await answered(tg, OTHER, other, "echo: meanwhile here")
    await answered(
        tg, OWNER, tg.inject_command(OWNER, OWNER, "stop", chat_type="private", at=None), "Stopping"
    )
    final = await answered(tg, OWNER, second, "echo: second in line")
    assert final.message_id == queued.message_id, "the queued sign became the answer"
    assert len(replies_to(tg, OWNER, second["message"]["message_id"])) == 1


async def test_platform_429_is_honoured(telegram_daemon: DaemonProcess, tg: FakeTelegram) -> None:
    tg.fail_next("sendMessage", 429, retry_after=1)
    up = tg.inject_message(OWNER, OWNER, "despite limits")
    await answered(tg, OWNER, up, "echo: despite limits")
    assert len(replies_to(tg, OWNER, up["message"]["message_id"])) == 1
    assert 'chital_platform_429_total{channel="telegram"} 1.0' in await telegram_daemon.metrics()


async def test_sigterm_lets_a_running_turn_finish(
    telegram_daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    model.add_rule(lambda t: "take your time" in t, Reply(text="finished calmly", chunks=4, chunk_delay=0.5))
    up = tg.inject_message(OWNER, OWNER, "take your time")
    await tg.wait_for(lambda: tg.calls_to("sendChatAction") or None, timeout=10, what="turn started")
    rc = await telegram_daemon.terminate()  # grace is 5 s; the answer needs about 2 s
    assert rc == 0, telegram_daemon.logs()
    assert replies_to(tg, OWNER, up["message"]["message_id"])[-1].text == "finished calmly"


async def test_telegram_unreachable_at_start_is_retried(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    await tg.stop()  # the daemon starts while Telegram cannot be reached
    d = DaemonProcess(tmp_path, telegram_config(tmp_path, tg, model))
    try:
        await d.start(wait_ready=False)
        info = await d.wait_channel_state("telegram", "reconnecting", timeout=15)
        assert "retrying in" in (info.get("reason") or "")
        await tg.start()  # same port, same state
        await d.wait_ready(timeout=30)
        await answered(tg, OWNER, tg.inject_message(OWNER, OWNER, "back online"), "echo: back online")
        assert "chital_reconnects_total" in await d.metrics()
    finally:
        await d.close()
