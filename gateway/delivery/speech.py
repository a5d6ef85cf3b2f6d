"""An answer's text to audio, through an OpenAI-compatible ``/audio/speech`` (docs/speech.md).

The ``openai`` SDK (already here under langchain-openai) speaks the endpoint; OpenAI and
self-hosted text-to-speech servers answer it alike. What is spoken is the answer as a listener
needs it (:func:`speakable`): Markdown markers gone, code blocks and links named rather than read
out, the daemon's secrets masked *before* the text leaves for the speech service, bounded.

What comes back is not trusted: read streamed and capped at ``speech.max_bytes``, and accepted
only if it is the audio asked for (Ogg Opus or MP3, by its first bytes, whatever the
``Content-Type`` claims). Every failure becomes one short reason fit for the chat
(:class:`SpeechFailed`), never the service's own error text (it may quote the request) nor its key.
"""

from __future__ import annotations

import asyncio
import html
import ipaddress
import logging
import re
import socket
import unicodedata
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Literal
from urllib.parse import unquote

from agent.redact import MIN_SECRET_CHARS, encodings
from agent.tools.web_guard import embedded_ipv4
from gateway.config.sections import SpeechConfig

log = logging.getLogger(__name__)

OPENAI_API = "https://api.openai.com/v1"
"""Where text goes when ``speech.base_url`` is unset (and an ``api_key`` is)."""

Format = Literal["opus", "mp3"]
SUFFIX: dict[str, str] = {"opus": ".ogg", "mp3": ".mp3"}

_FENCE = re.compile(r"```[^\n]*\n.*?(?:```|\Z)", re.S)
_LINK = re.compile(r"!?\[([^\]\n]*)\]\([^)\s]*\)")
_URL = re.compile(r"<?\bhttps?://\S+>?")
_MARKERS = re.compile(r"(\*\*|__|~~|`|^#{1,6}\s+|^\s*>\s?|^\s*[-*+]\s+|^\s*\|)", re.M)
_SPACE = re.compile(r"[ \t]+")
_TAG = re.compile(r"</?[A-Za-z][^<>\n]{0,80}>")
_NOT_ALNUM = re.compile(r"[^0-9a-z]+")


class SpeechFailed(Exception):
    """The answer could not be spoken; the message is fit for the chat."""


def speakable(markdown: str, redact: Callable[[str], str], max_chars: int) -> str:
    """The answer as it should be heard: secrets masked (before and after the Markdown goes, so
    no rewriting can put one back together), code blocks replaced by "(code shown in the text)",
    links by their words, bare URLs by "a link", Markdown markers and table bars gone; at most
    ``max_chars`` characters, cut after a sentence where one ends late enough."""
    text = redact(markdown)
    text = _FENCE.sub(" (code shown in the text) ", text)
    text = _LINK.sub(r"\1", text)
    text = _URL.sub("a link", text)
    text = _TAG.sub("", text)
    text = _MARKERS.sub("", text)
    text = text.replace("|", ", ").replace("*", "")
    lines = [_SPACE.sub(" ", line).strip() for line in text.splitlines()]
    text = redact("\n".join(line for line in lines if line))
    if len(text) <= max_chars:
        return text
    tail = " The rest is in the text."
    cut = text[: max_chars - len(tail)]
    end = max(cut.rfind(". "), cut.rfind("! "), cut.rfind("? "), cut.rfind("\n"))
    if end > len(cut) // 2:
        cut = cut[: end + 1]
    return cut.rstrip() + tail


def _skeleton(text: str) -> str:
    """``text`` as a listener hears a spelled-out string: compatibility forms folded (full-width
    letters), case gone, and every character that is not a letter or digit dropped (spaces,
    dashes, table bars, line breaks, zero-width joiners, Markdown or HTML between the pieces)."""
    return _NOT_ALNUM.sub("", unicodedata.normalize("NFKC", text).casefold())


