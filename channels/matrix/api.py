"""The Client-Server API calls the Matrix adapter makes, their errors mapped to the contract, and
the sync token kept on disk.

Why raw requests for sync and media downloads (through nio's public ``AsyncClient.send`` and its
``Api`` path builders) rather than ``AsyncClient.sync`` / ``download``: nio parses a whole sync
batch at once, and one timeline event that is not an object makes that parse raise, so the
``since`` token never moves past it: the channel would be wedged for every room, across restarts
(the same reason the Telegram adapter fetches getUpdates raw). And ``download`` reads a body of
any size into memory; ours streams and stops at the limit.

Tokens: nio's path builders put ``access_token`` into the query; :func:`authorised` moves it into
an ``Authorization`` header (as nio's own ``_send`` does) so no URL carries it, and every error
text is scrubbed of it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

from nio import AsyncClient
from nio.responses import ErrorResponse

from channels.base import (
    ChannelError,
    FatalChannelError,
    PermanentSendError,
    RetryAfter,
    TransientSendError,
    scrub,
)
from channels.limits import read_capped

log = logging.getLogger(__name__)

TOKEN_ERRORS = frozenset({"M_UNKNOWN_TOKEN", "M_MISSING_TOKEN"})
MAX_SYNC_BYTES = 64 * 1024 * 1024
"""A sync answer larger than this is refused (a homeserver sends far less for one batch)."""


def authorised(path: str, token: str) -> tuple[str, dict[str, str]]:
    """``path`` without its ``access_token`` query parameter, and the header that carries it."""
    url = list(urlparse(path))
    query = parse_qs(url[4])
    query.pop("access_token", None)
    url[4] = urlencode(query, doseq=True)
    return urlunparse(url), {"Authorization": f"Bearer {token}"}


class Rejected(ChannelError):
    """The homeserver answered with an error (status, errcode); ``token``: it refused the token."""

    def __init__(self, status: int, errcode: str, message: str) -> None:
        super().__init__(f"HTTP {status} {errcode}: {message}"[:300])
        self.status = status
        self.errcode = errcode
        self.token = status == 401 or errcode in TOKEN_ERRORS


def error_of(status: int, body: Any, token: str) -> Rejected:
    """The :class:`Rejected` of an error answer (its ``errcode`` and ``error``, scrubbed)."""
    body = body if isinstance(body, dict) else {}
    errcode = body.get("errcode") if isinstance(body.get("errcode"), str) else ""
    message = body.get("error") if isinstance(body.get("error"), str) else ""
    rejected = Rejected(status, scrub(str(errcode)[:64], token), scrub(str(message)[:200], token))
    retry = body.get("retry_after_ms")
    rejected.retry_after = retry / 1000 if isinstance(retry, int | float) and retry >= 0 else None  # type: ignore[attr-defined]
    return rejected


def send_error(exc: Rejected) -> ChannelError:
    """The contract's error for a failed send, edit or upload."""
    if exc.token:
        return FatalChannelError(
            f"Matrix refused the access token ({exc.errcode or exc.status}); set a valid one"
        )
    if exc.status == 429 or exc.errcode == "M_LIMIT_EXCEEDED":
        seconds = getattr(exc, "retry_after", None)
        return RetryAfter(min(float(seconds if seconds is not None else 5.0), 120.0), "Matrix rate limit")
    if exc.status >= 500:
        return TransientSendError(str(exc))
    return PermanentSendError(str(exc))


def response_error(resp: Any, token: str) -> Rejected:
    """The :class:`Rejected` of one of nio's ``ErrorResponse`` values."""
    transport = getattr(resp, "transport_response", None)
    status = int(getattr(transport, "status", 0) or 0)
    errcode = resp.status_code if isinstance(resp.status_code, str) else ""
    rejected = Rejected(status, scrub(errcode[:64], token), scrub(str(resp.message or "")[:200], token))
    retry = getattr(resp, "retry_after_ms", None)
    rejected.retry_after = retry / 1000 if isinstance(retry, int | float) else None  # type: ignore[attr-defined]
    return rejected


def checked(resp: Any, token: str) -> Any:
    """``resp`` itself, or the contract's error for an ``ErrorResponse``."""
    if isinstance(resp, ErrorResponse):
        raise send_error(response_error(resp, token))
    return resp


async def get_json(client: AsyncClient, path: str, token: str, wait: float) -> Any:
    """GET ``path`` (a path from nio's ``Api``), its JSON body; :class:`Rejected` on an error
    answer, ``ConnectionError`` when no usable answer came (the caller retries)."""
    path, headers = authorised(path, token)
    resp = await client.send("GET", path, headers=headers, timeout=wait)
    try:
        raw = await read_capped(resp, MAX_SYNC_BYTES)
    finally:
        resp.release()
    if len(raw) > MAX_SYNC_BYTES:
        raise ConnectionError("Matrix answered more than 64 MB")
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if resp.status >= 400:
        raise error_of(resp.status, body, token)
    if not isinstance(body, dict):
        raise ConnectionError(f"Matrix answered HTTP {resp.status} without a JSON object")
    return body


class SyncToken:
    """The ``since`` token of the last sync batch whose events were all journaled, in a file of
    the data directory (0600, replaced atomically). Why on disk: without it a restart would sync
    from scratch, and a first sync returns the rooms' recent history, which would be answered
    again (or, skipped, lose what came while the daemon was down). The file names the homeserver
    and user it belongs to; a token for another account is not used."""

    def __init__(self, path: Path | None, homeserver: str, user_id: str) -> None:
        self.path = path
        self.owner = f"{homeserver.rstrip('/')} {user_id}"

    def load(self) -> str | None:
        if self.path is None:
            return None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        since = data.get("since") if isinstance(data, dict) else None
        if not isinstance(since, str) or data.get("owner") != self.owner:
            return None
        return since

    def save(self, since: str) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".matrix-sync-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"owner": self.owner, "since": since}, f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
