"""What of a user's image reaches the model provider: its pixels, nothing else (docs/media.md).

Each image goes through `chital run` and the real Telegram SDK against the fake Bot API; the test
then takes the base64 image out of the request the fake model server received and parses it at
the byte level itself (JPEG markers, PNG chunks, RIFF chunks), so a metadata segment Pillow would
happily hide on decoding (a JPEG comment, a PNG text chunk, an ICC profile) cannot slip through.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageCms, PngImagePlugin

from agent.config import VisionSettings
from gateway.intake.media import NotAnImage, prepare_image
from tests.daemon import DaemonProcess, chat_config, started_daemon
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.telegram_server import FakeTelegram

USER = 2002
SECRET = "SECRET-42"
"""Written into every metadata field of every input; must not appear in what the model gets."""
GPS = (48.0, 51.0, 29.0)

RED, BLUE = (220, 20, 20), (20, 20, 220)


def two_halves(mode: str = "RGB", size: tuple[int, int] = (64, 48)) -> Image.Image:
    """Left half red, right half blue: pixels a test can check after any lossy re-encoding."""
    img = Image.new("RGB", size, RED)
    img.paste(BLUE, (size[0] // 2, 0, size[0], size[1]))
    return img.convert(mode) if mode != "RGB" else img


def _exif() -> Image.Exif:
    exif = Image.Exif()
    exif[0x010F] = f"Camera {SECRET}"  # Make
    exif[0x0131] = f"Software {SECRET}"
    gps = exif.get_ifd(0x8825)
    gps[1], gps[2], gps[3], gps[4] = "N", GPS, "E", GPS
    return exif


XMP = f'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF>{SECRET}</rdf:RDF></x:xmpmeta>'.encode()
SRGB_ICC = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


def jpeg_with_everything() -> bytes:
    out = io.BytesIO()
    two_halves().save(out, "JPEG", quality=95, comment=f"comment {SECRET}".encode(), exif=_exif(), xmp=XMP,
                      icc_profile=SRGB_ICC, dpi=(300, 300))  # fmt: skip
    data = out.getvalue()
    markers = {m for m, _ in jpeg_segments(data)}
    assert {0xFE, 0xE1, 0xE2} <= markers, "the input carries COM, APP1 (EXIF, XMP) and APP2 (ICC)"
    return data


def png_with_everything() -> bytes:
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", f"tEXt {SECRET}")
    info.add_text("Description", f"zTXt {SECRET}" * 20, zip=True)
    info.add_itxt("XML:com.adobe.xmp", XMP.decode(), lang="en", tkey="xmp")
    out = io.BytesIO()
    two_halves("RGBA").save(out, "PNG", pnginfo=info, exif=_exif(), icc_profile=SRGB_ICC, dpi=(300, 300))
    data = out.getvalue()
    assert {b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"iCCP", b"pHYs"} <= {c for c, _ in png_chunks(data)}
    return data


def webp_with_everything() -> bytes:
    out = io.BytesIO()
    two_halves().save(out, "WEBP", quality=95, exif=_exif(), xmp=XMP, icc_profile=SRGB_ICC)
    data = out.getvalue()
    assert {b"EXIF", b"XMP ", b"ICCP"} <= {c for c, _ in riff_chunks(data)}
    return data


# -- byte-level parsers (ours, not Pillow's: the point is to see what a decoder would skip) -----------


def jpeg_segments(data: bytes) -> list[tuple[int, bytes]]:
    """(marker, payload) of every segment before the scan data."""
    assert data[:2] == b"\xff\xd8", "not a JPEG"
    out, i = [], 2
    while i < len(data):
        assert data[i] == 0xFF, f"lost sync at {i}"
        while data[i] == 0xFF:
            i += 1
        marker = data[i]
        i += 1
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            continue
        if marker == 0xD9:
            break
        (length,) = struct.unpack(">H", data[i : i + 2])
        out.append((marker, data[i + 2 : i + length]))
        i += length
        if marker == 0xDA:  # start of scan: entropy-coded data follows, no more headers here
            break
    return out


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    out, i = [], 8
    while i < len(data):
        (length,) = struct.unpack(">I", data[i : i + 4])
        out.append((data[i + 4 : i + 8], data[i + 8 : i + 8 + length]))
        i += 12 + length
    return out


def riff_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:4] == b"RIFF" and data[8:12] == b"WEBP", "not a WebP"
    out, i = [], 12
    while i + 8 <= len(data):
        tag, (length,) = data[i : i + 4], struct.unpack("<I", data[i + 4 : i + 8])
        out.append((tag, data[i + 8 : i + 8 + length]))
        i += 8 + length + (length & 1)
    return out


JPEG_ALLOWED = {0xC0, 0xC1, 0xC2, 0xC4, 0xDB, 0xDD, 0xDA}
"""Frame, Huffman and quantisation tables, restart interval, scan: the image itself."""
PNG_ALLOWED = {b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND"}
WEBP_ALLOWED = {b"VP8 ", b"VP8L", b"VP8X", b"ALPH"}


def assert_pixels_only(mime: str, data: bytes) -> None:
    """No metadata of any kind at the byte level, whatever format the gateway chose."""
    if mime == "image/jpeg":
        for marker, payload in jpeg_segments(data):
            if marker == 0xE0:  # APP0: the JFIF header Pillow writes, and nothing else
                assert payload.startswith(b"JFIF\x00") and len(payload) == 14, payload[:16]
                assert payload[7] == 0 and payload[8:12] == b"\x00\x01\x00\x01", "no DPI carried"
                continue
            assert marker in JPEG_ALLOWED, f"JPEG segment 0x{marker:02X} reached the model: {payload[:32]!r}"
    elif mime == "image/png":
        for tag, payload in png_chunks(data):
            assert tag in PNG_ALLOWED, f"PNG chunk {tag!r} reached the model: {payload[:32]!r}"
    elif mime == "image/webp":
        for tag, payload in riff_chunks(data):
            assert tag in WEBP_ALLOWED, f"RIFF chunk {tag!r} reached the model: {payload[:32]!r}"
    else:
        raise AssertionError(f"unexpected format {mime}")
    for needle in (SECRET.encode(), b"Exif", b"ICC_PROFILE", b"adobe", b"http://ns."):
        assert needle not in data, needle


def assert_two_halves(data: bytes) -> None:
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    for (x, y), want in (((w // 4, h // 2), RED), ((3 * w // 4, h // 2), BLUE)):
        got = img.getpixel((x, y))
        assert isinstance(got, tuple) and all(abs(a - b) <= 30 for a, b in zip(got, want, strict=True)), (
            (x, y),
            got,
            want,
        )


# -- end to end -----------------------------------------------------------------------------------------


@pytest.fixture
async def daemon(tmp_path: Path, model: FakeOpenAI, tg: FakeTelegram) -> AsyncIterator[DaemonProcess]:
    # no tools: every model request is a user's turn
    cfg = chat_config(tmp_path, model.base_url, tg, allow=[f"telegram:{USER}"], agent={"tools": False})
    cfg["models"][0]["vision"] = True
    async with started_daemon(tmp_path, cfg) as d:
        yield d


def _images_sent(model: FakeOpenAI, needle: str) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    for body in reversed(model.requests):
        user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        if isinstance(user, list) and any(needle in str(p.get("text", "")) for p in user):
            out = []
            for part in user:
                if part.get("type") == "image_url":
                    head, _, b64 = part["image_url"]["url"].partition(",")
                    out.append((head.removeprefix("data:").removesuffix(";base64"), base64.b64decode(b64)))
            return body, out
    raise AssertionError(f"no model request carries {needle!r} with images")


@pytest.mark.parametrize("kind", ["jpeg-photo", "png-file", "webp-file"])
async def test_what_the_model_receives_carries_pixels_and_no_metadata(
    daemon: DaemonProcess, model: FakeOpenAI, tg: FakeTelegram, kind: str
) -> None:
    if kind == "jpeg-photo":
        up = tg.inject_message(USER, USER, f"look {kind}", photo=tg.add_photo(jpeg_with_everything()))
    elif kind == "png-file":
        doc = tg.add_file(png_with_everything(), file_name="shot.png", mime_type="image/png")
        up = tg.inject_message(USER, USER, f"look {kind}", document=doc)
    else:
        doc = tg.add_file(webp_with_everything(), file_name="chart.webp", mime_type="image/webp")
        up = tg.inject_message(USER, USER, f"look {kind}", document=doc)
    mid = up["message"]["message_id"]
    await tg.wait_for(
        lambda: any(m.reply_to == mid and "echo:" in m.text for m in tg.bot_messages(USER)),
        timeout=30,
        what="the answer",
    )
    body, images = _images_sent(model, f"look {kind}")
    assert len(images) == 1
    mime, data = images[0]
    assert_pixels_only(mime, data)
    assert_two_halves(data)
    if kind == "png-file":
        assert mime == "image/png", "transparency keeps PNG, so its chunks are what is checked"
    assert SECRET not in json.dumps(body), "no metadata anywhere in the request"


# -- in process: the cases a chat does not need to show ---------------------------------------------


def test_an_animation_shows_its_first_frame_without_its_comment() -> None:
    frames = [two_halves(), Image.new("RGB", (64, 48), (0, 200, 0))]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], comment=SECRET.encode(), duration=50)
    part = prepare_image(out.getvalue(), name="a.gif", path="/a.gif", limits=VisionSettings())
    assert_pixels_only(part.mime, part.data)
    assert_two_halves(part.data)


def test_a_bomb_is_refused_from_its_header_with_a_clear_reason() -> None:
    """A PNG whose header claims 40000×40000 pixels: a few dozen bytes that would decode into
    gigabytes. Refused from the header, before any pixel is decoded."""

    def chunk(tag: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + tag + payload + struct.pack(">I", zlib.crc32(tag + payload))

    ihdr = struct.pack(">IIBBBBB", 40_000, 40_000, 8, 2, 0, 0, 0)
    bomb = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 1000))
        + chunk(b"IEND", b"")
    )
    with pytest.raises(NotAnImage, match="more pixels than I decode"):
        prepare_image(bomb, name="b.png", path="/b.png", limits=VisionSettings())


def test_an_image_the_agent_reads_from_its_uploads_is_pixels_only(tmp_path: Path) -> None:
    """read_file on an image (the user's original upload, GPS and all) hands the model the
    re-encoded pixels, in the file's own format."""
    from agent.sandbox.backend import SandboxBackend
    from agent.sandbox.files import HostFiles
    from agent.sandbox.paths import PathMapper, ThreadDirs

    dirs = ThreadDirs.for_thread(tmp_path / "sbx", "t1", None)
    dirs.ensure(None)

    class _Sandbox:  # what SandboxBackend.read uses of a sandbox: its files
        id = "t1"
        files = HostFiles(PathMapper(dirs))

    backend = SandboxBackend(_Sandbox())  # type: ignore[arg-type]
    for name, data, mime in (
        ("p.jpg", jpeg_with_everything(), "image/jpeg"),
        ("s.png", png_with_everything(), "image/png"),
        ("c.webp", webp_with_everything(), "image/webp"),
    ):
        (dirs.uploads / name).write_bytes(data)
        result = backend.read(f"/mnt/user-data/uploads/{name}")
        assert result.error is None and result.file_data is not None, result.error
        sent = base64.b64decode(result.file_data["content"])
        assert_pixels_only(mime, sent)
        assert_two_halves(sent)


def test_an_image_whose_metadata_cannot_be_removed_is_not_read_to_the_model(tmp_path: Path) -> None:
    """An iPhone photo (HEIC) sent as a document: Pillow cannot re-encode it, so read_file refuses
    it with what to do instead, rather than handing the provider its GPS position."""
    from agent.sandbox.backend import SandboxBackend
    from agent.sandbox.files import HostFiles
    from agent.sandbox.paths import PathMapper, ThreadDirs

    dirs = ThreadDirs.for_thread(tmp_path / "sbx", "t1", None)
    dirs.ensure(None)

    class _Sandbox:
        id = "t1"
        files = HostFiles(PathMapper(dirs))

    backend = SandboxBackend(_Sandbox())  # type: ignore[arg-type]
    heic = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"Exif\x00\x00GPS 48.8584N 2.2945E"
    for name in ("IMG_0001.HEIC", "photo.heic", "scan.heif"):
        (dirs.uploads / name).write_bytes(heic)
        result = backend.read(f"/mnt/user-data/uploads/{name}")
        assert result.file_data is None and result.error is not None, name
        assert "convert it to JPEG or PNG" in result.error and "48.8584" not in result.error