def holds_secret(text: str, secrets: Iterable[str]) -> bool:
    """Whether ``text`` still carries one of ``secrets`` (as-is, URL-quoted or in base64) once
    everything between its letters and digits is ignored, also after HTML entities and
    percent-escapes are decoded. The redactor masks a secret where it appears whole; an answer
    that spells one out in pieces ("xoxb-12 34…", a table cell per half, one character a line)
    gets past it, and a speech service must never receive it: such an answer is not spoken."""
    forms = {_TAG.sub("", text)}
    forms |= {html.unescape(f) for f in forms}
    forms |= {unquote(f) for f in forms}
    heard = [_skeleton(f) for f in forms]
    for secret in secrets:
        for variant in encodings(secret) | {secret}:
            bones = _skeleton(variant)
            if len(bones) >= MIN_SECRET_CHARS and any(bones in h for h in heard):
                return True
    return False


def is_audio(data: bytes, fmt: Format) -> bool:
    """Whether ``data`` starts like the format asked for: an Ogg page holding ``OpusHead``, or an
    MP3 (an ID3 tag or an MPEG audio frame sync)."""
    if fmt == "opus":
        return data.startswith(b"OggS") and b"OpusHead" in data[:128] and _whole_ogg(data)
    return data.startswith(b"ID3") or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0)


def _whole_ogg(data: bytes) -> bool:
    """Whether ``data`` is Ogg pages end to end: each starts with ``OggS`` version 0 and is as
    long as its segment table says, the last ends exactly at the end. A valid first page with
    garbage (an HTML error page, a cut-off download) behind it is not passed on as a voice."""
    at = 0
    while at < len(data):
        if data[at : at + 5] != b"OggS\x00" or len(data) < at + 27:
            return False
        segments = data[at + 26]
        table = data[at + 27 : at + 27 + segments]
        if len(table) < segments:
            return False
        at += 27 + segments + sum(table)
    return at == len(data)


async def synthesize(cfg: SpeechConfig, text: str, fmt: Format) -> bytes:
    """``text`` spoken, as ``fmt`` audio. Raises :class:`SpeechFailed` with a reason that says
    what went wrong: an HTTP error and its status, a timeout, no audio, text where audio should
    be, bytes that are not the audio asked for, more than ``max_bytes``."""
    import openai  # the daemon's agent imports it anyway; other commands need not

    await _check_address(cfg.base_url or OPENAI_API)
    key = cfg.api_key.get_secret_value() if cfg.api_key else "none"  # the SDK insists on some key
    # Always passed: the SDK would otherwise take $OPENAI_BASE_URL, maybe the chat model's server.
    # Redirects are not followed (the SDK would): a 307 replays the POST, the answer's text, to
    # wherever the service points, another host or a cloud metadata address.
    transport, refused = _pinned_transport()
    client = openai.AsyncOpenAI(
        api_key=key,
        base_url=cfg.base_url or OPENAI_API,
        timeout=cfg.timeout,
        max_retries=cfg.retries,
        http_client=openai.DefaultAsyncHttpxClient(follow_redirects=False, transport=transport),
    )
    try:
        # One deadline over the calls, their retries and the download: a service trickling bytes
        # forever cannot hold a speech slot longer than this.
        async with asyncio.timeout(cfg.timeout * (cfg.retries + 1) + 5):
            async with client.audio.speech.with_streaming_response.create(
                model=cfg.model, voice=cfg.voice, input=text, response_format=fmt
            ) as response:
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if kind.startswith("text/") or kind.endswith("json"):
                    log.warning("speech: the service answered %s instead of audio", kind)
                    raise SpeechFailed("the speech service sent back text instead of audio")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cfg.max_bytes:  # refused before reading
                    raise SpeechFailed(_too_big(cfg.max_bytes))
                data = await _read_capped(response.iter_bytes(), cfg.max_bytes)
    except (TimeoutError, openai.APITimeoutError):
        raise SpeechFailed(f"the speech service did not answer in time (within {cfg.timeout:g} s)") from None
    except openai.APIStatusError as exc:
        log.warning("speech failed: HTTP %s", exc.status_code)
        raise SpeechFailed(_status_reason(exc.status_code)) from None
    except openai.APIConnectionError as exc:
        if isinstance(exc.__cause__, refused):
            raise SpeechFailed(LINK_LOCAL) from None
        raise SpeechFailed("I could not reach the speech service") from None
    except openai.OpenAIError as exc:
        log.warning("speech failed: %s", type(exc).__name__)
        raise SpeechFailed("the speech service gave an answer I could not read") from None
    finally:
        await client.close()
    if not data:
        raise SpeechFailed("the speech service sent back no audio")
    if not is_audio(data, fmt):
        log.warning("speech: %d bytes back that are not %s audio", len(data), fmt)
        raise SpeechFailed(f"the speech service sent back something that is not {fmt} audio")
    return data


