"""The speech service as a hostile or broken endpoint (gateway/delivery/speech.py ``synthesize``):
the real call, through the ``openai`` SDK, against the fake OpenAI server's ``/v1/audio/speech``.

What is asserted is the reason the user's note would carry (``SpeechFailed``) and what other
servers received: a redirect is not followed (the answer's text never reaches the other host), a
body that never ends or declares more than the cap stops the call, a link-local address (cloud
metadata) is never connected to in any spelling.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.config.sections import SpeechConfig
from gateway.delivery.speech import SpeechFailed, synthesize
from tests.fakes import audio
from tests.fakes.openai_server import FakeOpenAI, Spoken

TEXT = "The answer, spoken."


def speech(base_url: str, **extra: Any) -> SpeechConfig:
    return SpeechConfig.model_validate(
        {"base_url": base_url, "api_key": "sk-speech-only-Zq81Mf", "timeout": 1, "retries": 0, **extra}
    )


async def refused(cfg: SpeechConfig, fmt: Any = "opus") -> str:
    with pytest.raises(SpeechFailed) as caught:
        await synthesize(cfg, TEXT, fmt)
    return str(caught.value)


@pytest.fixture
async def elsewhere() -> AsyncIterator[FakeOpenAI]:
    """Another host the speech service points at."""
    fake = FakeOpenAI()
    await fake.start()
    yield fake
    await fake.aclose()


async def test_real_audio_is_accepted(model: FakeOpenAI) -> None:
    assert (await synthesize(speech(model.base_url), TEXT, "opus")).startswith(b"OggS")
    assert model.speech[0]["input"] == TEXT


async def test_a_redirect_is_not_followed_and_the_text_goes_nowhere_else(
    model: FakeOpenAI, elsewhere: FakeOpenAI
) -> None:
    model.spoken.append(Spoken(location=f"{elsewhere.base_url}/audio/speech"))
    reason = await refused(speech(model.base_url))
    assert "redirected me elsewhere (HTTP 307)" in reason
    assert elsewhere.speech == [], "the answer's text (and maybe the key) went to the other host"


async def test_a_body_that_never_ends_stops_at_the_deadline(model: FakeOpenAI) -> None:
    model.spoken.append(Spoken(trickle=0.2))
    assert "did not answer in time" in await refused(speech(model.base_url, timeout=0.5))


async def test_a_declared_size_over_the_cap_is_refused_before_reading(model: FakeOpenAI) -> None:
    model.spoken.append(Spoken(declared=1 << 40))
    assert "more than 16 KB of audio" in await refused(
        speech(model.base_url, max_bytes=16 * 1024, timeout=30)
    )


async def test_mp3_when_opus_was_asked_is_refused(model: FakeOpenAI) -> None:
    model.spoken.append(Spoken(raw=audio.mp3(), content_type="audio/ogg"))
    assert "not opus audio" in await refused(speech(model.base_url))


@pytest.mark.parametrize(
    "base_url",
    [
        "http://169.254.169.254/v1",
        "http://2852039166/v1",  # the same address as one decimal number
        "http://[::ffff:169.254.169.254]/v1",  # IPv4 inside IPv6
        "http://[fe80::1]/v1",
        "http://0.0.0.0:8880/v1",
    ],
)
async def test_a_link_local_speech_address_is_never_connected_to(base_url: str) -> None:
    reason = await refused(speech(base_url, timeout=30))
    assert "link-local (like a cloud metadata service)" in reason


async def test_a_name_is_connected_to_at_the_address_checked(model: FakeOpenAI) -> None:
    """The transport connects to a literal address it resolved and checked itself; the service
    must still see its name in ``Host`` (a server behind a name-based proxy answers by it)."""
    port = model.base_url.split(":")[2].split("/")[0]
    assert (await synthesize(speech(f"http://localhost:{port}/v1"), TEXT, "opus")).startswith(b"OggS")
    assert model.speech[-1]["host"] == f"localhost:{port}"


async def test_a_speech_url_that_is_not_http_is_refused() -> None:
    assert "not an http(s) URL" in await refused(speech("file:///etc/passwd"))
