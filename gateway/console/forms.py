"""Every console form is read here, once, in the gate, with limits on what it may hold.

aiohttp's ``request.post()`` bounds only the body's total size: inside it, a multipart body may
hold any number of parts, and every file part becomes a temporary file on disk. A body of one
megabyte of tiny parts (the login form takes one, before any session) is ten thousand temporary
files and as many dictionary entries. So the gate reads the form itself, part by part: at most
``parts`` parts, each field at most ``field_bytes``, each file at most ``file_bytes`` (kept in
memory: the web chat's limits are a few files of a few megabytes), the whole body at most
``body_bytes``. Past any of them the request ends with 413 and a line naming the limit; nothing of
it is handed on. Handlers read the result with :func:`form_of`.

A body no page makes is refused with 400 and a line saying what is wrong with it, never a 500: a
multipart body without its boundary or cut short. A URL-encoded one that is not UTF-8 is read with
U+FFFD in place of the bad bytes (as is one in an unknown ``charset``), and holds at most ``parts``
fields like a multipart one. A NUL in a field becomes U+FFFD
(PostgreSQL's text columns refuse it: a NUL in a pairing code was a 500 on one engine only).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
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


class FormMalformed(web.HTTPBadRequest):
    """400 with a line saying what is wrong with the body (not a 500 from deep in a parser)."""

    def __init__(self, why: str) -> None:
        web.HTTPException.__init__(self, text=why + "\n", content_type="text/plain")


URLENCODED = "application/x-www-form-urlencoded"


async def read_form(request: web.Request, limits: FormLimits) -> MultiDictProxy[Any]:
    """The request's form within ``limits``: fields as ``str``, files as :class:`web.FileField`
    over the bytes read. A body of another type (JSON, plain text) is no form: it reads as empty."""
    length = request.content_length
    if length is not None and length > limits.body_bytes:
        raise FormTooLarge(f"The form is larger than {limits.body_bytes} bytes.")
    if request.content_type == URLENCODED:
        return await _urlencoded(request, limits)
    if request.content_type != "multipart/form-data":
        return MultiDictProxy(MultiDict())
    try:
        return await _multipart(request, limits)
    except (ValueError, AssertionError, LookupError, HttpProcessingError) as exc:
        # aiohttp's reader says "boundary missed", "Reading after EOF", "Could not find starting
        # boundary b'…'": a body no browser sends. Said in our words: its own would echo the
        # sender's boundary, cut (a secret there would show its head, unmasked).
        if "boundary missed" in str(exc):
            why = "its Content-Type names no boundary"
        elif isinstance(exc, HttpProcessingError):  # a part's header holds a control character
            why = "a part's headers are not valid HTTP headers"
        else:
            why = "it is cut short, or is not the multipart body its Content-Type says"
        raise FormMalformed(f"The form's multipart body could not be read: {why}.") from None


async def _urlencoded(request: web.Request, limits: FormLimits) -> MultiDictProxy[Any]:
    """``a=1&b=2`` within the body limit and the same number of fields as a multipart form (the
    body's limit bounds each field: a field is kept in memory once, as text)."""
    body = bytearray()
    while chunk := await request.content.read(CHUNK):
        body += chunk
        if len(body) > limits.body_bytes:
            raise FormTooLarge(f"The form is larger than {limits.body_bytes} bytes.")
    charset = request.charset or "utf-8"
    try:
        "".encode(charset)
    except LookupError:  # a charset Python does not know: read it as UTF-8, not a 500
        charset = "utf-8"
    try:
        pairs = parse_qsl(
            body.decode("latin-1"), keep_blank_values=True, encoding=charset, errors="replace",
            max_num_fields=limits.parts,
        )  # fmt: skip
    except ValueError:
        raise FormTooLarge(f"The form has more than {limits.parts} fields.") from None
    return MultiDictProxy(MultiDict((_unnul(name), _unnul(value)) for name, value in pairs))


async def _multipart(request: web.Request, limits: FormLimits) -> MultiDictProxy[Any]:
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
        name = _unnul(part.name or "")
        if is_file:
            headers = CIMultiDictProxy(CIMultiDict(part.headers))
            kind = part.headers.get("Content-Type", "application/octet-stream")
            out.add(name, web.FileField(name, part.filename or "", io.BytesIO(bytes(data)), kind, headers))
        else:
            out.add(name, _unnul(_decoded(bytes(data), part.get_charset(default="utf-8"))))
    return MultiDictProxy(out)


def _unnul(text: str) -> str:
    return text.replace("\x00", "\ufffd")


def _decoded(data: bytes, charset: str) -> str:
    try:
        return data.decode(charset, errors="replace")
    except LookupError:  # a charset Python does not know: read it as UTF-8, not a 500
        return data.decode("utf-8", errors="replace")


def form_of(request: web.Request) -> MultiDictProxy[Any]:
    """The form the gate read (empty for a request that carried none)."""
    return request.get(FORM) or MultiDictProxy(MultiDict())
