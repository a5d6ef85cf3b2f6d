"""A slow or broken transcriber: other users are still answered, and the user reads what went wrong.

`chital run` with the Telegram SDK against its fake; the fake model server also plays the
OpenAI-compatible ``/audio/transcriptions`` (tests/fakes/openai_server.py), stalled on a gate the
test releases, or answering broken JSON, an HTTP error, nothing, or far too much
(docs/media.md, "Fair transcription" and the table of notes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI, Heard
from tests.fakes.telegram_server import FakeTelegram

A, B, C = 4101, 4102, 4103
GROUP = -100555
OGG = b"OggS\x00\x02" + bytes(range(256)) * 8
GENERIC = "Something went wrong on my side"


def config(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, **transcription: Any) -> dict[str, Any]:
    cfg = chat_config(
        tmp_path,
        model.base_url,
        tg,
        allow=[f"telegram:{u}" for u in (A, B, C)],
        agent={"tools": False},
        concurrency={"max_turns": 2},  # fewer slots than stalled recordings
        transcription={"base_url": model.base_url, "model": "whisper-test", "retries": 0, **transcription},
    )
    cfg["access"]["allow_chats"] = [f"telegram:{GROUP}"]
    return cfg


@pytest.fixture
async def daemon(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> AsyncIterator[DaemonProcess]:
    cfg = config(tmp_path, model, tg, timeout=120, concurrency=4, per_user=1)
    async with started_daemon(tmp_path, cfg) as d:
        yield d


def answer(tg: FakeTelegram, chat: int, update: dict[str, Any], needle: str = "echo:") -> str | None:
    mid = update["message"]["message_id"]
    return next((m.text for m in tg.bot_messages(chat) if m.reply_to == mid and needle in m.text), None)


async def test_a_stalled_transcriber_holds_no_turn_slot_and_one_user_waits_behind_themself(
    daemon: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    gate = asyncio.Event()
    # Calls reach the fake in this order only if one user has one transcription at a time: A's
    # first (stalled), then C's; A's other seven follow once the gate opens.
    model.heard.extend([Heard("words of A", gate=gate), Heard("words of C"), *[Heard("words of A")] * 7])
    notes = [
        tg.inject_mention(
            GROUP, A, f"note {n}", voice=tg.add_voice(OGG), message_thread_id=100 + n, is_topic=True
        )
        for n in range(8)
    ]  # eight forum topics: eight conversations, all A's
    await tg.wait_for(lambda: len(model.transcriptions) >= 1, timeout=30, what="A's first recording sent")

    text = tg.inject_message(B, B, "a one-line question from B")
    reply = await tg.wait_for(lambda: answer(tg, B, text), timeout=30, what="B's answer")
    assert reply is not None and "a one-line question from B" in reply
    assert not any(answer(tg, GROUP, n) for n in notes), "A's notes are all still waiting"

    voice = tg.inject_message(C, C, "", voice=tg.add_voice(OGG))
    heard_c = await tg.wait_for(lambda: answer(tg, C, voice), timeout=30, what="C's voice answer")
    assert heard_c is not None and "words of C" in heard_c, "C was not queued behind A's pile of recordings"
    assert len(model.transcriptions) == 2, "A had one recording at the transcriber, never more"
    assert not any(answer(tg, GROUP, n) for n in notes)

    gate.set()
    for n in notes:
        got = await tg.wait_for(lambda n=n: answer(tg, GROUP, n), timeout=60, what="A's answers")  # type: ignore[misc]
        assert got is not None and "words of A" in got and GENERIC not in got
    assert len(model.transcriptions) == 9


@pytest.fixture
async def quick_daemon(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> AsyncIterator[DaemonProcess]:
    d = DaemonProcess(tmp_path, config(tmp_path, model, tg, timeout=2))
    await d.start()
    yield d
    await d.close()


@pytest.mark.parametrize(
    ("answer_", "note"),
    [
        (Heard(raw=b'{"text": "unterminated'), "not valid JSON"),
        (Heard(raw=b"<html>502 Bad Gateway</html>"), "not valid JSON"),
        (Heard(raw=b'{"transcript": "wrong field"}'), 'no "text" in its JSON'),
        (Heard(status=502), "the transcription service failed (HTTP 502)"),
        (Heard(status=401), "refused my key"),
        (Heard(status=400), "could not use this recording (HTTP 400)"),
        (Heard("late", delay=5), "did not answer in time (within 2 s)"),
        (Heard("   "), "the transcript came back empty"),
        (Heard(raw=b'{"text": "' + b"a" * (2 * 1024 * 1024) + b'"}'), "sent back more than 1024 KB"),
    ],
    ids=["broken-json", "html", "no-text", "http-502", "http-401", "http-400", "timeout", "empty", "huge"],
)
async def test_each_transcriber_failure_is_named_in_the_chat(
    quick_daemon: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram, answer_: Heard, note: str
) -> None:
    model.heard.append(answer_)
    up = tg.inject_message(A, A, "", voice=tg.add_voice(OGG))
    reply = await tg.wait_for(lambda: answer(tg, A, up), timeout=30, what="the answer")
    assert reply is not None and "⚠️ I could not transcribe voice_" in reply and note in reply, reply
    assert GENERIC not in reply and "The agent has it as a file" in reply


# -- in process: the slot a turn gives back is returned exactly ------------------------------------


async def test_a_released_slot_comes_back_exactly_even_when_stopped_while_waiting() -> None:
    """Two slots; a turn waiting on its transcription gives its slot back, so two other turns run;
    /stop while it waits for its slot again leaves the queue with exactly two slots."""
    from channels.base import Inbound
    from gateway.ops.metrics import Metrics
    from gateway.store.entries import JournalEntry, JournalKind
    from gateway.turns.queue import Stop, TurnQueue

    release_slow, hold_others = asyncio.Event(), asyncio.Event()
    running: set[str] = set()
    peak = 0
    queue: TurnQueue

    async def handler(entry: JournalEntry) -> None:
        nonlocal peak
        if entry.conversation.endswith("slow"):
            async with queue.released():
                await release_slow.wait()
        running.add(entry.key)
        peak = max(peak, len(running))
        try:
            await hold_others.wait()
        finally:
            running.discard(entry.key)

    def entry(chat: str) -> JournalEntry:
        inbound = Inbound("telegram", chat, "1", "u", "hi", is_direct=True, addressed=True)
        return JournalEntry.new(inbound, JournalKind.TURN)

    queue = TurnQueue(2, handler, Metrics())
    queue.submit(entry("slow"))
    await asyncio.sleep(0.05)
    queue.submit(entry("a"))
    queue.submit(entry("b"))
    for _ in range(100):
        if len(running) == 2:
            break
        await asyncio.sleep(0.02)
    assert running == {"telegram:a:1", "telegram:b:1"}, "the slow turn's slot went to the others"
    release_slow.set()  # it now waits for a slot again, behind a and b
    await asyncio.sleep(0.05)
    assert queue.stop("telegram:slow:1") is Stop.CANCELLED  # /stop names the message it stops
    hold_others.set()
    for _ in range(100):
        if queue.running_count == 0:
            break
        await asyncio.sleep(0.02)
    assert peak == 2 and queue.running_count == 0
    hold_others.clear()
    for chat in ("c", "d", "e"):
        queue.submit(entry(chat))
    for _ in range(100):
        if len(running) == 2:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.05)
    assert len(running) == 2, "exactly two slots: none leaked, none lost"
    hold_others.set()
    await queue.drain(1)
