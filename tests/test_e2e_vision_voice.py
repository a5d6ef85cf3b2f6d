"""Images and voice notes, end to end: `chital run` with all four real SDKs against their fakes.

A photo, a pasted screenshot or an image file reaches a model marked ``vision: true`` as an OpenAI
``image_url`` part, scaled within ``agent.vision``; a model without the flag gets the file's path
only. Voice notes and audio files go through the fake ``/audio/transcriptions`` and their text
reaches the model; without a transcriber, or when it fails, the user reads a note. The unit tests
at the end drive the same code in process (image preparation, fading old images, the journaled
transcript).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from PIL import Image

from agent.config import AgentSettings, ModelSpec, VisionSettings
from agent.harness import Harness
from agent.turn import ImagePart, TurnOptions
from agent.vision import carries_images, faded, human_content
from channels.base import Attachment
from gateway.config.sections import TranscriptionConfig
from gateway.intake.media import AUDIO, FILE, IMAGE, VOICE, NotAnImage, kind_of, prepare_image
from gateway.intake.transcribe import heard, upload_name
from tests.daemon import DaemonProcess, base_config, chat_config, free_port, started_daemon
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.gateway_rig import store_at
from tests.fakes.lark_server import FakeLark
from tests.fakes.openai_server import FakeOpenAI, Heard, Reply, last_user_text
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram

TG_USER = 1001
SLACK_USER, SLACK_DM = "U_FRIEND", "D_FRIEND"
DC_USER = "424242424242424242"
LARK_USER, LARK_P2P = "ou_friend", "oc_p2p_friend"
MAX_SIDE, MAX_BYTES = 512, 40_000
OGG = b"OggS\x00\x02" + bytes(range(256)) * 8  # the server only stores it; no decoder runs here


def photo_bytes(size: tuple[int, int] = (1200, 800), fmt: str = "JPEG") -> bytes:
    """A noisy picture (noise compresses badly, so the byte limit has work to do)."""
    out = io.BytesIO()
    Image.effect_noise(size, 50).convert("RGB").save(out, fmt, quality=95)
    return out.getvalue()


# Made once, before any fake runs: encoding takes a moment of CPU, and a fake server sharing the
# test's event loop that misses its pings for that long looks dead to the SDK (Slack's 0.5 s).
PHOTO, SCREENSHOT, CHART = photo_bytes(), photo_bytes(fmt="PNG"), photo_bytes(fmt="WEBP")


# -- the daemon with all four platforms ---------------------------------------------------------------


def four_platforms(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, slack: FakeSlack, dc: FakeDiscord, lark: FakeLark
) -> dict[str, Any]:
    cfg: dict[str, Any] = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["agent"]["tools"] = False  # a plain chat model: every model request is a user's turn
    cfg["agent"]["vision"] = {"max_side": MAX_SIDE, "max_bytes": MAX_BYTES}
    cfg["models"][0]["vision"] = True
    cfg["transcription"] = {
        "base_url": model.base_url,
        "api_key": "sk-whisper-key",
        "model": "whisper-test",
        "timeout": 2,
        "retries": 0,
        "show_transcript": True,
    }
    channels = cfg["channels"]
    channels["telegram"] = tg.channel_settings()
    channels["slack"] = slack.channel_settings()
    channels["discord"] = dc.channel_settings()
    channels["lark"] = lark.channel_settings()
    cfg["access"] = {
        "allow_users": [
            f"telegram:{TG_USER}",
            f"slack:{SLACK_USER}",
            f"discord:{DC_USER}",
            f"lark:{LARK_USER}",
        ]
    }
    return cfg


@pytest.fixture
async def daemon(
    tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram, slack: FakeSlack, dc: FakeDiscord, lark: FakeLark
) -> AsyncIterator[DaemonProcess]:
    async with started_daemon(tmp_path, four_platforms(tmp_path, model, tg, slack, dc, lark), slack, dc) as d:
        yield d


# -- what the user sees, what the model got -------------------------------------------------------------


async def tg_reply(tg: FakeTelegram, update: dict[str, Any], needle: str, timeout: float = 20) -> str:
    mid = update["message"]["message_id"]

    def check() -> str | None:
        texts = [m.text for m in tg.bot_messages(TG_USER) if m.reply_to == mid]
        return next((t for t in texts if needle in t), None)

    return await tg.wait_for(check, timeout=timeout, what=f"telegram reply with {needle!r}")


async def slack_reply(slack: FakeSlack, needle: str, timeout: float = 20) -> str:
    return await slack.wait_for(
        lambda: next((t for t in slack.texts(SLACK_DM) if needle in t), None), timeout=timeout
    )


async def dc_reply(dc: FakeDiscord, mid: str, needle: str, timeout: float = 20) -> str:
    def check() -> str | None:
        return next((m.content for m in dc.bot_messages() if m.reply_to == mid and needle in m.content), None)

    return await dc.wait_for(check, timeout=timeout)


async def lark_reply(lark: FakeLark, message_id: str, needle: str, timeout: float = 20) -> str:
    def check(fake: FakeLark) -> str | None:
        found = (m.text for m in fake.bot_messages() if m.parent_id == message_id and needle in m.text)
        return next(found, None)

    return await lark.wait_for_async(check, timeout=timeout)


def last_user(body: dict[str, Any]) -> Any:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


def user_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")


def images_in(content: Any) -> list[tuple[str, bytes]]:
    """(mime, bytes) of each ``image_url`` part of one message's content."""
    if isinstance(content, str):
        return []
    out = []
    for part in content:
        if part.get("type") == "image_url":
            head, _, data = part["image_url"]["url"].partition(",")
            assert head.startswith("data:image/") and head.endswith(";base64"), head
            out.append((head[5:-7], base64.b64decode(data)))
    return out


