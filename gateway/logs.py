"""Logging set-up with secret redaction: every configured token is masked in every log line."""

from __future__ import annotations

import logging
import sys

from .config import Config


def secrets_of(cfg: Config) -> list[str]:
    found: list[str] = []

    def walk(node: object) -> None:
        if hasattr(node, "get_secret_value"):
            value = node.get_secret_value()
            if value:
                found.append(value)
        elif hasattr(node, "model_fields"):
            for name in type(node).model_fields:
                walk(getattr(node, name))
            for value in (getattr(node, "model_extra", None) or {}).values():
                walk(value)
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item)
        elif isinstance(node, str) and node.startswith(("sk-", "xox", "xapp-")):
            found.append(node)

    walk(cfg)
    for spec in cfg.models:
        key = spec.kwargs().get("api_key")
        if isinstance(key, str) and key:
            found.append(key)
    return sorted({s for s in found if len(s) >= 6}, key=len, reverse=True)


class RedactingFilter(logging.Filter):
    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self._secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._secrets:
            return True
        message = record.getMessage()
        masked = message
        for secret in self._secrets:
            if secret in masked:
                masked = masked.replace(secret, "***")
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            for secret in self._secrets:
                record.exc_text = record.exc_text.replace(secret, "***")
        if masked != message:
            record.msg, record.args = masked, None
        return True


def setup_logging(cfg: Config) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter(secrets_of(cfg)))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.log_level)
    # Libraries that log request URLs (Telegram puts the token in the URL) stay at WARNING.
    for noisy in (
        "httpx",
        "httpcore",
        "telegram",
        "discord",
        "slack_sdk",
        "slack_bolt",
        "Lark",
        "openai",
        "aiosqlite",
        "websockets",
        "urllib3",
    ):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
