"""The errors adapters raise and the gateway acts on (retry, park, give up, keep a channel down), and
:func:`scrub`, which keeps tokens out of their texts. Re-exported by channels/base.py, the contract.
"""

from __future__ import annotations

import re

# -- errors adapters raise; delivery and the supervisor act on them --------------------------------


_CREDENTIAL = re.compile(
    r"((?:access_key|ticket|token|secret)=)[^&\s'\"]+|(Bearer\s+)[^\s'\"]+", re.IGNORECASE
)


def scrub(text: str, *secrets: str) -> str:
    """``text`` with ``secrets`` and whatever looks like a credential (``token=…``, ``ticket=…``,
    ``Bearer …``) replaced by ``***``. SDKs put request URLs, and so tokens, into their exception
    texts and log lines: adapters scrub the texts they raise, gateway/ops/logs.py every log record."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _CREDENTIAL.sub(lambda m: (m.group(1) or m.group(2)) + "***", text)


class ChannelError(Exception):
    """Base of adapter errors. Messages must never contain a token (see :func:`scrub`)."""


class FatalChannelError(ChannelError):
    """The channel cannot work until a human acts (revoked or invalid token, missing permission).

    The supervisor keeps it down with this message as the reason instead of retrying in a loop."""


class RetryAfter(ChannelError):
    """The platform asked us to slow down (HTTP 429)."""

    def __init__(self, seconds: float, message: str = "rate limited") -> None:
        super().__init__(f"{message}; retry after {seconds:.1f}s")
        self.seconds = seconds


class TransientSendError(ChannelError):
    """A send/edit failed for a reason worth retrying (5xx, network)."""

    def __init__(self, message: str = "", *, retried: bool = False, maybe_sent: bool = False) -> None:
        super().__init__(message)
        self.retried = retried
        """The SDK already retried this failure itself (discord.py: five tries on a 500), so the
        pacer does not retry it again: one retry layer per call (docs/channels.md)."""
        self.maybe_sent = maybe_sent
        """The request went out and its answer was lost (a read timeout, the connection closed
        without an answer): the platform may have acted on it. A send that the platform cannot
        deduplicate is then not repeated blindly (gateway/delivery/reply.py, docs/durability.md)."""


class PermanentSendError(ChannelError):
    """A send/edit failed and retrying cannot help (400, 403 on that chat, message gone)."""


class NotModified(ChannelError):
    """An edit carried the text the message already had (harmless)."""