def request_naming(model: FakeOpenAI, needle: str) -> dict[str, Any]:
    """The latest model request whose user message (its text parts) mentions ``needle``."""
    found = [r for r in model.requests if needle in user_text(last_user(r))]
    assert found, f"no model request mentions {needle!r}"
    return found[-1]


def check_within_limits(mime: str, data: bytes) -> None:
    img = Image.open(io.BytesIO(data))
    assert mime == "image/jpeg" and img.format == "JPEG"
    assert max(img.size) <= MAX_SIDE and len(data) <= MAX_BYTES, (img.size, len(data))


# -- vision --------------------------------------------------------------------------------------------


async def test_an_image_from_every_platform_reaches_the_model_as_an_image_part(
    daemon: DaemonProcess,
    model: FakeOpenAI,
    tg: FakeTelegram,
    slack: FakeSlack,
    dc: FakeDiscord,
    lark: FakeLark,
) -> None:
    picture = PHOTO
    up = tg.inject_message(TG_USER, TG_USER, "what is on this photo?", photo=tg.add_photo(picture))
    await tg_reply(tg, up, "echo: what is on this photo?")
    await slack.inject_dm(SLACK_DM, SLACK_USER, "my screenshot",
                          files=[slack.add_file("Screenshot 2026.png", SCREENSHOT, "image/png")])  # fmt: skip
    await slack_reply(slack, "echo: my screenshot")
    mid = await dc.inject_dm(DC_USER, "a chart", attachments=[("chart.webp", CHART, "image/webp")])
    await dc_reply(dc, mid, "echo: a chart")
    inj = lark.inject_file(LARK_P2P, LARK_USER, "image.png", picture, image=True)
    await lark_reply(lark, inj.message_id, "echo:")

    for needle in ("photo_", "Screenshot_2026.png", "chart.webp", "/image.png"):
        request = request_naming(model, needle)
        shown = images_in(last_user(request))
        assert len(shown) == 1, f"{needle}: {len(shown)} image parts"
        check_within_limits(*shown[0])
    # The original is in the agent's uploads, untouched.
    saved = list(daemon.sandbox_root.glob("**/uploads/photo_*.jpg"))
    assert saved and saved[0].read_bytes() == picture


