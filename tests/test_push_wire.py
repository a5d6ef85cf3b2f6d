"""The push protocols' pure parts (gateway/delivery/push_wire.py): cuts, header values, waits and
the refusal words, with the cases a daemon test cannot reach cheaply."""

from __future__ import annotations

import base64

from gateway.config.push import PushTarget
from gateway.delivery import push_wire
from gateway.delivery.push_wire import CUT_MARK, build, clip_bytes, header_value, refusal, retry_after


def test_a_cut_fits_the_byte_limit_on_a_character_boundary() -> None:
    for text in ("é" * 3000, "🙂" * 2000, "a" * 5000, "a" + "€" * 2000):
        cut, was_cut = clip_bytes(text, 4096)
        assert was_cut and len(cut.encode()) <= 4096 and cut.endswith(CUT_MARK)
        cut.encode("utf-8")  # no half character, no lone surrogate
    assert clip_bytes("short", 4096) == ("short", False)
    exact = "x" * 4096
    assert clip_bytes(exact, 4096) == (exact, False)


def test_header_values_are_one_ascii_line() -> None:
    for title in ("a\r\nX-Evil: 1", "a\nb", "a\x00b", "a\u2028b", "a\x85b"):
        value = header_value(title)
        assert value.isascii() and not any(c in value for c in "\r\n\x00")
    encoded = header_value("Déploy ✅\r\nX: y")
    assert encoded.startswith("=?UTF-8?B?") and encoded.endswith("?=")
    assert base64.b64decode(encoded[10:-2]).decode() == "Déploy ✅ X: y"
    assert len(header_value("t" * 1000)) == push_wire.TITLE_CHARS


def test_retry_after_is_bounded_and_garbage_falls_back() -> None:
    assert retry_after("7", 1.0, 300) == 7
    assert retry_after("999999", 1.0, 300) == 300
    for bad in ("nan", "-5", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", "", None):
        assert retry_after(bad, 2.0, 300) == 2.0, bad


def test_refusals_name_the_cause_and_echo_nothing_of_the_server() -> None:
    assert "credentials (HTTP 401)" in refusal("ntfy", 401)
    assert "device_key" in refusal("bark", 400) and "malformed" in refusal("ntfy", 400)
    assert "redirected" in refusal("ntfy", 302) and "HTTP 418" in refusal("bark", 418)


def test_the_bark_key_travels_in_the_body_and_ntfy_auth_in_a_header() -> None:
    bark = PushTarget(kind="bark", server="https://api.day.app", device_key="devkey123456")
    req = build(bark, "k", "T", "body")
    assert req.url == "https://api.day.app/push" and req.json is not None
    assert req.json["device_key"] == "devkey123456" and "devkey" not in req.url
    ntfy = PushTarget(kind="ntfy", server="https://n.example", topic="topic-1", username="u", password="pw")
    req = build(ntfy, "k", "", "body")
    assert req.url == "https://n.example/topic-1" and req.headers["Title"] == "Chital"
    assert req.headers["Authorization"] == "Basic " + base64.b64encode(b"u:pw").decode()
    assert req.headers["X-Sequence-ID"] == build(ntfy, "k", "", "other").headers["X-Sequence-ID"]
    assert req.headers["X-Sequence-ID"] != build(ntfy, "k2", "", "body").headers["X-Sequence-ID"]
