"""Real, tiny audio files for the fakes, made in code (no ffmpeg on the test machines).

:func:`ogg_opus` builds a valid Ogg Opus stream (RFC 7845): the ``OpusHead`` and ``OpusTags``
header pages and audio pages of 20 ms silent CELT frames (``F8 FF FE``, the silence frame Discord
voice sends), each page with its CRC, so any Opus decoder plays it as silence. :func:`mp3` is a run
of MPEG-1 Layer III frames (128 kbit/s, 44.1 kHz) with zeroed side information: silence too.
"""

from __future__ import annotations

import struct

SILENT_FRAME = b"\xf8\xff\xfe"
"""One 20 ms Opus packet: TOC 0xF8 (CELT fullband, 20 ms, mono, one frame) and a silent frame."""


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) if r & 0x80000000 else r << 1
        table.append(r & 0xFFFFFFFF)
    return table


_CRC = _crc_table()


def _ogg_crc(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC[((crc >> 24) & 0xFF) ^ byte]
    return crc


def _page(packets: list[bytes], granule: int, serial: int, seq: int, flags: int) -> bytes:
    lacing = bytearray()
    for packet in packets:
        lacing += b"\xff" * (len(packet) // 255) + bytes([len(packet) % 255])
    header = struct.pack("<4sBBqIII", b"OggS", 0, flags, granule, serial, seq, 0) + bytes([len(lacing)])
    page = bytearray(header + lacing + b"".join(packets))
    struct.pack_into("<I", page, 22, _ogg_crc(bytes(page)))
    return bytes(page)


def ogg_opus(frames: int = 50, serial: int = 0x5EC0A1) -> bytes:
    """``frames`` × 20 ms of silence as an Ogg Opus file (50: one second)."""
    head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, 312, 48000, 0, 0)
    vendor = b"chital-tests"
    tags = b"OpusTags" + struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", 0)
    pages = [_page([head], 0, serial, 0, 0x02), _page([tags], 0, serial, 1, 0)]
    seq, done = 2, 0
    while done < frames:
        n = min(50, frames - done)
        done += n
        last = done == frames
        granule = 312 + done * 960  # 48 kHz samples, pre-skip included
        pages.append(_page([SILENT_FRAME] * n, granule, serial, seq, 0x04 if last else 0))
        seq += 1
    return b"".join(pages)


def mp3(frames: int = 40) -> bytes:
    """``frames`` × 26 ms of silence as MPEG-1 Layer III (no ID3 tag)."""
    header = b"\xff\xfb\x90\x64"  # sync, MPEG-1 L3 no CRC; 128 kbit/s, 44.1 kHz, no padding; mono
    return (header + bytes(417 - len(header))) * frames
