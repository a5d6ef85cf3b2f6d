"""Logging set-up with secret redaction: every secret the daemon holds (gateway/config/secrets.py), and
whatever looks like a credential (``token=…``, ``ticket=…``, ``Bearer …``), is masked in every log line.

One filter does it (:class:`RedactingFilter`), installed on the daemon's handler, which every record
reaches, and on each SDK logger the platforms declare (``sdk_loggers`` in their settings), which
covers records an SDK prints through a handler of its own.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable

from agent.redact import Redactor
from channels.base import scrub
from gateway.config.platforms import sdk_loggers
from gateway.config.schema import Config
from gateway.config.secrets import daemon_secrets, redactor_for

QUIET = ("httpx", "httpcore", "openai", "aiosqlite", "websockets", "urllib3")
"""Libraries held at WARNING besides the platforms' SDK loggers: they log request URLs (httpx: every
one at INFO, and Telegram's carry the token) or chatter."""


_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Control characters but tab and newline, and bidirectional overrides."""


def visible(text: str) -> str:
    """``text`` with the characters a terminal acts on, or that reorder a line, shown escaped
    (``\\u001b``). Log lines and CLI listings quote names and texts strangers choose: an escape
    sequence in a display name must not reach the operator's terminal, nor a carriage return or a
    right-to-left override disguise the line."""
    return _CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def secrets_of(cfg: Config) -> list[str]:
    """Every secret value the daemon holds (gateway/config/secrets.py)."""
    return daemon_secrets(cfg)


class RedactingFilter(logging.Filter):
    """Masks ``secrets`` (every encoding, token shapes: :class:`agent.redact.Redactor`, the one
    redactor of every egress) and credential-shaped text (:func:`channels.base.scrub`: a URL's
    ``token=…``, ``Bearer …``) in a record's message and traceback. Never drops a record."""

    def __init__(self, secrets: Iterable[str] | Redactor = ()) -> None:
        super().__init__()
        self.redact = secrets if isinstance(secrets, Redactor) else Redactor(secrets)

    def mask(self, text: str) -> str:
        return visible(scrub(self.redact(text)))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is logging's to report, not ours
            return True
        masked = self.mask(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.mask(record.exc_text)
        if masked != message:
            record.msg, record.args = masked, None
        return True


class MalformedRequests(logging.Filter):
    """aiohttp's server logs every request it cannot parse (a bad character in the path, a line
    over 8 KB, a header no client sends) as an ERROR with a traceback: anyone who can reach a
    listener, before any login, wrote a traceback per request and pushed the errors that matter
    out of ``chital status`` and the console's "Recent errors". Such a record becomes one INFO line
    (the client was answered 400 by aiohttp; nothing of ours failed). Other errors stay as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        if not logging.getLogger().isEnabledFor(logging.INFO):
            return False
        # Its class, not its message: the message quotes the request (a secret in the path, cut
        # at a length of aiohttp's choosing, would keep its head past the redactor).
        client = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
        record.msg = "http: a malformed request from %s refused (%s %s)"
        record.args = (client, exc.code, type(exc).__name__)
        record.exc_info, record.exc_text = None, None
        record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def redact_loggers(names: Iterable[str], redactor: RedactingFilter) -> None:
    """Put ``redactor`` on each named logger, replacing one an earlier set-up installed."""
    for name in names:
        target = logging.getLogger(name)
        for old in [f for f in target.filters if isinstance(f, RedactingFilter)]:
            target.removeFilter(old)
        target.addFilter(redactor)


def setup_logging(cfg: Config, handler: logging.Handler | None = None) -> None:
    """Every record, redacted, to ``handler`` (default: stderr; ``chital chat`` passes a file)."""
    redactor = RedactingFilter(redactor_for(cfg))
    handler = handler or logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter
    if cfg.tracing.enabled:  # lines within a traced message end with its trace id
        from gateway.ops.trace_live import TraceFormatter as formatter
    handler.setFormatter(formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(redactor)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.log_level)
    server = logging.getLogger("aiohttp.server")
    for old in [f for f in server.filters if isinstance(f, MalformedRequests)]:
        server.removeFilter(old)
    server.addFilter(MalformedRequests())
    sdks = sdk_loggers()
    redact_loggers(sdks, redactor)
    for name in (*QUIET, *sdks):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
