"""End to end through `chital run` and the fake Telegram: pairing decided by an admin in chat, the
queue and rate limits' notes, and a `/new` cut off by kill -9 opening exactly one thread."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.gateway_rig import daemon_rows
from tests.fakes.openai_server import FakeOpenAI, last_user_text
from tests.fakes.telegram_server import FakeTelegram

ADMIN = 1001
MEMBER = 1002  # allowed, not an admin
STRANGER = 6666


def config(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI, **extra: Any) -> dict[str, Any]:
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[str(MEMBER)], **extra)
    cfg["access"].update(admins=[str(ADMIN)], pairing=True)
    return cfg


@pytest.fixture
async def daemon(tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI) -> AsyncIterator[DaemonProcess]:
    limits = {"max_queue_per_conversation": 1}
    cfg = config(tmp_path, tg, model, concurrency=limits, limits={"user_messages_per_minute": 3})
    async with started_daemon(tmp_path, cfg) as d:
        yield d


def bot_texts_matching(tg: FakeTelegram, chat: int, needle: str) -> list[Any]:
    return [m for m in tg.bot_messages(chat) if needle in m.text]


async def reply(tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str, timeout: float = 15) -> str:
    mid = update["message"]["message_id"]

    def check() -> str | None:
        for m in tg.bot_messages(chat):
            if m.reply_to == mid and needle in m.text:
                return str(m.text)
        return None

    return await tg.wait_for(check, timeout=timeout, what=f"reply with {needle!r}")


def say(tg: FakeTelegram, user: int, text: str) -> dict[str, Any]:
    if text.startswith("/"):
        name, _, args = text[1:].partition(" ")
        return tg.inject_command(user, user, name, args, chat_type="private", at=None)
    return tg.inject_message(user, user, text)


async def test_admin_decides_pairing_in_chat(
    daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    # The admin and a member have written to the bot before (Telegram lets a bot DM only them).
    await reply(tg, ADMIN, say(tg, ADMIN, "hi"), "echo: hi")
    await reply(tg, MEMBER, say(tg, MEMBER, "hello"), "echo: hello")

    ask = say(tg, STRANGER, "let me in please")
    text = await reply(tg, STRANGER, ask, "pairing code is")
    code = re.search(r"pairing code is ([A-Z0-9]{8})", text).group(1)  # type: ignore[union-attr]
    assert "valid for 1 hour" in text
    announced = await tg.wait_for(
        lambda: bot_texts_matching(tg, ADMIN, f"/approve {code}"), what="announcement to the admin"
    )
    assert len(announced) == 1 and announced[0].reply_to is None

    refused = await reply(tg, MEMBER, say(tg, MEMBER, f"/approve {code}"), "only an admin")
    assert refused.startswith("Sorry")
    await reply(tg, ADMIN, say(tg, ADMIN, f"/approve {code}"), "Approved")
    await tg.wait_for(lambda: bot_texts_matching(tg, STRANGER, "approved you"), what="stranger told")
    await reply(tg, STRANGER, say(tg, STRANGER, "now may I"), "echo: now may I")
    assert all("let me in" not in last_user_text(r) for r in model.requests)

    await reply(tg, ADMIN, say(tg, ADMIN, f"/revoke {STRANGER}"), "Revoked telegram:6666")
    text2 = await reply(tg, STRANGER, say(tg, STRANGER, "and now?"), "pairing code is")
    code2 = re.search(r"pairing code is ([A-Z0-9]{8})", text2).group(1)  # type: ignore[union-attr]
    assert code2 != code
    await tg.wait_for(lambda: bot_texts_matching(tg, ADMIN, f"/approve {code2}"), what="2nd announcement")
    await reply(tg, ADMIN, say(tg, ADMIN, f"/deny {code2}"), "Denied")
    await tg.wait_for(lambda: bot_texts_matching(tg, STRANGER, "declined"), what="stranger told of denial")
    rc, out = await daemon.cli("pairing", "list")
    assert rc == 0 and code2 in out and "denied" in out, out
    rc, out = await daemon.cli("pairing", "approve", "ZZZZZZZZ")
    assert rc == 1 and "not pending" in out, out


async def test_queue_and_rate_limit_notes(daemon: DaemonProcess, tg: FakeTelegram, model: FakeOpenAI) -> None:
    say(tg, MEMBER, "SLOW one")
    # Its turn has started once the model is asked (in a DM the stream may be a draft, not a message).
    await tg.wait_for(
        lambda: any("SLOW one" in last_user_text(r) for r in model.requests), what="slow answer started"
    )
    two = say(tg, MEMBER, "two")
    await reply(tg, MEMBER, two, "Queued")
    full = await reply(tg, MEMBER, say(tg, MEMBER, "three"), "waiting in this chat")
    assert full == (
        "⏳ I already have 1 message waiting in this chat; please wait for my answers before sending more."
    )
    await reply(tg, MEMBER, say(tg, MEMBER, "/stop"), "Stopping")
    await reply(tg, MEMBER, two, "echo: two")
    # Accepted so far: "SLOW one" and "two" (the refused one does not count); limit 3 a minute.
    await reply(tg, MEMBER, say(tg, MEMBER, "four"), "echo: four")
    slowed = await reply(tg, MEMBER, say(tg, MEMBER, "five"), "faster than I can take them")
    assert "at most 3 messages a minute" in slowed
    for i in range(4):  # the admin is exempt
        await reply(tg, ADMIN, say(tg, ADMIN, f"admin {i}"), f"echo: admin {i}")


async def test_new_cut_off_by_kill9_opens_one_thread(
    tmp_path: Path, tg: FakeTelegram, model: FakeOpenAI
) -> None:
    d = DaemonProcess(tmp_path, config(tmp_path, tg, model))
    await d.start()
    try:
        await reply(tg, MEMBER, say(tg, MEMBER, "first thread"), "echo: first thread")

        def thread_now() -> str:
            sql = "SELECT thread_id FROM threads WHERE conversation = ?"
            ((thread,),) = daemon_rows(d.config["storage"], sql, (f"telegram:{MEMBER}",))
            return str(thread)

        before = thread_now()
        # The reply to /new is held by a 429 (retry after 30 s): the thread row is written, the
        # reply not sent. Kill the daemon then.
        tg.fail_next("sendMessage", 429, retry_after=30)
        new = say(tg, MEMBER, "/new")
        await tg.wait_for(
            lambda: [c for c in tg.calls_to("sendMessage") if c.status == 429], what="reply held by 429"
        )
        made = thread_now()
        assert made != before
        d.kill9()
        await d.wait_exit()

        await d.start()
        text = await reply(tg, MEMBER, new, "fresh conversation", timeout=20)
        assert f"thread {made[:8]}" in text
        assert len([m for m in tg.bot_messages(MEMBER) if m.reply_to == new["message"]["message_id"]]) == 1
        after = say(tg, MEMBER, "on the new thread?")
        await reply(tg, MEMBER, after, "echo: on the new thread?")
        assert thread_now() == made, "the resumed /new made no second thread"
    finally:
        await d.close()
