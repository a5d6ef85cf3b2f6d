"""Files users send: WeCom's media URLs serve the bytes encrypted, AES-256-CBC with the message's
own ``aeskey`` (Base64, 32 bytes; the IV is its first 16 bytes; PKCS#7 padding to 32-byte blocks),
as WeCom's SDKs decrypt them. The download streams and stops at the limit, then decrypts.

Where a download may go: the URL comes from a callback, so it is checked before anything is
fetched (:func:`check_url`): ``https`` to a host whose every address is a public one, or the origin
of the configured long connection itself (a privately deployed WeCom, the tests' fake). Redirects
are followed by hand, each hop checked the same way, so a public URL cannot bounce the daemon to
its cloud's metadata service or a port on localhost. The check is made again on the address the
download actually connects to: the download's own connector resolves names through
:class:`PublicResolver`, which hands aiohttp only addresses that pass, so a name that resolves to a
public address for the check and to an inside one a moment later (DNS rebinding) gets no
connection. The body is read as sent
(``auto_decompress=False``): an encrypted file needs no ``Content-Encoding``, and a gzip bomb would
otherwise be inflated before the byte cap sees it.

``cryptography`` is imported when a file is first decrypted, not with the adapter (it is already
installed, under PyJWT and google-auth; compat/lean_imports.py defers its modules)."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import socket

import aiohttp
import yarl
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from channels.base import Attachment, PermanentSendError, TransientSendError
from channels.limits import check_size

BLOCK = 16
MAX_REDIRECTS = 3
IDENTITY = {"Accept-Encoding": "identity"}
"""Asked of the file server, so an honest one never compresses what is read uninflated."""
_HTTP = {"ws": "http", "wss": "https", "http": "http", "https": "https"}


def split_file_id(attachment: Attachment) -> tuple[str, str]:
    """``(aeskey, url)`` of an attachment made by channels/wecom/inbound.py."""
    key, _, url = attachment.file_id.partition(" ")
    if not url.startswith(("https://", "http://")):
        raise PermanentSendError(f"{attachment.name}: not a WeCom media url")
    return key, url


def _origin(url: str) -> tuple[str, str, int | None] | None:
    """``(scheme, host, port)`` as aiohttp will read ``url`` (with yarl, its own parser: a URL
    the standard library reads another way, a backslash before ``@``, cannot slip between them)."""
    try:
        parts = yarl.URL(url)
        scheme = _HTTP.get(parts.scheme.lower(), "")
        port = parts.explicit_port or {"http": 80, "https": 443}.get(scheme)
        host = (parts.host or "").lower()
    except (ValueError, TypeError):
        return None
    return (scheme, host, port) if scheme and host else None


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is not None:
            return _public(inner)
    return ip.is_global and not ip.is_multicast


async def check_url(name: str, url: str, home: str, resolver: AbstractResolver | None = None) -> None:
    """Refuse (:class:`PermanentSendError`) a media ``url`` that is neither ``https`` to public
    addresses only nor on the origin of ``home`` (the configured websocket address); names are
    resolved by ``resolver`` (the system's by default)."""
    origin = _origin(url)
    if origin is None:
        raise PermanentSendError(f"{name}: not a WeCom media url")
    if origin == _origin(home):
        return
    scheme, host, port = origin
    if scheme != "https":
        raise PermanentSendError(f"{name}: refused, WeCom media comes over https only")
    inner = resolver or DefaultResolver()
    try:
        infos = await inner.resolve(host, port or 443, socket.AF_UNSPEC)
    except OSError:
        raise TransientSendError(f"{name}: download failed (the file's host did not resolve)") from None
    finally:
        if resolver is None:
            await inner.close()
    for info in infos:
        if not _public(ipaddress.ip_address(str(info["host"]).split("%", 1)[0])):
            raise PermanentSendError(f"{name}: refused, the file's address is not a public one")


class PublicResolver(AbstractResolver):
    """The resolver of a download's connector: every address of a name must be public (the home
    origin's host excepted), or the name resolves to nothing aiohttp may use. aiohttp connects only
    to what its resolver returns, so this judges the address actually connected to. An IP literal
    skips resolvers; :func:`check_url` has judged it, and a literal cannot change."""

    def __init__(self, home_host: str, inner: AbstractResolver | None = None) -> None:
        self._home = home_host
        self._inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        infos = await self._inner.resolve(host, port, family)
        if host.lower() == self._home:
            return infos
        for info in infos:
            if not _public(ipaddress.ip_address(str(info["host"]).split("%", 1)[0])):
                raise OSError(f"{host} resolved to an address that is not a public one")
        return infos

    async def close(self) -> None:
        await self._inner.close()


def key_of(aeskey: str) -> bytes:
    """The 32-byte AES key of a message's ``aeskey``; :class:`PermanentSendError` when it is not
    one (checked before the download: a file that cannot be decrypted is not fetched)."""
    try:
        key = base64.b64decode(aeskey + "=" * (-len(aeskey) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise PermanentSendError("the file's key cannot be read") from None
    if len(key) != 32:
        raise PermanentSendError("the file's key cannot be read")
    return key


def decrypt(data: bytes, aeskey: str) -> bytes:
    """The plain bytes of a WeCom media file; :class:`PermanentSendError` when they cannot be."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = key_of(aeskey)
    if not data or len(data) % BLOCK:
        raise PermanentSendError("the file is not what WeCom's encryption makes")
    decryptor = Cipher(algorithms.AES(key), modes.CBC(key[:BLOCK])).decryptor()
    plain = decryptor.update(data) + decryptor.finalize()
    pad = plain[-1]
    if not 1 <= pad <= 32 or pad > len(plain) or plain[-pad:] != bytes([pad]) * pad:
        raise PermanentSendError("the file did not decrypt (wrong key or damaged download)")
    return plain[:-pad]


async def download(
    attachment: Attachment, limit: int, home: str = "", resolver: AbstractResolver | None = None
) -> bytes:
    """Fetch and decrypt ``attachment``; refused past ``limit`` (announced or arriving), and
    where :func:`check_url` refuses its URL or a redirect's (``home``: the websocket address).
    A session of its own whose connector resolves through :class:`PublicResolver` (``resolver``:
    the one it wraps, the system's by default)."""
    origin = _origin(home)
    inner = resolver or DefaultResolver()
    connector = aiohttp.TCPConnector(resolver=PublicResolver(origin[1] if origin else "", inner))
    async with aiohttp.ClientSession(connector=connector) as session:
        return await _download(session, attachment, limit, home, inner)


async def _download(
    session: aiohttp.ClientSession, attachment: Attachment, limit: int, home: str, resolver: AbstractResolver
) -> bytes:
    check_size(attachment.name, attachment.size, limit, "")
    key, url = split_file_id(attachment)
    if key:
        key_of(key)
    cap = limit + 32  # the padding WeCom adds
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        for _ in range(MAX_REDIRECTS + 1):
            await check_url(attachment.name, url, home, resolver)
            resp = await session.get(url, timeout=timeout, allow_redirects=False, auto_decompress=False,
                                     headers=IDENTITY)  # fmt: skip
            if resp.status not in (301, 302, 303, 307, 308):
                break
            location = resp.headers.get("Location", "")
            resp.release()
            try:
                url = str(yarl.URL(url).join(yarl.URL(location)))
            except ValueError:
                raise PermanentSendError(f"{attachment.name}: download refused (a bad redirect)") from None
        else:
            raise PermanentSendError(f"{attachment.name}: download refused (too many redirects)")
        async with resp:
            if resp.status >= 500:
                raise TransientSendError(
                    f"{attachment.name}: WeCom's file server failed (HTTP {resp.status}); "
                    "please send it again in a moment"
                )
            if resp.status >= 400:
                raise PermanentSendError(
                    f"{attachment.name}: download refused (HTTP {resp.status}); its link may have "
                    "expired: please send the file again"
                )
            chunks: list[bytes] = []
            total = 0
            async for chunk in resp.content.iter_chunked(64 * 1024):
                chunks.append(chunk)
                total += len(chunk)
                if total > cap:
                    check_size(attachment.name, total, limit, "")
    except (aiohttp.ClientError, TimeoutError) as exc:
        what = "timed out" if isinstance(exc, TimeoutError) else "broke off"
        raise TransientSendError(f"{attachment.name}: the download {what}; please send it again") from None
    data = b"".join(chunks)
    plain = decrypt(data, key) if key else data
    check_size(attachment.name, len(plain), limit, "")
    return plain
