"""Spoken replies end to end (docs/speech.md): `chital run` with the real SDKs against the fakes,
the fake OpenAI server's ``/audio/speech`` answering real Ogg Opus or MP3.

What the user sees (the text answer, a voice message or audio file, a note when speech fails),
what the speech service received (the answer's plain text, no secrets, bounded), and that a
restart in the middle neither loses nor doubles the voice message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.gateway_rig import daemon_rows, turns_settled
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI, Heard, Reply, Spoken
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.fakes.telegram_wire import Seen

TG_USER = 1001
SLACK_USER, SLACK_DM = "U_FRIEND", "D_FRIEND"
SPEECH_KEY = "sk-speech-Zq81MfNw0cVb6YtR"
MODEL_KEY = "sk-test-key-never-logged"  # the chat model's key in tests/daemon.py's base config
OGG_IN = b"OggS\x00\x02" + bytes(range(256)) * 4  # the user's voice note: stored, never decoded


def speech_section(model: FakeOpenAI, **extra: Any) -> dict[str, Any]:
    return {"base_url": model.base_url, "api_key": SPEECH_KEY, "model": "tts-test", "voice": "nova",
            "timeout": 3, "retries": 0, **extra}  # fmt: skip


@pytest.fixture
async def tg_speaking(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> AsyncIterator[DaemonProcess]:
    cfg = chat_config(
        tmp_path,
        model.base_url,
        tg,
        allow=[f"telegram:{TG_USER}"],
        agent={"tools": False},
        transcription={"base_url": model.base_url, "model": "whisper-test", "retries": 0},
        speech=speech_section(model, max_bytes=64 * 1024, max_chars=300),
    )
    async with started_daemon(tmp_path, cfg) as d:
        yield d


async def tg_say(tg: FakeTelegram, text: str = "", *, voice: bytes | None = None) -> int:
    """The user's message id."""
    up = tg.inject_message(TG_USER, TG_USER, text, voice=tg.add_voice(voice) if voice else None)
    return int(up["message"]["message_id"])


async def tg_answer(tg: FakeTelegram, mid: int, needle: str) -> str:
    def check() -> str | None:
        texts = [m.text for m in tg.bot_messages(TG_USER) if m.reply_to == mid]
        return next((t for t in texts if needle in t), None)

    return await tg.wait_for(check, timeout=30, what=f"telegram reply with {needle!r}")


def voices(tg: FakeTelegram) -> list[Seen]:
    return [m for m in tg.bot_messages(TG_USER) if "voice" in m.raw]


async def settled(daemon: DaemonProcess, tg: FakeTelegram, mid: int) -> list[Seen]:
    """The bot's messages replying to ``mid`` once no turn is open (a turn is marked done after
    its voice message), so a voice that would wrongly follow has had its chance."""
    await tg.wait_for(
        lambda: any(m.reply_to == mid for m in tg.bot_messages(TG_USER)) or None, timeout=30, what="a reply"
    )
    await turns_settled(daemon.config["storage"], timeout=30)
    return [m for m in tg.bot_messages(TG_USER) if m.reply_to == mid]


# -- Telegram: a voice note in, text and a voice message out ---------------------------------------------


