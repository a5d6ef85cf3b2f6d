"""How the console shows a value people or the model chose: masked, made visible, bounded."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any

import markupsafe

from gateway.ops.logs import visible

TEXT_CHARS = 2000
"""Longest text one template expression shows (a message, a name): the rest is cut with an ellipsis."""


def shown(value: Any, redact: Callable[[str], str], limit: int = TEXT_CHARS) -> Any:
    """Every ``{{ … }}`` of every template passes here before Jinja escapes it: strings are masked
    by the daemon's secrets, their control, bidi and zero-width characters made visible, and cut at
    :data:`TEXT_CHARS` or ``limit`` (they are names and texts users and the model chose)."""
    if value is None:
        return ""
    if not isinstance(value, str) or isinstance(value, markupsafe.Markup):
        return value  # Markup: a macro's output, whose own expressions passed here already
    text = made_visible(redact(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def made_visible(text: str) -> str:
    """``text`` with its control, bidi and other format characters (but the zero-width joiner of
    emoji sequences) written as ``\\uXXXX``: newlines and tabs stay."""
    text = visible(text)
    if text.isascii():  # no format character is ASCII; the controls are visible() already
        return text
    return "".join(
        f"\\u{ord(c):04x}" if unicodedata.category(c) == "Cf" and c != "\u200d" else c for c in text
    )


def one_line(text: str, limit: int = 300, redact: Callable[[str], str] | None = None) -> str:
    """``text`` for one log line: a newline or carriage return in it (a path's ``%0a``, anyone's,
    before any login) would start a forged line of its own (so would U+2028 for a reader that splits
    with ``str.splitlines``, as the recent errors do); controls and bidi marks made visible
    (:func:`visible` keeps newlines, for tracebacks), cut."""
    # Masked before the cut (the log's own filter masks whole secrets only: a cut one keeps its head).
    text = visible(redact(text) if redact else text).replace("\n", "\\n").replace("\r", "\\r")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")  # lines to splitlines()
    return text if len(text) <= limit else text[: limit - 1] + "…"