LINK_LOCAL = (
    "the speech service's address is link-local (like a cloud metadata service), "
    "which I never send text to (ask the admin)"
)


def _forbidden(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Link-local (169.254.169.254, fe80::/10; IPv4 inside IPv6 judged as IPv4), unspecified or
    multicast. Loopback and private addresses stay open: a self-hosted speech server lives there."""
    ip = embedded_ipv4(ip) or ip
    return ip.is_link_local or ip.is_unspecified or ip.is_multicast


async def _resolved(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """``host``'s addresses as the system resolves it (legacy spellings like ``2852039166`` too)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


async def _check_address(base_url: str) -> None:
    """Refuse a speech service whose host is, or resolves to, a forbidden address, before the SDK
    is even built (so the reason is this one, not a connection error after retries). The
    connection itself is made by :class:`_PinnedTransport`, to an address it checked."""
    import httpx2 as httpx

    url = httpx.URL(base_url)
    if url.scheme not in ("http", "https") or not url.host:
        raise SpeechFailed("the speech service's address is not an http(s) URL (ask the admin)")
    try:
        addresses = await _resolved(url.host, url.port or 443)
    except OSError:  # not resolvable here (maybe only through a proxy): the transport decides
        return
    for ip in addresses:
        if _forbidden(ip):
            log.warning("speech: refused, %s resolves to %s", url.host, ip)
            raise SpeechFailed(LINK_LOCAL)


def _pinned_transport() -> Any:
    """An httpx transport that resolves the host once, checks the addresses it got and connects to
    the first allowed one as an IP literal (the ``Host`` header and, for https, the TLS server
    name and certificate check stay the name's, through httpx's ``sni_hostname`` extension). So
    the address judged is the address connected to: a name that answers differently a moment
    later (DNS rebinding) cannot turn the call toward a metadata service."""
    import httpx2 as httpx

    class Refused(httpx.ConnectError):
        """The host has no address the speech service may be reached at."""

    class PinnedTransport(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            host = request.url.host
            try:
                addresses = await _resolved(host, request.url.port or 443)
            except OSError as exc:
                raise httpx.ConnectError(f"cannot resolve {host}: {type(exc).__name__}") from None
            allowed = [ip for ip in addresses if not _forbidden(ip)]
            if len(allowed) < len(addresses) or not allowed:
                log.warning("speech: refused, %s resolves to %s", host, ", ".join(map(str, addresses)))
                raise Refused(LINK_LOCAL)
            if request.url.scheme == "https":
                request.extensions = {**request.extensions, "sni_hostname": host}
            url = request.url
            for n, ip in enumerate(allowed):  # as a resolver's client would: each address in turn
                request.url = url.copy_with(host=str(ip))
                try:
                    return await super().handle_async_request(request)
                except httpx.ConnectError:  # nothing was sent: the next address may take it
                    if n == len(allowed) - 1:
                        raise
            raise AssertionError("unreachable")

    return PinnedTransport(), Refused


async def _read_capped(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    out = bytearray()
    async for chunk in chunks:
        out += chunk
        if len(out) > limit:
            raise SpeechFailed(_too_big(limit))
    return bytes(out)


def _too_big(limit: int) -> str:
    return f"the speech service sent back more than {limit // 1024} KB of audio"


def _status_reason(status: int) -> str:
    if 300 <= status < 400:
        return f"the speech service redirected me elsewhere (HTTP {status}); I do not follow (ask the admin)"
    if status in (401, 403):
        return "the speech service refused my key (ask the admin)"
    if status == 429:
        return "the speech service is busy"
    if status >= 500:
        return f"the speech service failed (HTTP {status})"
    return f"the speech service refused the request (HTTP {status}; the admin should check model and voice)"