async def test_a_non_image_dressed_as_one_is_a_plain_file_with_a_note(
    daemon: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    fake = tg.add_file(b"#!/bin/sh\necho not a picture\n", file_name="evil.png", mime_type="image/png")
    up = tg.inject_message(TG_USER, TG_USER, "look at this", document=fake)
    reply = await tg_reply(tg, up, "echo: look at this")
    assert "could not open evil.png as an image" in reply
    request = request_naming(model, "evil.png")
    assert images_in(last_user(request)) == [], "no image part for bytes that are not an image"
    assert "/mnt/user-data/uploads/evil.png" in user_text(last_user(request))
    # And the next turn of the same conversation is answered as usual.
    up = tg.inject_message(TG_USER, TG_USER, "still there?")
    await tg_reply(tg, up, "echo: still there?")


# -- voice ---------------------------------------------------------------------------------------------


async def test_a_voice_note_from_every_platform_is_transcribed_for_the_agent(
    daemon: DaemonProcess,
    model: FakeOpenAI,
    tg: FakeTelegram,
    slack: FakeSlack,
    dc: FakeDiscord,
    lark: FakeLark,
) -> None:
    model.heard.append(Heard("remind me about the dentist"))
    up = tg.inject_message(TG_USER, TG_USER, "", voice=tg.add_voice(OGG))
    reply = await tg_reply(tg, up, "echo:")
    assert reply.startswith("🎙 heard: remind me about the dentist")
    assert "remind me about the dentist" in reply.split("\n\n", 1)[1], "the transcript reached the model"

    model.heard.append(Heard("slack clip words"))
    clip = slack.add_file("audio_message.webm", OGG, "audio/webm", subtype="slack_audio")
    await slack.inject_dm(SLACK_DM, SLACK_USER, "", files=[clip])
    await slack_reply(slack, "echo: [Voice note audio_message.webm")
    assert any("heard: `slack clip words`" in t for t in slack.texts(SLACK_DM))

    model.heard.append(Heard("discord voice words"))
    mid = await dc.inject_dm(DC_USER, "", attachments=[("voice-message.ogg", OGG, "audio/ogg")], voice=True)
    reply = await dc_reply(dc, mid, "discord voice words")
    assert "heard" in reply

    model.heard.append(Heard("lark voice words"))
    inj = lark.inject_file(LARK_P2P, LARK_USER, "", OGG, audio=True)
    await lark_reply(lark, inj.message_id, "lark voice words")

    calls = model.transcriptions
    assert len(calls) == 4, [c["filename"] for c in calls]
    assert all(c["model"] == "whisper-test" and c["data"] == OGG for c in calls)
    assert all(c["authorization"] == "Bearer sk-whisper-key" for c in calls)
    assert calls[3]["filename"] == "audio.ogg", "Lark's .opus goes up under a name Whisper knows"
    text = user_text(last_user(request_naming(model, "lark voice words")))
    assert "transcribed automatically" in text
    assert "sk-whisper-key" not in daemon.logs()


async def test_transcription_failures_give_a_clear_note(
    daemon: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    for answer, note in (
        (Heard(status=500), "the transcription service failed (HTTP 500)"),
        (Heard(status=413), "the recording is too large for the transcription service"),
        (Heard("late", delay=4), "the transcription service did not answer in time"),
    ):
        model.heard.append(answer)
        up = tg.inject_message(TG_USER, TG_USER, "", voice=tg.add_voice(OGG))
        reply = await tg_reply(tg, up, "echo:")
        assert "⚠️ I could not transcribe voice_" in reply and note in reply, reply
        assert "The agent has it as a file" in reply


async def test_a_hostile_transcript_is_echoed_as_code_without_links_or_mentions(
    daemon: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram, slack: FakeSlack
) -> None:
    """What the transcriber says was said is text others chose: the "heard" line shows it as
    code, bounded, with no live link, mention or bidi override, on Telegram and Slack alike."""
    hostile = "[Verify your account](https://evil.example/login) <!channel> \u202egnp.exe " + "A" * 900
    model.heard.append(Heard(hostile))
    up = tg.inject_message(TG_USER, TG_USER, "", voice=tg.add_voice(OGG))
    await tg_reply(tg, up, "echo:")
    sent = next(m for m in tg.bot_messages(TG_USER) if m.reply_to == up["message"]["message_id"])
    heard_line = sent.text.split("\n", 1)[0]
    assert heard_line.startswith("🎙 heard: [Verify your account](https://evil.example/login)"), heard_line
    assert "\u202e" not in heard_line and heard_line.endswith("…") and len(heard_line) < 520
    kinds = {e["type"] for e in sent.entities if e["offset"] < len(heard_line)}  # not the echo below
    assert kinds == {"code"} and "text_link" not in kinds and "url" not in kinds, sent.entities

    model.heard.append(Heard(hostile))
    clip = slack.add_file("audio_message.webm", OGG, "audio/webm", subtype="slack_audio")
    await slack.inject_dm(SLACK_DM, SLACK_USER, "", files=[clip])
    echo = (await slack_reply(slack, "heard:")).split("\n", 1)[0]  # the fake model's echo follows
    assert "<!" not in echo and "<http" not in echo and "\u202e" not in echo, echo[:300]
    assert "heard: `[Verify your account](https://evil.example/login) &lt;!channel&gt;" in echo


# -- kill -9 mid-turn -------------------------------------------------------------------------------------


@pytest.fixture
async def tg_daemon(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> AsyncIterator[DaemonProcess]:
    """Telegram only, a vision model, the fake transcriber."""
    cfg = chat_config(
        tmp_path,
        model.base_url,
        tg,
        allow=[f"telegram:{TG_USER}"],
        agent={"tools": False},
        transcription={"base_url": model.base_url, "model": "whisper-test", "retries": 0},
    )
    cfg["models"][0]["vision"] = True
    async with started_daemon(tmp_path, cfg) as d:
        yield d


async def crash_mid_answer(daemon: DaemonProcess, model: FakeOpenAI, needle: str) -> dict[str, Any]:
    """Wait until the model streams the (slow) answer to the message naming ``needle``, kill -9 the
    daemon, and script the resumed answer; returns the request the model got before the kill."""
    deadline = asyncio.get_running_loop().time() + 40
    while not [r for r in model.requests if needle in user_text(last_user(r))]:
        assert asyncio.get_running_loop().time() < deadline, "the model never got the message"
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # the SLOW answer is streaming now
    daemon.kill9()
    await daemon.wait_exit()
    before = request_naming(model, needle)
    model.add_rule(lambda t: True, lambda body: Reply(text=f"resumed answer to {last_user_text(body)}"))
    model._rules.insert(0, model._rules.pop())  # before the SLOW rule, which must not fire again
    return before


async def test_kill9_mid_turn_resumes_with_the_same_image_and_one_transcription(
    tg_daemon: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    up = tg.inject_message(TG_USER, TG_USER, "SLOW describe it", photo=tg.add_photo(PHOTO))
    before = await crash_mid_answer(tg_daemon, model, "SLOW describe it")
    await tg_daemon.start()
    await tg_reply(tg, up, "resumed answer to SLOW describe it", timeout=45)
    after = request_naming(model, "SLOW describe it")
    assert after is not before
    assert last_user(after) == last_user(before), "the resumed turn sent the very same message"
    assert len(images_in(last_user(after))) == 1

    model.heard.append(Heard("call the plumber tomorrow"))
    up = tg.inject_message(TG_USER, TG_USER, "SLOW listen", voice=tg.add_voice(OGG))
    await crash_mid_answer(tg_daemon, model, "call the plumber tomorrow")
    await tg_daemon.start()
    reply = await tg_reply(tg, up, "resumed answer to SLOW listen", timeout=45)
    assert "call the plumber tomorrow" in reply
    assert len(model.transcriptions) == 1, "the journaled transcript served the resumed turn"
    assert len([m for m in tg.bot_messages(TG_USER) if m.reply_to == up["message"]["message_id"]]) == 1
    # Each file was saved once: the rerun found the upload it had recorded (no photo-2.jpg).
    uploads = sorted(p.name for p in tg_daemon.sandbox_root.glob("**/uploads/*"))
    assert len(uploads) == 2 and uploads[0].startswith("photo_") and uploads[1].startswith("voice_"), uploads


# -- a model without vision, no transcriber ------------------------------------------------------------


@pytest.fixture
async def plain_daemon(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> AsyncIterator[DaemonProcess]:
    cfg: dict[str, Any] = base_config(tmp_path / "data", model.base_url, free_port())
    cfg["agent"]["tools"] = False
    cfg["channels"]["telegram"] = tg.channel_settings()
    cfg["access"] = {"allow_users": [f"telegram:{TG_USER}"]}
    d = DaemonProcess(tmp_path, cfg)
    await d.start()
    yield d
    await d.close()


async def test_without_vision_or_transcriber_the_agent_gets_files_and_the_user_a_note(
    plain_daemon: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram
) -> None:
    up = tg.inject_message(TG_USER, TG_USER, "what is this?", photo=tg.add_photo(PHOTO))
    await tg_reply(tg, up, "echo: what is this?")
    request = request_naming(model, "what is this?")
    assert images_in(last_user(request)) == []
    assert "Attached files:\n- /mnt/user-data/uploads/photo_" in user_text(last_user(request))

    up = tg.inject_message(TG_USER, TG_USER, "", voice=tg.add_voice(OGG))
    reply = await tg_reply(tg, up, "no transcription service is configured")
    assert reply.startswith("🎙 I cannot listen to voice notes here")
    assert "echo: [Voice note voice_" in reply, "the agent still answered, told of the recording"
    assert model.transcriptions == []
    saved = list(plain_daemon.sandbox_root.glob("**/uploads/voice_*.ogg"))
    assert saved and saved[0].read_bytes() == OGG


# -- in process: the pieces ----------------------------------------------------------------------------


def test_prepare_image_scales_within_limits_and_is_deterministic() -> None:
    limits = VisionSettings(max_side=MAX_SIDE, max_bytes=MAX_BYTES)
    data = photo_bytes((2000, 800), "PNG")
    first = prepare_image(data, name="a.png", path="/u/a.png", limits=limits)
    check_within_limits(first.mime, first.data)
    assert Image.open(io.BytesIO(first.data)).size[0] == MAX_SIDE
    again = prepare_image(data, name="a.png", path="/u/a.png", limits=limits)
    assert again.data == first.data, "a resumed turn rebuilds the very same message"


def test_transparency_is_kept_as_png_when_it_fits() -> None:
    out = io.BytesIO()
    Image.new("RGBA", (300, 200), (255, 0, 0, 128)).save(out, "PNG")
    part = prepare_image(out.getvalue(), name="t.png", path="", limits=VisionSettings())
    assert part.mime == "image/png" and Image.open(io.BytesIO(part.data)).mode == "RGBA"


@pytest.mark.parametrize(
    "data",
    [
        b"<svg xmlns='http://www.w3.org/2000/svg'/>",
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 64,  # a PNG signature and nothing real after it
        b"GIF89a" + b"\xff" * 20,
    ],
)
def test_bytes_that_are_not_an_image_are_refused(data: bytes) -> None:
    with pytest.raises(NotAnImage):
        prepare_image(data, name="x.png", path="", limits=VisionSettings())


def test_a_decompression_bomb_is_never_decoded() -> None:
    out = io.BytesIO()
    Image.new("1", (12_000, 12_000)).save(out, "PNG")  # ~20 KB on disk, 144 M pixels
    assert len(out.getvalue()) < 100_000
    with pytest.raises(NotAnImage, match="pixels"):
        prepare_image(out.getvalue(), name="bomb.png", path="", limits=VisionSettings())


def test_kinds() -> None:
    assert kind_of(Attachment("1", "v.ogg", "audio/ogg", kind="voice")) == VOICE
    assert kind_of(Attachment("1", "shot.png", "image/png")) == IMAGE
    assert kind_of(Attachment("1", "shot.PNG", None)) == IMAGE
    assert kind_of(Attachment("1", "song.mp3", "application/octet-stream")) == AUDIO
    assert kind_of(Attachment("1", "logo.svg", "image/svg+xml")) == FILE
    assert kind_of(Attachment("1", "notes.txt", "text/plain")) == FILE
    assert upload_name("audio.opus") == "audio.ogg" and upload_name("clip.webm") == "clip.webm"


def test_images_fade_after_keep_turns() -> None:
    image = ImagePart("image/png", b"\x89PNG", name="p.png", path="/mnt/user-data/uploads/p.png")
    shown = HumanMessage(content=human_content("see", [image]), id="m1",
                         additional_kwargs={"images": [{"name": "p.png", "path": image.path}]})  # fmt: skip
    history = [shown, AIMessage("nice", id="a1"), HumanMessage("more?", id="m2"), AIMessage("sure", id="a2")]
    assert faded(history, keep_turns=3) == [], "m1 and m2 plus the new message: still within 3"
    (gone,) = faded(history, keep_turns=2)
    assert gone.id == "m1" and not carries_images(gone)
    assert isinstance(gone.content, str) and gone.content.startswith("see\n\n")
    assert "no longer attached" in gone.content and image.path in gone.content


async def test_harness_shows_images_then_replaces_them(tmp_path: Path, model: FakeOpenAI) -> None:
    spec = ModelSpec(name="default", model="fake-model", base_url=model.base_url, api_key="k", vision=True)
    settings = AgentSettings(tools=False, vision=VisionSettings(keep_turns=1))
    image = ImagePart("image/png", b"\x89PNG-bytes", name="p.png", path="/mnt/user-data/uploads/p.png")
    async with Harness(settings, spec, tmp_path / "cp.sqlite") as harness:
        events = [e async for e in harness.run("t1", user_id="u", message_id="m1", text="what is it",
                                               options=TurnOptions(images=(image,)))]  # fmt: skip
        assert events
        first = model.requests[-1]["messages"][-1]["content"]
        assert images_in(first) == [("image/png", b"\x89PNG-bytes")]
        _ = [e async for e in harness.run("t1", user_id="u", message_id="m2", text="and now?")]
        history = model.requests[-1]["messages"]
        assert not any(images_in(m["content"]) for m in history if m["role"] == "user")
        assert "no longer attached" in json.dumps(history)


async def test_a_switch_to_a_model_without_vision_sends_it_no_earlier_image(
    tmp_path: Path, model: FakeOpenAI
) -> None:
    seeing = ModelSpec(name="default", model="big", base_url=model.base_url, api_key="k", vision=True)
    blind = ModelSpec(name="small", model="small", base_url=model.base_url, api_key="k")
    image = ImagePart("image/png", b"\x89PNG-bytes", name="p.png", path="/mnt/user-data/uploads/p.png")
    settings = AgentSettings(tools=False)  # keep_turns 3: the image would stay for the next turns
    async with Harness(settings, seeing, tmp_path / "cp.sqlite", models=[seeing, blind]) as harness:
        _ = [e async for e in harness.run("t1", user_id="u", message_id="m1", text="what is it",
                                          options=TurnOptions(images=(image,)))]  # fmt: skip
        assert images_in(model.requests[-1]["messages"][-1]["content"])
        _ = [e async for e in harness.run("t1", user_id="u", message_id="m2", text="and now?",
                                          options=TurnOptions(model="small"))]  # fmt: skip
        request = model.requests[-1]
        assert request["model"] == "small"
        assert not any(images_in(m["content"]) for m in request["messages"] if m["role"] == "user")
        assert "no longer attached" in json.dumps(request["messages"])


async def test_a_transcript_is_kept_so_a_resumed_turn_does_not_pay_twice(
    tmp_path: Path, model: FakeOpenAI
) -> None:
    store = await store_at(tmp_path / "g.sqlite")
    cfg = TranscriptionConfig(base_url=model.base_url, model="w", retries=0, timeout=5)
    try:
        model.heard.append(Heard("first hearing"))
        one = await heard(store, cfg, "telegram:1:7", 0, "v.ogg", OGG, "audio/ogg", 1000)
        model.heard.append(Heard("a different hearing"))
        two = await heard(store, cfg, "telegram:1:7", 0, "v.ogg", OGG, "audio/ogg", 1000)
        assert one.text == two.text == "first hearing"
        assert len(model.transcriptions) == 1
        model.heard.clear()
        model.heard.append(Heard(status=503))
        failed = await heard(store, cfg, "telegram:1:8", 0, "v.ogg", OGG, "audio/ogg", 1000)
        assert failed.problem == "the transcription service failed (HTTP 503)" and not failed.text
    finally:
        await store.close()
