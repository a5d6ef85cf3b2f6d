"""The Graph API calls the WhatsApp adapter makes, over aiohttp, their errors mapped to the contract.

Why not a WhatsApp SDK: pywa (the best-kept one, 4.5) pins its Graph client to
``https://graph.facebook.com`` (``GraphAPI.__init__`` overwrites the session's ``base_url``), so it
cannot be pointed at the wire-level fake the tests run against without reaching into its privates,
and its webhook side is Flask/FastAPI, not the daemon's aiohttp listener. The REST surface used here
is small and documented (messages, media), so it is spoken directly.

Graph's error answer is ``{"error": {"message", "type", "code", "error_subcode", "fbtrace_id"}}``;
:func:`send_error` maps its ``code`` (docs/setup/whatsapp.md lists the ones that matter). The token
travels in an ``Authorization`` header only; every error text is scrubbed of it.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import urlparse

import aiohttp

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

TOKEN_CODES = frozenset({190, 102})
"""Graph's codes for an access token that is invalid, expired or revoked."""
OUTSIDE_WINDOW = 131047
"""Re-engagement message: more than 24 hours since the user last wrote; only a template may go."""
RATE_CODES = frozenset({4, 80007, 130429, 131048, 131056, 613})
TRANSIENT_CODES = frozenset({1, 2, 131000, 131016, 133004})
MAX_ANSWER_BYTES = 1_000_000
MEDIA_HOSTS = (".fbsbx.com", ".facebook.com", ".whatsapp.net", ".fbcdn.net")
"""Hosts Meta serves media from: the bearer token goes to them (https) or to the Graph URL only."""


class GraphError(ChannelError):
    """Graph answered with an error (HTTP status, Graph ``code``). ``message`` is only ever our own
    words: Graph's text is the platform's, not ours to show (it reached the chat as a note, links,
    mentions and bidi overrides included), so :func:`error_of` logs it escaped and leaves it out."""

    def __init__(self, status: int, code: int, message: str = "") -> None:
        super().__init__(f"HTTP {status}, Graph error {code}" + (f": {message}" if message else ""))
        self.status, self.code = status, code

    @property
    def token(self) -> bool:
        return self.code in TOKEN_CODES or self.status == 401


class OutsideWindow(PermanentSendError):
    """The user last wrote more than 24 hours ago: WhatsApp takes no free-form message until they
    write again (error 131047). Retrying cannot help; the operator is told (channel notice, log)."""


