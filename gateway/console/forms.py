"""Every console form is read here, once, in the gate, with limits on what it may hold.

aiohttp's ``request.post()`` bounds only the body's total size: inside it, a multipart body may
hold any number of parts, and every file part becomes a temporary file on disk. A body of one
megabyte of tiny parts (the login form takes one, before any session) is ten thousand temporary
files and as many dictionary entries. So the gate reads the form itself, part by part: at most
``parts`` parts, each field at most ``field_bytes``, each file at most ``file_bytes`` (kept in
memory: the web chat's limits are a few files of a few megabytes), the whole body at most
``body_bytes``. Past any of them the request ends with 413 and a line naming the limit; nothing of
it is handed on. Handlers read the result with :func:`form_of`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from aiohttp import BodyPartReader, web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

FORM: web.RequestKey[MultiDictProxy[Any]] = web.RequestKey("chital_console_form", MultiDictProxy)
CHUNK = 64 * 1024


@dataclass(frozen=True)
class FormLimits:
    parts: int = 16
    field_bytes: int = 64 * 1024
    file_bytes: int = 0
    body_bytes: int = 1024 * 1024


class FormTooLarge(web.HTTPRequestEntityTooLarge):
    """413 with a line saying which limit was passed (not aiohttp's generic text)."""

    def __init__(self, why: str) -> None:
        web.HTTPException.__init__(self, text=why + "\n", content_type="text/plain")


async def read_form(request: web.Request, limits: FormLimits) -> MultiDictProxy[Any]:
    """The request's form within ``limits``: fields as ``str``, files as :class:`web.FileField`
    over the bytes read. URL-encoded forms are bounded by ``body_bytes`` (aiohttp's own parser)."""
    length = request.content_length
    if length is not None and length > limits.body_bytes:
        raise FormTooLarge(f"The form is larger than {limits.body_bytes} bytes.")
    if request.content_type != "multipart/form-data":
        return await request.clone(client_max_size=limits.body_bytes).post()
    out: MultiDict[Any] = MultiDict()
    total = 0
    reader = await request.multipart()
    while True:
        part = await reader.next()
        if part is None:
            break
        if not isinstance(part, BodyPartReader):  # a nested multipart: no form has one
            raise FormTooLarge("The form holds a nested multipart part.")
        if len(out) >= limits.parts:
            raise FormTooLarge(f"The form has more than {limits.parts} parts.")
        is_file = part.filename is not None
        if is_file and not limits.file_bytes:
            raise FormTooLarge("This form takes no files.")
        cap = limits.file_bytes if is_file else limits.field_bytes
        data = bytearray()
        while chunk := await part.read_chunk(CHUNK):
            data += chunk
            total += len(chunk)
            if total > limits.body_bytes:
                raise FormTooLarge(f"The form is larger than {limits.body_bytes} bytes.")
            if len(data) > cap:
                what = "A file" if is_file else "A field"
                raise FormTooLarge(f"{what} in the form is larger than {cap} bytes.")
        name = part.name or ""
        if is_file:
            headers = CIMultiDictProxy(CIMultiDict(part.headers))
            kind = part.headers.get("Content-Type", "application/octet-stream")
            out.add(name, web.FileField(name, part.filename or "", io.BytesIO(bytes(data)), kind, headers))
        else:
            out.add(name, _decoded(bytes(data), part.get_charset(default="utf-8")))
    return MultiDictProxy(out)


def _decoded(data: bytes, charset: str) -> str:
    try:
        return data.decode(charset, errors="replace")
    except LookupError:  # a charset Python does not know: read it as UTF-8, not a 500
        return data.decode("utf-8", errors="replace")


def form_of(request: web.Request) -> MultiDictProxy[Any]:
    """The form the gate read (empty for a request that carried none)."""
    return request.get(FORM) or MultiDictProxy(MultiDict())