async def test_a_voice_note_is_answered_in_text_and_as_a_telegram_voice_message(
    tg_speaking: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    mid = await tg_say(tg, "/voice")
    assert "Voice is off here" in await tg_answer(tg, mid, "Voice")
    mid = await tg_say(tg, "/voice on")
    assert "Voice on" in await tg_answer(tg, mid, "Voice on")

    model.heard.append(Heard("what is the weather like"))
    mid = await tg_say(tg, voice=OGG_IN)
    await tg_answer(tg, mid, "echo:")
    spoken = await tg.wait_for(lambda: voices(tg) or None, timeout=30, what="a voice message")
    assert len(spoken) == 1 and spoken[0].reply_to == mid and spoken[0].chat_id == TG_USER
    data = tg.file_bytes(spoken[0].raw["voice"]["file_id"])
    assert data.startswith(b"OggS") and b"OpusHead" in data[:64], "an OGG/Opus voice note"
    (call,) = model.speech
    assert call["response_format"] == "opus" and call["model"] == "tts-test" and call["voice"] == "nova"
    assert call["authorization"] == f"Bearer {SPEECH_KEY}"
    assert "what is the weather like" in call["input"] and "echo" in call["input"]

    # `on` speaks answers to voice notes only: a typed message gets text alone.
    mid = await tg_say(tg, "just typing")
    replies = await settled(tg_speaking, tg, mid)
    assert [m.text for m in replies] == ["echo: just typing"] and len(model.speech) == 1

    # `off`: a voice note gets text alone, and the setting outlives the command's own turn.
    mid = await tg_say(tg, "/voice off")
    await tg_answer(tg, mid, "Voice off")
    model.heard.append(Heard("and tomorrow"))
    mid = await tg_say(tg, voice=OGG_IN)
    replies = await settled(tg_speaking, tg, mid)
    assert len(replies) == 1 and "and tomorrow" in replies[0].text
    assert len(voices(tg)) == 1 and len(model.speech) == 1


async def test_an_unknown_voice_mode_is_named_and_refused(
    tg_speaking: DaemonProcess, tg: FakeTelegram
) -> None:
    mid = await tg_say(tg, "/voice loud[x](http://evil.example)")
    reply = await tg_answer(tg, mid, "not a voice mode")
    assert "Use /voice on, /voice all or /voice off" in reply
    assert "http://evil.example" not in [e.get("url") for m in tg.bot_messages(TG_USER) for e in m.entities]


# -- failures: the text stays, a short specific note -----------------------------------------------------

FAILURES = [
    (
        Spoken(status=500, error_body=f"boom: upstream said {SPEECH_KEY}"),
        "the speech service failed (HTTP 500)",
    ),
    (Spoken(status=401), "the speech service refused my key"),
    (Spoken(raw=b"<html>gateway error</html>", content_type="audio/ogg"), "not opus audio"),
    (Spoken(raw=b'{"error": "quota"}', content_type="application/json"), "text instead of audio"),
    (Spoken(raw=b""), "sent back no audio"),
    (Spoken(raw=b"OggS\x00\x02OpusHead" + bytes(200_000)), "more than 64 KB of audio"),
    (Spoken(delay=8), "did not answer in time (within 3 s)"),
]


async def test_a_failing_speech_service_leaves_the_text_and_says_why(
    tg_speaking: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    mid = await tg_say(tg, "/voice all")
    await tg_answer(tg, mid, "Voice all")
    for n, (failure, reason) in enumerate(FAILURES):
        model.spoken.append(failure)
        mid = await tg_say(tg, f"question {n}")
        await tg_answer(tg, mid, f"echo: question {n}")
        note = await tg_answer(tg, mid, "couldn't speak this answer")
        assert note.startswith("(couldn't speak this answer: ") and reason in note, note
    assert not voices(tg), "no broken audio was passed on"
    seen = "\n".join(m.text for m in tg.bot_messages(TG_USER))
    assert "boom" not in seen and SPEECH_KEY not in seen and "quota" not in seen
    assert SPEECH_KEY not in tg_speaking.logs()
    metrics = await tg_speaking.metrics()
    assert f'chital_speech_total{{outcome="failed"}} {float(len(FAILURES))}' in metrics


# -- what the speech service gets -------------------------------------------------------------------------


async def test_the_speech_service_gets_plain_text_without_secrets_and_bounded(
    tg_speaking: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    mid = await tg_say(tg, "/voice all")
    await tg_answer(tg, mid, "Voice all")
    answer = (
        f"## Done\nThe **bot token** is {tg.token} and the speech key {SPEECH_KEY}, the model's `{MODEL_KEY}`.\n"
        "See [the docs](https://example.com/docs) or https://example.com/raw.\n"
        "```python\nprint('secret code')\n```\n| a | b |\n"
    )
    model.script(Reply(text=answer))
    mid = await tg_say(tg, "tell me the secrets")
    await tg_answer(tg, mid, "Done")
    await tg.wait_for(lambda: voices(tg) or None, timeout=30, what="a voice message")
    said = model.speech[-1]["input"]
    assert tg.token not in said and SPEECH_KEY not in said and MODEL_KEY not in said
    assert tg.token.split(":")[1] not in said, "no part of the token either"
    assert "print(" not in said and "(code shown in the text)" in said
    assert "the docs" in said and "https://" not in said and "**" not in said and "##" not in said

    model.script(Reply(text="A long story. " * 2000))  # 28,000 characters
    mid = await tg_say(tg, "a long one")
    await tg_answer(tg, mid, "A long story.")
    await tg.wait_for(lambda: len(voices(tg)) == 2 or None, timeout=30, what="the second voice")
    said = model.speech[-1]["input"]
    assert len(said) <= 300 and said.endswith("The rest is in the text.")


# -- Slack: /voice all as a slash command, an audio file upload -------------------------------------------


async def test_slack_voice_all_uploads_the_answer_as_an_audio_file(
    tmp_path: Path, model: FakeOpenAI, slack: FakeSlack
) -> None:
    cfg = chat_config(
        tmp_path, model.base_url, slack, allow=[f"slack:{SLACK_USER}"], agent={"tools": False},
        speech=speech_section(model),
    )  # fmt: skip
    async with started_daemon(tmp_path, cfg, slack):
        await slack.inject_slash(SLACK_DM, SLACK_USER, "/voice", "all")
        await slack.wait_for(lambda: any("Voice all" in t for t in slack.texts(SLACK_DM)) or None, timeout=30)
        await slack.inject_dm(SLACK_DM, SLACK_USER, "hello there")
        await slack.wait_for(lambda: any("echo: hello there" in t for t in slack.texts(SLACK_DM)) or None,
                             timeout=30)  # fmt: skip
        upload = await slack.wait_for(lambda: next(iter(slack.uploads), None), timeout=30)
        assert upload.name == "answer.mp3" and upload.channel == SLACK_DM
        assert upload.content[:2] == b"\xff\xfb", "MPEG audio frames"
        assert model.speech[-1]["response_format"] == "mp3"
        assert "echo: hello there" in model.speech[-1]["input"]

        await slack.inject_slash(SLACK_DM, SLACK_USER, "/voice", "off")
        await slack.wait_for(lambda: any("Voice off" in t for t in slack.texts(SLACK_DM)) or None, timeout=30)
        await slack.inject_dm(SLACK_DM, SLACK_USER, "quiet now")
        await slack.wait_for(lambda: any("echo: quiet now" in t for t in slack.texts(SLACK_DM)) or None,
                             timeout=30)  # fmt: skip
        await asyncio.sleep(1.0)  # a wrong upload would follow the text at once
        assert len(slack.uploads) == 1 and len(model.speech) == 1


# -- not configured ------------------------------------------------------------------------------------


async def test_without_a_speech_section_voice_says_so(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[f"telegram:{TG_USER}"], agent={"tools": False})
    async with started_daemon(tmp_path, cfg):
        mid = await tg_say(tg, "/voice on")
        reply = await tg_answer(tg, mid, "not set up")
        assert "no speech service in its config" in reply and "docs/speech.md" in reply


# -- kill -9 while the audio is on its way ------------------------------------------------------------


async def test_kill9_while_speaking_gives_exactly_one_voice_message(
    tg_speaking: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    mid = await tg_say(tg, "/voice all")
    await tg_answer(tg, mid, "Voice all")
    gate = asyncio.Event()
    model.spoken.append(Spoken(gate=gate))
    mid = await tg_say(tg, "speak slowly")
    await tg_answer(tg, mid, "echo: speak slowly")
    await tg.wait_for(lambda: model.speech or None, timeout=30, what="the speech request")
    tg_speaking.kill9()
    await tg_speaking.wait_exit()
    gate.set()  # the held answer goes to a dead connection
    await tg_speaking.start()
    await tg.wait_for(lambda: voices(tg) or None, timeout=45, what="the voice after the restart")
    replies = await settled(tg_speaking, tg, mid)
    assert len([m for m in replies if "voice" in m.raw]) == 1
    assert len([m for m in replies if "echo: speak slowly" in m.text]) == 1, "the text was not sent again"
    assert len(model.speech) == 2, "the resumed turn asked for the audio again (the first was lost)"


# -- Lark: a native audio message; Discord: an audio file -------------------------------------------------

LARK_USER, LARK_P2P = "ou_friend", "oc_p2p_friend"
DC_USER = "424242424242424242"


async def test_lark_gets_an_audio_message_and_discord_an_audio_file(
    tmp_path: Path, model: FakeOpenAI, lark: FakeLark, dc: FakeDiscord
) -> None:
    cfg = chat_config(
        tmp_path, model.base_url, lark, dc, allow=[f"lark:{LARK_USER}", f"discord:{DC_USER}"],
        agent={"tools": False}, speech=speech_section(model, file_format="opus"),
    )  # fmt: skip
    async with started_daemon(tmp_path, cfg, dc):
        lark.inject_message(LARK_P2P, LARK_USER, "/voice all")
        await lark.wait_for_async(lambda f: any("Voice all" in m.text for m in f.bot_messages()) or None, 30)
        inj = lark.inject_message(LARK_P2P, LARK_USER, "hello lark")
        audio = await lark.wait_for_async(
            lambda f: next((m for m in f.bot_messages() if m.msg_type == "audio"), None), 30
        )
        assert audio.parent_id == inj.message_id and audio.chat_id == LARK_P2P
        key = json.loads(audio.content)["file_key"]
        name, data = lark.uploads[key]
        assert name == "answer.ogg" and data.startswith(b"OggS") and b"OpusHead" in data[:64]
        fields = lark.upload_fields[key]
        assert fields["file_type"] == "opus" and int(fields["duration"]) == 1000, fields
        assert any("echo: hello lark" in m.text for m in lark.bot_messages()), "the text came too"
        assert model.speech[-1]["response_format"] == "opus"

        await dc.inject_dm(DC_USER, "/voice all")
        await dc.wait_for(
            lambda: any("Voice all" in m.content for m in dc.bot_messages()) or None, timeout=30
        )
        mid = await dc.inject_dm(DC_USER, "hello discord")
        posted = await dc.wait_for(
            lambda: next((m for m in dc.bot_messages() if m.reply_to == mid and m.files), None), timeout=30
        )
        ((name, data),) = posted.files
        assert name == "answer.ogg" and data.startswith(b"OggS")
        assert any(m.reply_to == mid and "echo: hello discord" in m.content for m in dc.bot_messages())


async def test_a_telegram_user_who_refuses_voice_messages_gets_the_audio_as_a_file(
    tg_speaking: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    tg.voice_forbidden.add(TG_USER)
    mid = await tg_say(tg, "/voice all")
    await tg_answer(tg, mid, "Voice all")
    mid = await tg_say(tg, "private person")
    replies = await settled(tg_speaking, tg, mid)
    (doc,) = [m for m in replies if m.document]
    assert doc.document is not None and doc.document["file_name"] == "answer.ogg"
    assert tg.file_bytes(doc.document["file_id"]).startswith(b"OggS")
    assert not voices(tg) and not any("couldn't speak" in m.text for m in replies)


# -- budgets ------------------------------------------------------------------------------------------


async def test_an_answer_that_spends_the_budget_is_not_spoken(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    cfg = chat_config(
        tmp_path, model.base_url, tg, allow=[f"telegram:{TG_USER}"], agent={"tools": False},
        speech=speech_section(model), usage={"daily_tokens": 20_000, "reserve_output_tokens": 100},
    )  # fmt: skip
    async with started_daemon(tmp_path, cfg) as daemon:
        mid = await tg_say(tg, "/voice all")
        await tg_answer(tg, mid, "Voice all")
        model.script(Reply(text="an expensive answer", usage=(30_000, 10)))
        mid = await tg_say(tg, "spend it all")
        await tg_answer(tg, mid, "an expensive answer")
        note = await tg_answer(tg, mid, "couldn't speak")
        assert note == "(couldn't speak this answer: your daily budget is used up)"
        await turns_settled(daemon.config["storage"], timeout=30)
        assert not model.speech and not voices(tg), "no call to the speech service"


# -- who may switch it: an admin in a group, anyone in their own chat, a stranger gets pairing only ----

ADMIN, MEMBER, STRANGER, GROUP = 4001, 4002, 6666, -100500777


@pytest.fixture
async def tg_group(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> AsyncIterator[DaemonProcess]:
    cfg = chat_config(
        tmp_path,
        model.base_url,
        tg,
        allow=[str(MEMBER)],
        agent={"tools": False},
        speech=speech_section(model),
    )
    cfg["access"].update(admins=[str(ADMIN)], pairing=True, group_policy="mention")
    async with started_daemon(tmp_path, cfg) as d:
        yield d


async def tg_command(tg: FakeTelegram, chat: int, user: int, line: str, needle: str) -> str:
    """Send ``/name args`` as ``user`` in ``chat``; the bot's reply to it that shows ``needle``."""
    name, _, args = line[1:].partition(" ")
    kind = "private" if chat == user else "supergroup"
    up = tg.inject_command(chat, user, name, args, chat_type=kind, at=None if kind == "private" else "")
    mid = int(up["message"]["message_id"])

    def check() -> str | None:
        return next((m.text for m in tg.bot_messages(chat) if m.reply_to == mid and needle in m.text), None)

    return await tg.wait_for(check, timeout=30, what=f"reply with {needle!r}")


async def test_in_a_group_only_an_admin_switches_voice_and_a_stranger_gets_pairing_only(
    tg_group: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    refusal = await tg_command(tg, GROUP, MEMBER, "/voice all", "Only an admin")
    assert "Voice all" not in refusal
    assert "Voice is off here" in await tg_command(tg, GROUP, MEMBER, "/voice", "Voice")
    assert "Voice all" in await tg_command(tg, GROUP, ADMIN, "/voice all", "Voice all")
    assert "Voice is all here" in await tg_command(tg, GROUP, MEMBER, "/voice", "Voice")
    # In their own chat a member decides for themselves.
    assert "Voice on" in await tg_command(tg, MEMBER, MEMBER, "/voice on", "Voice on")

    pairing = await tg_command(tg, STRANGER, STRANGER, "/voice all", "pairing code")
    assert "Voice" not in pairing
    seen = [m.text for m in tg.bot_messages(STRANGER)]
    assert not any("Voice" in t or "voice mode" in t for t in seen), seen
    rows = await asyncio.to_thread(
        daemon_rows, tg_group.config["storage"], "SELECT conversation, mode, user FROM conversation_voice", ()
    )
    assert sorted(r[2] for r in rows) == [f"telegram:{ADMIN}", f"telegram:{MEMBER}"], rows
    assert model.speech == []


async def test_voice_arguments_with_bidi_and_mentions_are_echoed_inert(
    tg_speaking: DaemonProcess, tg: FakeTelegram
) -> None:
    mid = await tg_say(tg, "/voice \u202eno\u200b @everyone")
    reply = await tg_answer(tg, mid, "not a voice mode")
    assert "\u202e" not in reply and "\u200b" not in reply
    (shown,) = [m for m in tg.bot_messages(TG_USER) if m.reply_to == mid]
    assert not [e for e in shown.entities if e.get("type") in ("mention", "text_link", "url")]


async def test_a_user_over_the_daily_speech_allowance_gets_text_and_a_note(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    """``/voice all`` and a stream of long answers cannot spend the operator's speech money
    unbounded: past ``daily_chars_per_user`` the answer comes as text with a note, and nothing
    more reaches the speech service."""
    cfg = chat_config(
        tmp_path, model.base_url, tg, allow=[f"telegram:{TG_USER}"], agent={"tools": False},
        speech=speech_section(model, daily_chars_per_user=60),
    )  # fmt: skip
    async with started_daemon(tmp_path, cfg):
        mid = await tg_say(tg, "/voice all")
        await tg_answer(tg, mid, "Voice all")
        model.add_rule(lambda t: t.endswith("first"), Reply(text="A" * 40 + "."))
        model.add_rule(lambda t: t.endswith("second"), Reply(text="B" * 40 + "."))
        mid = await tg_say(tg, "first")
        await tg.wait_for(lambda: voices(tg) or None, timeout=30, what="the first voice")
        mid = await tg_say(tg, "second")
        note = await tg_answer(tg, mid, "couldn't speak this answer")
        assert "60 characters spoken today" in note and "voice is back tomorrow" in note, note
        assert any(m.text.startswith("BBBB") for m in tg.bot_messages(TG_USER)), "the text came"
        assert len(model.speech) == 1 and len(voices(tg)) == 1


async def test_answers_in_many_chats_at_once_are_spoken_at_most_concurrency_at_a_time(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    """Six chats answered at once with a stalled speech service: every text answer goes out, at
    most ``concurrency`` (2) calls reach the service, and each chat gets its one voice once the
    service answers."""
    users = [5001 + n for n in range(6)]
    cfg = chat_config(
        tmp_path, model.base_url, tg, allow=[f"telegram:{u}" for u in users], agent={"tools": False},
        speech=speech_section(model, concurrency=2, timeout=60),
    )  # fmt: skip
    stalled = asyncio.Event()
    async with started_daemon(tmp_path, cfg):
        for user in users:
            tg.inject_command(user, user, "voice", "all", chat_type="private", at=None)
        await tg.wait_for(
            lambda: all(any("Voice all" in m.text for m in tg.bot_messages(u)) for u in users) or None,
            timeout=30, what="/voice all in every chat",
        )  # fmt: skip
        model.spoken.extend(Spoken(gate=stalled) for _ in users)
        for user in users:
            tg.inject_message(user, user, f"question from {user}")
        await tg.wait_for(
            lambda: all(any(f"echo: question from {u}" in m.text for m in tg.bot_messages(u)) for u in users)
            or None,
            timeout=30, what="every text answer while speech is stalled",
        )  # fmt: skip
        await tg.wait_for(lambda: len(model.speech) >= 2 or None, timeout=30, what="two speech calls")
        assert len(model.speech) == 2, "more calls than speech.concurrency reached the service"
        stalled.set()
        for user in users:
            await tg.wait_for(
                lambda u=user: [m for m in tg.bot_messages(u) if "voice" in m.raw] or None,  # type: ignore[misc]
                timeout=30, what=f"the voice for {user}",
            )  # fmt: skip
        assert len(model.speech) == len(users)
        assert all(len([m for m in tg.bot_messages(u) if "voice" in m.raw]) == 1 for u in users)


async def test_a_failed_or_stopped_turn_is_not_spoken(
    tg_speaking: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    """Only answers are spoken: the error reply of a failed turn and a turn stopped halfway get no
    voice and reach no speech service; the next real answer does."""
    mid = await tg_say(tg, "/voice all")
    await tg_answer(tg, mid, "Voice all")
    model.add_rule(lambda t: "BROKEN" in t, Reply(status=400, error_message="bad request"))
    mid = await tg_say(tg, "BROKEN please")
    replies = await settled(tg_speaking, tg, mid)
    assert replies and not any("couldn't speak" in m.text for m in replies)

    held = asyncio.Event()
    model.add_rule(lambda t: "HELD" in t, Reply(text="half an answer that never finishes", hold=held))
    mid = await tg_say(tg, "HELD on")
    await tg.wait_for(lambda: any("HELD" in str(r) for r in model.requests) or None, what="the held call")
    stop = await tg_say(tg, "/stop")
    await tg_answer(tg, stop, "Stopping")
    await tg_answer(tg, mid, "Stopped")
    held.set()
    await settled(tg_speaking, tg, mid)
    assert model.speech == [] and not voices(tg)

    mid = await tg_say(tg, "a real question")
    await tg.wait_for(lambda: voices(tg) or None, timeout=30, what="the voice of a real answer")
    assert len(model.speech) == 1 and "a real question" in model.speech[0]["input"]


async def test_stop_while_the_voice_is_made_cuts_it_and_keeps_the_text(
    tg_speaking: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    """The answer's text is out and cannot be stopped any more; its spoken version, still being
    made (the speech service holding the call), is what /stop cuts: no voice arrives later."""
    mid = await tg_say(tg, "/voice all")
    await tg_answer(tg, mid, "Voice all")
    gate = asyncio.Event()
    model.spoken.append(Spoken(gate=gate))
    mid = await tg_say(tg, "a long answer to hear")
    await tg_answer(tg, mid, "echo: a long answer to hear")
    await tg.wait_for(lambda: model.speech or None, timeout=30, what="the speech request")
    stop = await tg_say(tg, "/stop")
    assert "Stopped the spoken version" in await tg_answer(tg, stop, "Stopped")
    assert await tg_answer(tg, mid, "spoken version was stopped") == "(the spoken version was stopped)"
    gate.set()  # the service answers after all: its audio goes nowhere
    replies = await settled(tg_speaking, tg, mid)
    assert not voices(tg) and len([m for m in replies if "echo:" in m.text]) == 1
    assert 'chital_speech_total{outcome="stopped"} 1.0' in await tg_speaking.metrics()
    # The next answer is spoken as usual (the slot the stopped one held is free again).
    mid = await tg_say(tg, "and now speak")
    await tg.wait_for(lambda: voices(tg) or None, timeout=30, what="the next answer's voice")
    # /stop with nothing being made says so, as before.
    stop = await tg_say(tg, "/stop")
    assert "Stopped the spoken version" not in await tg_answer(tg, stop, "")
