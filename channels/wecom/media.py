"""Files users send: WeCom's media URLs serve the bytes encrypted, AES-256-CBC with the message's
own ``aeskey`` (Base64, 32 bytes; the IV is its first 16 bytes; PKCS#7 padding to 32-byte blocks),
as WeCom's SDKs decrypt them. The download streams and stops at the limit, then decrypts.

``cryptography`` is imported when a file is first decrypted, not with the adapter (it is already
installed, under PyJWT and google-auth; compat/lean_imports.py defers its modules)."""

from __future__ import annotations

import base64
import binascii

import aiohttp

from channels.base import Attachment, PermanentSendError, TransientSendError
from channels.limits import check_size

BLOCK = 16


def split_file_id(attachment: Attachment) -> tuple[str, str]:
    """``(aeskey, url)`` of an attachment made by channels/wecom/inbound.py."""
    key, _, url = attachment.file_id.partition(" ")
    if not url.startswith(("https://", "http://")):
        raise PermanentSendError(f"{attachment.name}: not a WeCom media url")
    return key, url


def decrypt(data: bytes, aeskey: str) -> bytes:
    """The plain bytes of a WeCom media file; :class:`PermanentSendError` when they cannot be."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    try:
        key = base64.b64decode(aeskey + "=" * (-len(aeskey) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise PermanentSendError("the file's key cannot be read") from None
    if len(key) != 32 or not data or len(data) % BLOCK:
        raise PermanentSendError("the file is not what WeCom's encryption makes")
    decryptor = Cipher(algorithms.AES(key), modes.CBC(key[:BLOCK])).decryptor()
    plain = decryptor.update(data) + decryptor.finalize()
    pad = plain[-1]
    if not 1 <= pad <= 32 or pad > len(plain) or plain[-pad:] != bytes([pad]) * pad:
        raise PermanentSendError("the file did not decrypt (wrong key or damaged download)")
    return plain[:-pad]


async def download(session: aiohttp.ClientSession, attachment: Attachment, limit: int) -> bytes:
    """Fetch and decrypt ``attachment``; refused past ``limit`` (announced or arriving)."""
    check_size(attachment.name, attachment.size, limit, "")
    key, url = split_file_id(attachment)
    cap = limit + 32  # the padding WeCom adds
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=120)) as resp:
            if resp.status >= 500:
                raise TransientSendError(f"{attachment.name}: download failed (HTTP {resp.status})")
            if resp.status >= 400:
                raise PermanentSendError(f"{attachment.name}: download refused (HTTP {resp.status})")
            chunks: list[bytes] = []
            total = 0
            async for chunk in resp.content.iter_chunked(64 * 1024):
                chunks.append(chunk)
                total += len(chunk)
                if total > cap:
                    check_size(attachment.name, total, limit, "")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise TransientSendError(f"{attachment.name}: download failed ({type(exc).__name__})") from None
    data = b"".join(chunks)
    plain = decrypt(data, key) if key else data
    check_size(attachment.name, len(plain), limit, "")
    return plain