def error_of(status: int, body: Any, token: str) -> GraphError:
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    code = err.get("code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else 0
    message = err.get("message") if isinstance(err.get("message"), str) else ""
    if message:  # repr: control characters and bidi overrides escaped; the token scrubbed
        log.info("whatsapp: Graph error %s said %r", code, scrub(message[:200], token))
    return GraphError(status, code)


def send_error(exc: GraphError) -> ChannelError:
    """The contract's error for a failed call."""
    if exc.token:
        return FatalChannelError(
            f"WhatsApp refused the access token (Graph error {exc.code or exc.status}); set a valid one"
        )
    if exc.code == OUTSIDE_WINDOW:
        return OutsideWindow(
            "WhatsApp refused the reply: the user last wrote more than 24 hours ago (error 131047)"
        )
    if exc.status == 429 or exc.code in RATE_CODES:
        return RetryAfter(5.0, f"WhatsApp rate limit (Graph error {exc.code})")
    if exc.status >= 500 or exc.code in TRANSIENT_CODES:
        return TransientSendError(str(exc))
    return PermanentSendError(str(exc))


class Graph:
    """The Graph API for one phone number: one aiohttp session, the bearer token in a header."""

    def __init__(self, graph_url: str, api_version: str, phone_number_id: str, token: str) -> None:
        self.base = graph_url.rstrip("/")
        self.version = api_version
        self.number = phone_number_id
        self._token = token
        self._session: aiohttp.ClientSession | None = None
        self.refused = False
        """The token was refused for good (checked twice): every later call fails here, without
        a request, so deliveries the gateway retries never hammer Graph with a dead token."""

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        return self._session

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}

    def url(self, *parts: str) -> str:
        return "/".join((self.base, self.version, *parts))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, url: str, **kwargs: Any) -> dict[str, Any]:
        """One request, its JSON object; :class:`GraphError` on an error answer, ``ConnectionError``
        when no usable answer came. Errors are scrubbed of the token."""
        if self.refused:
            raise GraphError(401, 190, "the access token was refused earlier; set a valid one and restart")
        try:
            async with self.session.request(method, url, headers=self._headers(), **kwargs) as resp:
                raw = await read_capped(resp, MAX_ANSWER_BYTES)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConnectionError(f"Graph request failed: {type(exc).__name__}") from None
        try:
            body = json.loads(raw) if len(raw) <= MAX_ANSWER_BYTES else None
        except (ValueError, RecursionError):
            body = None
        if status >= 400:
            raise error_of(status, body, self._token)
        if not isinstance(body, dict):
            raise ConnectionError(f"Graph answered HTTP {status} without a JSON object")
        return body

    async def send(self, payload: dict[str, Any]) -> str:
        """POST /{version}/{phone_number_id}/messages; the new message's wamid."""
        body = {"messaging_product": "whatsapp", **payload}
        try:
            answer = await self.call("POST", self.url(self.number, "messages"), json=body)
        except GraphError as exc:
            raise send_error(exc) from None
        except ConnectionError as exc:
            raise TransientSendError(str(exc), maybe_sent=True) from None
        messages = answer.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        wamid = first.get("id") if isinstance(first, dict) else None
        return wamid if isinstance(wamid, str) else ""

    async def whoami(self) -> dict[str, Any]:
        """The phone number's record (checks the token and the id); raises :class:`GraphError`."""
        return await self.call(
            "GET", self.url(self.number), params={"fields": "display_phone_number,verified_name"}
        )

    def media_allowed(self, url: str) -> bool:
        """Whether the bearer token may be sent to a media ``url`` Graph gave us: Meta's media
        hosts over https, or the Graph URL's own origin (a proxy; the tests' fake)."""
        parsed, base = urlparse(url), urlparse(self.base)
        if (parsed.scheme, parsed.netloc) == (base.scheme, base.netloc):
            return True
        host = parsed.hostname or ""
        return parsed.scheme == "https" and any(host.endswith(h) for h in MEDIA_HOSTS)

    async def upload(self, data: bytes, mime: str, name: str) -> str:
        """POST /{version}/{phone_number_id}/media (multipart); the media id."""
        form = aiohttp.FormData()
        form.add_field("messaging_product", "whatsapp")
        form.add_field("type", mime)
        form.add_field("file", data, filename=name, content_type=mime)
        try:
            answer = await self.call("POST", self.url(self.number, "media"), data=form)
        except GraphError as exc:
            raise send_error(exc) from None
        except ConnectionError as exc:
            raise TransientSendError(str(exc)) from None
        media_id = answer.get("id")
        if not isinstance(media_id, str) or not media_id:
            raise TransientSendError("the media upload answered without an id")
        return media_id

    async def download(self, media_id: str, limit: int) -> tuple[bytes, int | None]:
        """The media's bytes (at most ``limit + 1`` read: the caller refuses more) and the size
        Graph announced. GET /{version}/{media_id} gives a short-lived URL, fetched with the bearer."""
        try:
            meta = await self.call("GET", self.url(media_id))
        except GraphError as exc:
            raise send_error(exc) from None
        except ConnectionError as exc:
            raise TransientSendError(str(exc)) from None
        url, size = meta.get("url"), meta.get("file_size")
        size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
        if not isinstance(url, str) or not self.media_allowed(url):
            raise PermanentSendError("the media URL is not one of Meta's media hosts")
        if size is not None and size > limit:
            return b"", size
        try:
            async with self.session.get(url, headers=self._headers()) as resp:
                if resp.status >= 400:
                    raise send_error(GraphError(resp.status, 0, "media download refused"))
                chunks: list[bytes] = []
                total = 0
                while total <= limit:
                    chunk = await resp.content.read(min(64 * 1024, limit + 1 - total))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientSendError(f"media download failed ({type(exc).__name__})") from None
        return b"".join(chunks), size
