"""The im.v1 requests the Lark adapter makes, built from the contract's values: pure functions over
lark-oapi's request builders (messages, reactions, files and images, thread history).

Kept apart from :mod:`channels.lark.channel`, which runs these requests (its ``_call``: the thread
pool, the token, the mapping of failures) and holds the long connection, because lark-oapi's
builders are long-winded: here is what each call sends, readable (and checkable) without a server.
Which upload endpoint a file takes, and which reaction a status emoji becomes, are decided here too.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from lark_oapi.api.im.v1 import (
    CreateFileRequest,
    CreateFileRequestBody,
    CreateImageRequest,
    CreateImageRequestBody,
    CreateMessageReactionRequest,
    CreateMessageReactionRequestBody,
    CreateMessageRequest,
    CreateMessageRequestBody,
    Emoji,
    GetMessageRequest,
    GetMessageResourceRequest,
    ListMessageRequest,
    PatchMessageRequest,
    PatchMessageRequestBody,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
)

from channels.base import Button, OutFile, PermanentSendError, Rendered

from . import render
from .inbound import BUTTON_VALUE_KEY, parse_attachment_id

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tiff", ".ico", ".heic"})
FILE_TYPES = {
    ".pdf": "pdf",
    ".doc": "doc",
    ".docx": "doc",
    ".xls": "xls",
    ".xlsx": "xls",
    ".ppt": "ppt",
    ".pptx": "ppt",
    ".mp4": "mp4",
    ".opus": "opus",
}
MAX_IMAGE_BYTES = 10 * 1024 * 1024
EMOJI = {
    "👍": "THUMBSUP",
    "👌": "OK",
    "✅": "DONE",
    "🙏": "THANKS",
    "👏": "APPLAUSE",
    "💪": "MUSCLE",
    "😄": "SMILE",
    "🙂": "SMILE",
    "➕": "JIAYI",
}


def payload(part: Rendered) -> tuple[str, str]:
    """(msg_type, content) of a part; plain parts (notices) become cards so they stay editable."""
    if part.payload.get("msg_type") and part.payload.get("content"):
        return str(part.payload["msg_type"]), str(part.payload["content"])
    return "interactive", render.card_content(part.text)


def buttons_part(part: Rendered, buttons: Sequence[Button]) -> Rendered:
    """A card with the text and one row of callback buttons (JSON 2.0 ``behaviors``)."""
    card = render.card(part.text)
    columns = [
        {"tag": "column", "width": "auto", "elements": [{
            "tag": "button", "text": {"tag": "plain_text", "content": b.label},
            "type": {"primary": "primary", "danger": "danger"}.get(b.style, "default"),
            "behaviors": [{"type": "callback", "value": {BUTTON_VALUE_KEY: b.value}}],
        }]}
        for b in buttons
    ]  # fmt: skip
    card["body"]["elements"].append({"tag": "column_set", "columns": columns})
    content = json.dumps(card, ensure_ascii=False)
    return Rendered(text=part.text, payload={"msg_type": "interactive", "content": content})


def reply_request(
    message_id: str | None, msg_type: str, content: str, uuid: str | None, *, in_thread: bool
) -> ReplyMessageRequest:
    body = ReplyMessageRequestBody.builder().content(content).msg_type(msg_type)
    if uuid:
        body = body.uuid(uuid)
    if in_thread:
        body = body.reply_in_thread(True)
    return ReplyMessageRequest.builder().message_id(message_id).request_body(body.build()).build()


def create_request(chat_id: str, msg_type: str, content: str, uuid: str | None) -> CreateMessageRequest:
    body = CreateMessageRequestBody.builder().receive_id(chat_id).msg_type(msg_type).content(content)
    if uuid:
        body = body.uuid(uuid)
    kind = "open_id" if chat_id.startswith("ou_") else "chat_id"  # a person (a menu event's answer)
    return CreateMessageRequest.builder().receive_id_type(kind).request_body(body.build()).build()


def patch_request(message_id: str, content: str) -> PatchMessageRequest:
    return (
        PatchMessageRequest.builder()
        .message_id(message_id)
        .request_body(PatchMessageRequestBody.builder().content(content).build())
        .build()
    )


def reaction_request(message_id: str, emoji: str) -> CreateMessageReactionRequest:
    """A reaction Lark knows: status emoji map to its names, a bare name passes, anything else is OK."""
    emoji_type = EMOJI.get(emoji) or (emoji if emoji.isascii() and emoji.isalpha() else "OK")
    return (
        CreateMessageReactionRequest.builder()
        .message_id(message_id)
        .request_body(
            CreateMessageReactionRequestBody.builder()
            .reaction_type(Emoji.builder().emoji_type(emoji_type).build())
            .build()
        )
        .build()
    )


def resource_request(file_id: str) -> GetMessageResourceRequest:
    """The download of an attachment's resource (its ``file_id`` as :mod:`channels.lark.inbound` made it)."""
    try:
        message_id, kind, key = parse_attachment_id(file_id)
    except ValueError:
        raise PermanentSendError("not a Lark attachment") from None
    return GetMessageResourceRequest.builder().message_id(message_id).file_key(key).type(kind).build()


