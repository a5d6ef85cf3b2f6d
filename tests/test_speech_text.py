"""What the speech service is given (gateway/delivery/speech.py ``speakable``) and which bytes
count as the audio asked for (``is_audio``), on the real redactor and the real audio the fakes make."""

from __future__ import annotations

import html
import struct
import unicodedata
from urllib.parse import unquote

import pytest

from agent.redact import Redactor
from channels.lark.im import ogg_duration_ms
from gateway.delivery.speech import holds_secret, is_audio, speakable
from tests.fakes.audio import mp3, ogg_opus

SECRET = "xoxb-1234-abcdefABCDEF"
redact = Redactor([SECRET])


def test_markdown_goes_and_code_and_links_are_named() -> None:
    said = speakable(
        "# Title\n- **bold** and *soft* and `inline`\n> quoted\n[a site](https://x.example/p?q=1)\n"
        "```sh\nrm -rf /\n```\nhttps://naked.example/path\n| col | col2 |",
        redact,
        1000,
    )
    assert said.splitlines()[:4] == ["Title", "bold and soft and inline", "quoted", "a site"]
    assert "(code shown in the text)" in said and "rm -rf" not in said
    assert "a link" in said and "https://" not in said and "#" not in said and "*" not in said


def test_an_unterminated_code_block_is_not_read_out() -> None:
    assert "secret_code" not in speakable("look:\n```python\nsecret_code()\n", redact, 500)


@pytest.mark.parametrize(
    "answer",
    [
        f"the token is {SECRET}.",
        f"the token is `{SECRET}`.",
        f"[click]({SECRET}) or **{SECRET}**",
        f"```\n{SECRET}\n```\n and {SECRET[:10]}**{SECRET[10:]}**",
    ],
)
def test_a_secret_is_never_given_to_the_speech_service(answer: str) -> None:
    said = speakable(answer, redact, 500)
    assert SECRET not in said and SECRET.replace("-", "") not in said.replace("-", "")


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if 0x21 <= ord(c) <= 0x7E else c for c in text)


@pytest.mark.parametrize(
    "answer",
    [
        f"| {SECRET[:9]} | {SECRET[9:]} |",  # a table cell per half: the bar becomes a comma
        f"{SECRET[:9]}\n{SECRET[9:]}",  # a line each
        f"{SECRET[:9]}\n# {SECRET[9:]}",  # the second half a heading
        f"{SECRET[:9]}\u200b{SECRET[9:]}",  # a zero-width space between
        " ".join(SECRET),  # spelled out
        "-".join(SECRET),
        SECRET.upper(),
        _fullwidth(SECRET),
        f"[{SECRET[:9]}](https://a.example) [{SECRET[9:]}](https://b.example)",
        f"{SECRET[:9]}<b>{SECRET[9:]}</b>",
        f"{SECRET[:9]}\\{SECRET[9:]}",
        "".join(f"%{ord(c):02X}" for c in SECRET),  # percent-escaped
        "".join(f"&#{ord(c)};" for c in SECRET),  # HTML entities
    ],
)
def test_a_secret_in_pieces_is_caught_before_the_speech_service(answer: str) -> None:
    """The redactor masks a secret where it stands whole; one spelled out in pieces passes it, so
    what would be sent is checked once more, letters and digits only, and such an answer is not
    spoken (gateway/turns/spoken.py sends a note instead). The oracle here decodes and folds
    independently of the code under test."""
    said = speakable(answer, redact, 500)
    sent = "" if holds_secret(said, redact.secrets) else said
    heard = unicodedata.normalize("NFKC", html.unescape(unquote(sent))).casefold()
    assert "xoxb1234abcdefabcdef" not in "".join(c for c in heard if c.isalnum()), said


def test_ordinary_answers_are_not_taken_for_secrets() -> None:
    for answer in ["The build passed. Deploy with make release.", "xoxb tokens start like that", SECRET[:8]]:
        assert not holds_secret(speakable(answer, redact, 500), redact.secrets)


def test_a_long_answer_is_cut_after_a_sentence_within_the_bound() -> None:
    said = speakable("One sentence here. " * 500, redact, 200)
    assert len(said) <= 200 and said.endswith("here. The rest is in the text.")
    unbroken = speakable("x" * 5000, redact, 120)
    assert len(unbroken) <= 120 and unbroken.endswith("The rest is in the text.")


def test_audio_is_recognised_by_its_first_bytes() -> None:
    assert is_audio(ogg_opus(), "opus") and is_audio(mp3(), "mp3")
    assert not is_audio(mp3(), "opus") and not is_audio(ogg_opus(), "mp3")
    assert not is_audio(b"OggS" + bytes(200), "opus"), "an Ogg file without Opus (Vorbis, garbage)"
    opus = ogg_opus()
    assert not is_audio(opus + b"<html>502 Bad Gateway</html>", "opus"), "garbage behind a valid page"
    assert not is_audio(opus[:-5], "opus"), "a download cut off in its last page"
    assert not is_audio(opus[:200] + bytes(300), "opus")
    assert not is_audio(b"<html>", "mp3") and not is_audio(b"", "mp3") and not is_audio(b"\xff", "mp3")


def test_an_ogg_duration_is_read_and_a_lying_one_is_not_believed() -> None:
    """Lark's audio message carries the length the daemon reads from the Ogg pages; a speech
    service's Ogg whose last page claims hours (or a negative length) is not passed on."""
    real = ogg_opus(frames=100)
    assert ogg_duration_ms(real) == 2000
    last = real.rfind(b"OggS")
    for granule in (1 << 62, -1, 312):
        lying = bytearray(real)
        struct.pack_into("<q", lying, last + 6, granule)
        assert ogg_duration_ms(bytes(lying)) == 0, granule
