"""Files the agent made, out to WeCom: the long connection's temporary-media upload, then a
``file`` or ``image`` message naming the ``media_id``.

The upload is three commands over the websocket (WeCom's Node SDK ``uploadMedia``, see
docs/setup/wecom.md section 8): ``aibot_upload_media_init`` (``type``, ``filename``,
``total_size``, ``total_chunks``, ``md5``), answered with ``body.upload_id``; then one
``aibot_upload_media_chunk`` per 512 KiB (``upload_id``, ``chunk_index`` counted from 0 as the
SDK's code sends it, ``base64_data``); then ``aibot_upload_media_finish`` (``upload_id``),
answered with ``body.media_id`` (valid 3 days). At most 100 chunks (about 50 MB) per upload.

Sizes: WeCom's temporary media takes images (JPG/PNG) up to 10 MB and files up to 20 MB, and
nothing under 5 bytes; an image over its limit goes as a file, anything over 20 MB is refused
before a byte is sent, with a sentence the gateway shows. Chunks go one after another (the SDK
sends a few at once; WeCom answers a burst of chunks with "system busy", which costs more than
it saves).

What is uploaded is the file's bytes and its (cleaned) name, already masked of the daemon's
secrets by the outbound guard (channels/egress.py); no credential travels in an upload frame (the
connection was authenticated once, at the subscription).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

from channels.base import OutFile, PermanentSendError, RetryAfter, TransientSendError

from .inbound import obj

INIT = "aibot_upload_media_init"
CHUNK = "aibot_upload_media_chunk"
FINISH = "aibot_upload_media_finish"
CHUNK_BYTES = 512 * 1024
MAX_CHUNKS = 100
IMAGE_BYTES = 10 * 1024 * 1024
FILE_BYTES = 20 * 1024 * 1024
MIN_BYTES = 5
IMAGES = frozenset({".jpg", ".jpeg", ".png"})
NAME_BYTES = 128
RATE_LIMITED = frozenset({45009, 45033})

Request = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""Sends one command with a fresh ``req_id`` and returns WeCom's answer frame."""

_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]+")


def kind_of(file: OutFile) -> str:
    """``image`` for a JPG/PNG WeCom takes as one, else ``file``."""
    return "image" if file.suffix in IMAGES and file.size <= IMAGE_BYTES else "file"


def clean_name(name: str) -> str:
    """A file name to show: no path, no control or direction characters, at most 128 bytes
    (the extension kept)."""
    cleaned = _UNSAFE.sub("_", name).strip(" .") or "file"
    if len(cleaned.encode()) <= NAME_BYTES:
        return cleaned
    dot = cleaned.rfind(".")
    suffix = cleaned[dot:] if 0 < dot and len(cleaned) - dot <= 16 else ""
    stem = cleaned[: len(cleaned) - len(suffix)]
    while len((stem + suffix).encode()) > NAME_BYTES:
        stem = stem[:-1]
    return stem + suffix


def check(file: OutFile) -> None:
    """:class:`PermanentSendError` with a sentence for a file WeCom would refuse by its size."""
    if file.size > FILE_BYTES:
        raise PermanentSendError(
            f"{clean_name(file.name)} is {file.size / 1024 / 1024:.1f} MB; WeCom takes files up to "
            f"{FILE_BYTES // 1024 // 1024} MB"
        )
    if file.size < MIN_BYTES:
        name = clean_name(file.name)
        raise PermanentSendError(f"{name} has {file.size} bytes; WeCom takes no file under {MIN_BYTES}")


def verdict(answer: dict[str, Any], name: str, step: str) -> None:
    """Raise what an upload answer with a non-zero errcode means (never its raw text beyond
    WeCom's short errmsg)."""
    errcode = answer.get("errcode")
    if errcode == 0:
        return
    errmsg = answer.get("errmsg")
    text = errmsg[:120] if isinstance(errmsg, str) and errmsg.isprintable() else ""
    if errcode in RATE_LIMITED:
        raise RetryAfter(5.0, f"WeCom rate limit ({errcode}) while uploading {name}")
    if isinstance(errcode, int) and errcode < 0:
        raise TransientSendError(f"WeCom was busy while uploading {name} ({step}: {errcode})")
    detail = f"{step}: errcode {errcode} {text}".strip()
    raise PermanentSendError(f"WeCom refused the upload of {name} ({detail})")


async def upload(request: Request, file: OutFile) -> tuple[str, str]:
    """Upload ``file``; ``(msgtype, media_id)`` to send it with."""
    check(file)
    name, kind = clean_name(file.name), kind_of(file)
    total = -(-file.size // CHUNK_BYTES)
    if total > MAX_CHUNKS:  # unreachable under FILE_BYTES; kept for a raised limit
        raise PermanentSendError(f"{name} needs {total} chunks; WeCom takes {MAX_CHUNKS}")
    body = {"type": kind, "filename": name, "total_size": file.size, "total_chunks": total,
            "md5": hashlib.md5(file.data, usedforsecurity=False).hexdigest()}  # fmt: skip
    answer = await request(INIT, body)
    verdict(answer, name, "init")
    upload_id = obj(answer.get("body")).get("upload_id")
    if not isinstance(upload_id, str) or not upload_id or len(upload_id) > 512:
        raise TransientSendError(f"WeCom gave no upload id for {name}")
    for index in range(total):
        data = file.data[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
        chunk = {"upload_id": upload_id, "chunk_index": index,
                 "base64_data": base64.b64encode(data).decode()}  # fmt: skip
        verdict(await request(CHUNK, chunk), name, f"chunk {index + 1} of {total}")
    answer = await request(FINISH, {"upload_id": upload_id})
    verdict(answer, name, "finish")
    media_id = obj(answer.get("body")).get("media_id")
    if not isinstance(media_id, str) or not media_id or len(media_id) > 512:
        raise TransientSendError(f"WeCom gave no media id for {name}")
    return kind, media_id
