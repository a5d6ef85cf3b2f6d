"""The gateway and the agent on PostgreSQL: the same store calls give the same answers as on SQLite,
the schema migrates forward (also with two daemons starting at once), and a daemon on PostgreSQL
answers Telegram messages and keeps the thread across a restart (checkpoints in PostgreSQL)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from channels.base import Inbound
from gateway.store.entries import JournalKind, JournalState
from gateway.store.journal import Store
from gateway.store.schema import SCHEMA_VERSION, user_version
from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram


def _msg(mid: str, text: str = "hi", chat: str = "1", user: str = "9") -> Inbound:
    return Inbound(
        platform="telegram", chat_id=chat, message_id=mid, sender_id=user, text=text,
        is_direct=True, addressed=True,
    )  # fmt: skip


async def test_journal_outbox_threads_behave_the_same(either_store: Store) -> None:
    odd = _msg("5", "quote ' question ? percent % and user")
    assert await either_store.journal_add(odd, JournalKind.TURN)
    assert not await either_store.journal_add(odd, JournalKind.TURN)  # redelivery: the insert is the claim
    await either_store.journal_add(_msg("6", chat="2"), JournalKind.NOTICE, note="a note")
    await either_store.journal_set(odd.key, JournalState.RUNNING)
    await either_store.journal_set(odd.key, JournalState.RUNNING)
    await either_store.journal_retry(odd.key)
    open_ = await either_store.journal_open()
    assert [(e.key, e.state, e.attempts) for e in open_] == [
        (odd.key, JournalState.PENDING, 1),
        ("telegram:2:6", JournalState.PENDING, 0),
    ]
    assert open_[0].inbound.text == odd.text and open_[1].note == "a note"
    await either_store.outbox_put(odd.key, 0, "m1")
    await either_store.outbox_put(odd.key, 0, "m2")  # INSERT OR REPLACE
    await either_store.outbox_put(odd.key, 1, "m3")
    assert await either_store.outbox_get(odd.key) == {0: "m2", 1: "m3"}
    await either_store.files_add(odd.key, "/mnt/user-data/outputs/b", "")
    await either_store.files_add(odd.key, "/mnt/user-data/outputs/a", "cap")
    await either_store.files_add(odd.key, "/mnt/user-data/outputs/b", "again")  # once per path
    assert await either_store.files_get(odd.key) == [
        ("/mnt/user-data/outputs/b", ""),
        ("/mnt/user-data/outputs/a", "cap"),
    ]
    first = await either_store.thread_for("telegram:1")
    assert await either_store.thread_for("telegram:1") == first
    renewed = await either_store.new_thread("telegram:1", key="k-new")
    assert renewed != first and await either_store.new_thread("telegram:1", key="k-new") == renewed
    assert await either_store.thread_get("telegram:1") == renewed
    await either_store.journal_set(odd.key, JournalState.DONE)
    assert await either_store.journal_counts() == {"done": 1, "pending": 1}
    assert await either_store.journal_prune(-60) == 1  # finished entries go, open ones stay
    assert [e.key for e in await either_store.journal_open()] == ["telegram:2:6"]
    assert await either_store.outbox_get(odd.key) == {}


async def test_pairing_and_access_behave_the_same(either_store: Store) -> None:
    request, new = await either_store.pairing_request("telegram:77", "Zoë", "77", ttl=3600, max_pending=10)
    assert new
    again, new_again = await either_store.pairing_request(
        "telegram:77", "Zoë", "77", ttl=3600, max_pending=10
    )
    assert not new_again and again.code == request.code
    assert [r.user for r in await either_store.pairing_list()] == ["telegram:77"]
    assert await either_store.pairing_approve(request.code) == "telegram:77"
    assert await either_store.is_approved("telegram:77")
    assert [u for u, _ in await either_store.approved_list()] == ["telegram:77"]
    assert await either_store.revoke("telegram:77")
    assert not await either_store.is_approved("telegram:77")


async def test_schema_is_current_and_two_daemons_migrate_at_once(pg_url: str) -> None:
    first, second = await asyncio.gather(Store.open_postgres(pg_url), Store.open_postgres(pg_url))
    try:
        assert await user_version(first._db) == SCHEMA_VERSION
        await first.journal_add(_msg("1"), JournalKind.TURN)
        assert [e.key for e in await second.journal_open()] == ["telegram:1:1"]
    finally:
        await first.close()
        await second.close()


async def test_password_never_in_the_startup_error(tmp_path: Path, model: FakeOpenAI) -> None:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["storage"]["url"] = f"postgresql://chital:hunter2-secret@127.0.0.1:{free_port()}/nowhere"
    d = DaemonProcess(tmp_path, cfg)
    with pytest.raises(Exception):  # noqa: B017 - the daemon exits; how the wait fails is not the point
        await d.start(timeout=20)
    assert await d.wait_exit(20) == 1
    log = d.log_path.read_text()
    assert "cannot open the database postgresql://chital:***@127.0.0.1" in log, log[-2000:]
    assert "hunter2" not in log


def _telegram(cfg: dict[str, Any], tg: FakeTelegram) -> None:
    cfg["channels"]["telegram"] = tg.channel_settings(poll_timeout=1)
    cfg["access"] = {"allow_users": ["*"], "pairing": False}


async def test_daemon_on_postgres_answers_and_keeps_the_thread_across_a_restart(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    cfg = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["storage"]["url"] = pg_url
    _telegram(cfg, tg)
    d = DaemonProcess(tmp_path, cfg)
    await d.start()
    try:
        up = tg.inject_message(501, 501, "remember the word aubergine")
        await tg.wait_for(
            lambda: any(m.reply_to == up["message"]["message_id"] for m in tg.bot_messages(501)) or None,
            timeout=30, what="first answer",
        )  # fmt: skip
        assert not (tmp_path / "data" / "gateway.sqlite").exists()
        assert not (tmp_path / "data" / "checkpoints.sqlite").exists()
        await d.terminate()
        await d.start()
        model.requests.clear()
        up = tg.inject_message(501, 501, "which word?")
        await tg.wait_for(
            lambda: any(m.reply_to == up["message"]["message_id"] for m in tg.bot_messages(501)) or None,
            timeout=30, what="second answer",
        )  # fmt: skip
        chats = [r for r in model.requests if "which word?" in str(r.get("messages"))]
        assert chats and "aubergine" in str(chats[0]["messages"]), "the thread's history came from PostgreSQL"
        texts = tg.bot_texts(501)
        assert texts.count("echo: which word?") == 1 and texts.count("echo: remember the word aubergine") == 1
    finally:
        await d.close()
