"""DingTalk's OpenAPI over aiohttp: the app access token and the robot's send calls.

Why not the SDK's own helpers: ``dingtalk_stream`` calls the OpenAPI with blocking ``requests``
(which would stall the daemon's event loop for the length of every call) and swallows every error
into ``None``, so a revoked secret and a network blip look the same. Here each call is async, its
answer's DingTalk error body (``{"code": ..., "message": ..., "requestid": ...}``) becomes one of
the channel errors, and the secret never appears in an error (it is only in the token request's
body).

The access token (``POST /v1.0/oauth2/accessToken``) is cached until five minutes before its
``expireIn``; an answer that says the token is no longer valid drops the cache and the call is made
once more with a fresh one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

import aiohttp

from channels.base import FatalChannelError, PermanentSendError, RetryAfter, TransientSendError
from channels.limits import read_capped, retry_after

log = logging.getLogger(__name__)

TOKEN_PATH = "/v1.0/oauth2/accessToken"
TOKEN_HEADER = "x-acs-dingtalk-access-token"
TOKEN_MARGIN = 300.0
"""Seconds before its announced expiry a token is renewed (the SDK's own margin)."""
MAX_BODY = 1024 * 1024
"""An OpenAPI answer larger than this is not read (a robot call answers a few hundred bytes)."""
THROTTLED = ("Throttling", "QpsLimit", "qpsLimit", "LimitExceeded", "FlowControl")
TOKEN_CODES = (
    "InvalidAuthentication",
    "invalidAccessToken",
    "Unauthorized",
    "tokenExpired",
    "40014",
    "42001",
)
"""Codes that mean the access token itself is no longer good (the old API's 40014 invalid, 42001
expired)."""


SAFE_CODE = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""A DingTalk error code shown as is (``invalidParameter``, ``Forbidden.AccessDenied``, ``40014``)."""


class Refused(Exception):
    """DingTalk answered an OpenAPI call with an error (HTTP status and DingTalk's ``code``).

    Its text is ours: DingTalk's ``message`` (and a ``code`` that is no plain identifier) is the
    platform's text, which reached the chat in a note (links, @all, bidi overrides included), so it
    is logged escaped (``repr``) and left out of the exception."""

    def __init__(self, status: int, code: str, message: str, retry: float = 2.0) -> None:
        shown = code if SAFE_CODE.fullmatch(code) else ""
        if message or code != shown:
            log.info("dingtalk: HTTP %s, code %r said %r", status, code[:100], message[:200])
        super().__init__(f"HTTP {status} {shown or 'error'}")
        self.status = status
        self.code = code
        self.retry = retry
        """Seconds to wait when throttled (``Retry-After``, else 2)."""

    @property
    def token(self) -> bool:
        """The access token itself was refused (expired or revoked): renew it and try once more."""
        return self.status == 401 or any(c.lower() in self.code.lower() for c in TOKEN_CODES)

    @property
    def throttled(self) -> bool:
        return self.status == 429 or any(c.lower() in self.code.lower() for c in THROTTLED)


class OpenApi:
    """One app's calls to DingTalk's OpenAPI (one aiohttp session, one cached token)."""

    def __init__(self, base: str, client_id: str, client_secret: str) -> None:
        self.base = base.rstrip("/")
        self._id = client_id
        self._secret = client_secret
        self._session: aiohttp.ClientSession | None = None
        self._token = ""
        self._expires = 0.0
        self._lock = asyncio.Lock()
        self.refused: str | None = None
        """Why DingTalk refused the app's credentials (set once it did; the channel then stops)."""

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def raw_post(
        self,
        path: str,
        body: dict[str, Any] | aiohttp.FormData,
        headers: dict[str, str] | None = None,
        *,
        base: str = "",
        params: dict[str, str] | None = None,
        method: str = "POST",
    ) -> Any:
        """POST (or ``method``) ``body`` (JSON, or a multipart form); the JSON answer, or
        :class:`Refused` with DingTalk's error code."""
        url = (base or self.base).rstrip("/") + path
        kw: dict[str, Any] = {"data": body} if isinstance(body, aiohttp.FormData) else {"json": body}
        async with self.session().request(method, url, headers=headers or {}, params=params, **kw) as resp:
            raw = await read_capped(resp, MAX_BODY)
            try:
                data = json.loads(raw) if raw and len(raw) <= MAX_BODY else {}
            except (ValueError, RecursionError):
                data = {}
            if resp.status >= 400 or (isinstance(data, dict) and _errcode(data)):
                data = data if isinstance(data, dict) else {}
                code, message = _errcode(data) or str(data.get("code") or ""), str(data.get("message") or "")
                raise Refused(resp.status, code, message,
                              retry_after(resp.headers.get("Retry-After"), default=2.0))  # fmt: skip
            return data

    async def token(self, *, fresh: bool = False) -> str:
        """The app's access token, from the cache while it is valid."""
        async with self._lock:
            if not fresh and self._token and time.monotonic() < self._expires:
                return self._token
            try:
                body = await self.raw_post(TOKEN_PATH, {"appKey": self._id, "appSecret": self._secret})
            except Refused as exc:
                if exc.status in (400, 401, 403):
                    self.refused = (
                        f"DingTalk refused the app's credentials ({exc.code or exc.status}); "
                        "the Client Secret is revoked or wrong, set a valid one"
                    )
                    raise FatalChannelError(self.refused) from None
                raise
            token, ttl = body.get("accessToken"), body.get("expireIn")
            if not isinstance(token, str) or not token or not isinstance(ttl, int | float):
                raise ConnectionError("an access token answer without accessToken/expireIn")
            self._token = token
            self._expires = time.monotonic() + max(float(ttl) - TOKEN_MARGIN, 30.0)
            return token

    async def _send_token(self, *, fresh: bool) -> str:
        """The token for a send: refused credentials fail the send for good (the stream loop sees
        :attr:`refused` and stops the channel; a reply is no place to stop it)."""
        try:
            return await self.token(fresh=fresh)
        except FatalChannelError as exc:
            raise PermanentSendError(str(exc)) from None

    async def call(self, path: str, body: dict[str, Any], method: str = "POST") -> dict[str, Any]:
        """An authorised OpenAPI call, mapped to the channel errors (a refused token is renewed
        once; a network failure after the request went out may have been acted on)."""
        for attempt in range(2):
            try:
                token = await self._send_token(fresh=attempt > 0)
                data = await self.raw_post(path, body, {TOKEN_HEADER: token}, method=method)
                return data if isinstance(data, dict) else {}
            except Refused as exc:
                if exc.token and attempt == 0:
                    continue
                raise send_error(exc) from None
            except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
                raise TransientSendError(
                    f"DingTalk request failed: {type(exc).__name__}", maybe_sent=True
                ) from None
        raise TransientSendError("DingTalk refused a fresh access token")

    async def upload(self, oapi_base: str, data: bytes, name: str, kind: str) -> str:
        """A robot file's ``media_id`` (the older API's ``/media/upload``; the token goes in the
        query there, and no error here repeats the URL). Not idempotent: a repeat after a lost
        answer leaves an unused upload, nothing the user sees."""
        for attempt in range(2):
            form = aiohttp.FormData()
            form.add_field("type", kind)
            form.add_field("media", data, filename=name, content_type="application/octet-stream")
            try:
                token = await self.token(fresh=attempt > 0)
                answer = await self.raw_post(
                    "/media/upload", form, base=oapi_base, params={"access_token": token}
                )
            except Refused as exc:
                if exc.token and attempt == 0:
                    continue
                raise send_error(exc) from None
            except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
                raise TransientSendError(f"DingTalk upload failed: {type(exc).__name__}") from None
            media = answer.get("media_id") if isinstance(answer, dict) else None
            if not isinstance(media, str) or not media:
                raise TransientSendError("DingTalk answered the upload without a media_id")
            return media
        raise TransientSendError("DingTalk refused a fresh access token")


def _errcode(data: dict[str, Any]) -> str:
    """DingTalk's error code of an answer: ``code`` on the new API, ``errcode`` != 0 on the old."""
    code = data.get("code")
    if isinstance(code, str) and code and "message" in data:
        return code
    errcode = data.get("errcode")
    if isinstance(errcode, int) and errcode != 0:
        return str(errcode)
    return ""


def send_error(exc: Refused) -> Exception:
    """The channel error for a refused send: throttling waits, 5xx retries, the rest is final."""
    if exc.throttled:
        return RetryAfter(exc.retry, "DingTalk is throttling the robot")
    if exc.status >= 500:
        return TransientSendError(f"DingTalk answered {exc}")
    return PermanentSendError(f"DingTalk refused the message: {exc}")
