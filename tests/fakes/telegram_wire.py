"""Wire-level pieces of the fake Telegram Bot API: records, entity helpers, request decoding.

Split from :mod:`tests.fakes.telegram_server` to keep each module small; import from there.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MAX_TEXT_UTF16 = 4096
MAX_CAPTION_UTF16 = 1024
GETFILE_LIMIT = 20 * 1024 * 1024
# Parameters that are plain strings on the wire; everything else PTB JSON-encodes (numbers, lists).
_STRING_PARAMS = frozenset(
    {"text", "caption", "action", "file_id", "parse_mode", "emoji", "description", "url", "name"}
)
_MENTION = re.compile(r"(?<![\w@])@[A-Za-z][A-Za-z0-9_]{3,31}\b")
_COMMAND = re.compile(r"(?<!\S)/[A-Za-z0-9_]{1,32}(?:@[A-Za-z][A-Za-z0-9_]{3,31})?(?![\w@])")
DESCRIPTIONS = {
    400: "Bad Request: something is wrong",
    401: "Unauthorized",
    403: "Forbidden: bot was blocked by the user",
    404: "Not Found",
    409: "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
    429: "Too Many Requests: retry after {retry_after}",
    500: "Internal Server Error",
    502: "Bad Gateway",
}


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def entity_text(text: str, entity: dict[str, Any]) -> str:
    """The part of ``text`` an entity covers (offsets are UTF-16 code units)."""
    raw = text.encode("utf-16-le")
    start = 2 * entity["offset"]
    return raw[start : start + 2 * entity["length"]].decode("utf-16-le")


def auto_entities(text: str) -> list[dict[str, Any]]:
    """The mention and bot_command entities Telegram itself would attach to ``text``."""
    found: list[tuple[int, int, str]] = []
    for kind, rx in (("mention", _MENTION), ("bot_command", _COMMAND)):
        for m in rx.finditer(text):
            found.append((m.start(), m.end(), kind))
    found.sort()
    return [
        {"type": kind, "offset": utf16_len(text[:s]), "length": utf16_len(text[s:e])} for s, e, kind in found
    ]


@dataclass(slots=True)
class Call:
    """One request the bot made (failed ones included, with the status it got)."""

    method: str
    params: dict[str, Any]
    time: float
    status: int = 200


@dataclass(slots=True)
class Seen:
    """A message as the chat's members see it now (edits applied)."""

    chat_id: int
    message_id: int
    text: str
    entities: list[dict[str, Any]]
    from_bot: bool
    thread_id: int | None = None
    reply_to: int | None = None
    edits: int = 0
    deleted: bool = False
    document: dict[str, Any] | None = None
    photo: list[dict[str, Any]] | None = None
    reactions: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def spans(self, kind: str) -> list[str]:
        """The text covered by each entity of type ``kind`` (e.g. "pre", "bold")."""
        return [entity_text(self.text, e) for e in self.entities if e["type"] == kind]


@dataclass(slots=True)
class Failure:
    status: int
    times: int
    retry_after: int | None
    description: str | None


@dataclass(slots=True)
class Held:
    """An answer the fake holds back (FakeTelegram.hold_answer): the call took effect, the bot waits."""

    method: str
    when: Callable[[dict[str, Any]], bool]
    skip: int
    release: asyncio.Event
    waiting: bool = False

    def takes(self, method: str, params: dict[str, Any]) -> bool:
        """True for the call this hold is for (counting down ``skip`` matching calls first)."""
        if self.waiting or method != self.method or not self.when(params):
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        return True


@dataclass(slots=True)
class StoredFile:
    file_id: str
    unique_id: str
    data: bytes
    name: str
    mime_type: str
    path: str


class ApiError(Exception):
    def __init__(self, status: int, description: str, retry_after: int | None = None) -> None:
        super().__init__(description)
        self.status, self.description, self.retry_after = status, description, retry_after


def check_text(text: str, entities: list[dict[str, Any]], limit: int, what: str) -> None:
    if not text.strip():
        raise ApiError(400, f"Bad Request: {what} is empty")
    size = utf16_len(text)
    if size > limit:
        raise ApiError(400, f"Bad Request: {what} is too long")
    for e in entities:
        if e.get("offset", -1) < 0 or e.get("length", 0) <= 0 or e["offset"] + e["length"] > size:
            raise ApiError(400, f"Bad Request: can't parse entities: entity {e} is out of the text")


async def read_params(request: web.Request) -> tuple[dict[str, Any], dict[str, tuple[str, str, bytes]]]:
    """Decode a Bot API request the way Telegram does: query string, urlencoded or multipart form
    (values JSON-encoded unless they are strings), or a JSON body."""
    params: dict[str, Any] = {k: _decode(k, v) for k, v in request.query.items()}
    files: dict[str, tuple[str, str, bytes]] = {}
    if request.content_type == "application/json":
        body = await request.json() if request.can_read_body else {}
        params.update(body or {})
    elif request.can_read_body:
        form = await request.post()
        for key, value in form.items():
            if isinstance(value, web.FileField):
                files[key] = (value.filename, value.content_type, value.file.read())
            else:
                params[key] = _decode(key, str(value))
    return params, files


def _decode(key: str, value: str) -> Any:
    if key in _STRING_PARAMS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def file_ext(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:] if dot > 0 else ""
