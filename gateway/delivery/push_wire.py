"""The two push protocols on the wire: the request for one notification, and what an answer means.

Pure functions (no network), so the protocol facts sit in one place (docs/push.md says where they
were checked):

- **Bark** (bark-server API v2): ``POST {server}/push`` with a JSON body ``device_key``, ``title``,
  ``body`` and optional ``group``, ``level``, ``url``. The device key goes in the body, never in
  the URL (a URL ends up in proxies' logs). APNs caps a notification's payload at 4 KB, the JSON
  and Bark's own fields included, so the body is cut at :data:`BARK_BODY_BYTES`.
- **ntfy**: ``POST {server}/{topic}`` with the message as the body and ``Title``, ``Priority``,
  ``Tags``, ``Markdown`` headers; ``Authorization: Bearer`` (a token) or basic auth. A message
  over 4,096 bytes (ntfy's default ``message-size-limit``) is turned into an attachment, so the
  body is cut at :data:`NTFY_BODY_BYTES`. ``X-Sequence-ID`` (ntfy 2.16+) names the notification:
  a second publish with the same id updates it instead of adding one (see docs/push.md, "Once").

Header values are built here, never taken raw: a title loses its control characters (CR/LF cannot
start a header of its own) and a non-ASCII one is sent as an RFC 2047 encoded word, which ntfy
decodes (HTTP header values are ASCII on the wire).
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.config.push import PushTarget

BARK_BODY_BYTES = 3000
"""Bark body cut: APNs allows 4,096 bytes per payload, and the title, group and Bark's own
fields share it."""
NTFY_BODY_BYTES = 4096
"""ntfy's default message limit; a longer body becomes an attachment named attachment.txt."""
TITLE_CHARS = 200
CUT_MARK = "\n… [truncated]"
"""Ends a body that was cut to fit, so the reader knows there was more."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]+")


@dataclass(frozen=True)
class PushRequest:
    """One HTTP request: everything ``httpx`` needs, nothing it has to guess."""

    url: str
    headers: dict[str, str]
    content: bytes
    truncated: bool
    json: dict[str, Any] | None = field(default=None)


def clip_bytes(text: str, limit: int) -> tuple[str, bool]:
    """``text`` in at most ``limit`` UTF-8 bytes, with :data:`CUT_MARK` when it had to be cut (on a
    character boundary: a cut never leaves half a character)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    room = limit - len(CUT_MARK.encode("utf-8"))
    return data[:room].decode("utf-8", "ignore").rstrip() + CUT_MARK, True


def one_line(title: str) -> str:
    """A title as one line: control characters (CR, LF, NUL, line separators) become spaces."""
    return _CONTROL.sub(" ", title).strip()[:TITLE_CHARS]


def header_value(text: str) -> str:
    """An ASCII header value: as-is when it is ASCII, else an RFC 2047 ``=?UTF-8?B?…?=`` word."""
    text = one_line(text)
    if text.isascii():
        return text
    return "=?UTF-8?B?" + base64.b64encode(text.encode("utf-8")).decode("ascii") + "?="


def sequence_id(key: str) -> str:
    """A stable ntfy sequence id for one journal entry: the same push sent again after a crash
    carries the same id, and an ntfy 2.16+ client updates the notification instead of adding one."""
    return "chital-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def build(target: PushTarget, key: str, title: str, body: str) -> PushRequest:
    """The request that posts ``body`` under ``title`` to ``target`` (both already masked)."""
    title = one_line(title) or target.title
    if target.kind == "bark":
        assert target.device_key is not None  # the config's validator requires it
        text, cut = clip_bytes(body, BARK_BODY_BYTES)
        payload: dict[str, Any] = {
            "device_key": target.device_key.get_secret_value(),
            "title": title,
            "body": text,
        }
        if target.group:
            payload["group"] = target.group
        if target.level:
            payload["level"] = target.level
        if target.url:
            payload["url"] = target.url
        return PushRequest(f"{target.server}/push", {}, b"", cut, payload)
    assert target.topic is not None
    text, cut = clip_bytes(body, NTFY_BODY_BYTES)
    headers = {
        "Title": header_value(title),
        "Priority": str(target.priority),
        "Markdown": "yes" if target.markdown else "no",
        "X-Sequence-ID": sequence_id(key),
        "Content-Type": "text/plain; charset=utf-8",
    }
    if target.tags:
        headers["Tags"] = ",".join(target.tags)
    headers.update(auth_headers(target))
    url = f"{target.server}/{target.topic.get_secret_value()}"
    return PushRequest(url, headers, text.encode("utf-8"), cut)


def auth_headers(target: PushTarget) -> dict[str, str]:
    """ntfy's ``Authorization``: a bearer token, or basic auth; none without credentials."""
    if target.token is not None:
        return {"Authorization": f"Bearer {target.token.get_secret_value()}"}
    if target.username and target.password is not None:
        pair = f"{target.username}:{target.password.get_secret_value()}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode("ascii")}
    return {}


# -- answers ----------------------------------------------------------------------------------------
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
_REFUSALS = {
    400: "the server rejected the request as malformed (HTTP 400)",
    401: "the server refused the credentials (HTTP 401): check the target's token or password",
    403: "the server refused access (HTTP 403): the token or user may not publish there",
    404: "the server knows no such target (HTTP 404): check the server URL and device key or topic",
    413: "the server found the notification too large (HTTP 413)",
}


def refusal(kind: str, status: int) -> str:
    """What a permanent refusal means, in words an operator can act on (never the server's raw
    text, which may echo the device key or topic)."""
    if kind == "bark" and status == 400:  # bark-server answers an unknown device key so
        return "the Bark server rejected it (HTTP 400): check the device_key (the app shows it)"
    if status in _REFUSALS:
        return _REFUSALS[status]
    if 300 <= status < 400:
        return f"the server redirected the request (HTTP {status}): set server to the final URL"
    return f"the server refused the notification (HTTP {status})"


def retry_after(value: str | None, default: float, cap: float) -> float:
    """Seconds to wait from a ``Retry-After`` header (seconds; an HTTP date is not worth trusting
    from a push server's clock), else ``default``; never more than ``cap``."""
    if value:
        try:
            seconds = float(value.strip())
        except ValueError:
            seconds = default
        if seconds == seconds and seconds >= 0:  # not NaN
            return min(seconds, cap)
    return min(default, cap)