MAX_MS_PER_BYTE = 120
"""An Opus packet is at least one byte (plus its lacing byte) and at most 120 ms long: a stream
claiming more than this many milliseconds per byte lies about its length."""


def ogg_duration_ms(data: bytes) -> int:
    """An Ogg Opus stream's length in milliseconds: the last page's granule position (48 kHz
    samples) less the header's pre-skip; 0 when the bytes do not say, or say more than the bytes
    could hold (the audio comes from a speech service, and Lark shows this length to the user)."""
    last = data.rfind(b"OggS")
    head = data.find(b"OpusHead")
    if last < 0 or head < 0 or len(data) < last + 14 or len(data) < head + 12 or data[last + 4] != 0:
        return 0
    (granule,) = struct.unpack_from("<q", data, last + 6)
    (pre_skip,) = struct.unpack_from("<H", data, head + 10)
    ms = (granule - pre_skip) // 48
    return ms if 0 < ms <= len(data) * MAX_MS_PER_BYTE else 0


def upload_request(file: OutFile, data: Any) -> tuple[str, Any]:
    """("image", its upload) for an image Lark shows inline (up to 10 MB), ("audio", its upload)
    for a spoken answer (``file.voice``, Ogg Opus: Lark's audio message plays only that), else
    ("file", its upload)."""
    if file.voice and file.suffix == ".ogg":
        body = CreateFileRequestBody.builder().file_type("opus").file_name(file.name)
        body = body.duration(ogg_duration_ms(file.data)).file(data)
        return "audio", CreateFileRequest.builder().request_body(body.build()).build()
    if file.suffix in IMAGE_SUFFIXES and file.size <= MAX_IMAGE_BYTES:
        image = CreateImageRequestBody.builder().image_type("message").image(data).build()
        return "image", CreateImageRequest.builder().request_body(image).build()
    file_type = FILE_TYPES.get(file.suffix, "stream")
    upload = CreateFileRequestBody.builder().file_type(file_type).file_name(file.name).file(data).build()
    return "file", CreateFileRequest.builder().request_body(upload).build()


def uploaded_part(file: OutFile, kind: str, resp: Any) -> Rendered:
    """The message that shows an uploaded image, audio or file (its key from the upload's answer)."""
    content = {"image_key": resp.data.image_key} if kind == "image" else {"file_key": resp.data.file_key}
    return Rendered(text=file.name, payload={"msg_type": kind, "content": json.dumps(content)})


def thread_request(thread_id: str, limit: int) -> ListMessageRequest:
    """A thread's newest messages first, with their senders' names."""
    return (
        ListMessageRequest.builder()
        .container_id_type("thread")
        .container_id(thread_id)
        .sort_type("ByCreateTimeDesc")
        .page_size(min(50, limit + 1))
        .with_sender_name(True)
        .build()
    )


def message_request(message_id: str) -> GetMessageRequest:
    return GetMessageRequest.builder().message_id(message_id).with_sender_name(True).build()
