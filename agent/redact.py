"""The one redaction function: the daemon's secret values, and tokens recognisable by their shape,
masked as ``***`` in whatever leaves the process (chat text, buttons, file names, approval prompts,
logs, status, metrics, tool results sent to the model).

Why by value: shape patterns cannot know a Lark app secret (32 plain letters and digits) nor a
Discord token from a random string; the daemon does know every secret it was configured with, so
it masks those exactly. Why the encodings too: a tool that prints an URL, a JSON document or a
Basic-auth header shows the same secret URL-quoted, JSON-escaped or inside base64, so each secret
is searched as-is, percent-encoded, JSON-escaped and as the stable middle of its base64 at each of
the three byte alignments (standard and URL-safe alphabets).

Why ``in`` before a regular expression: ``sre`` tries every branch of an alternation at every
position, so one compiled alternation of ~100 literals costs ~10x the C substring search over
texts that hold no secret (nearly all of them). :meth:`Redactor.__call__` asks the substring
search first and builds the replacing alternation only for the texts that need it.

Light on purpose (``re``, ``base64``, ``json``, ``urllib``): the gateway imports it before the agent
stack, and adapters receive it as a plain callable (``channels/`` imports nothing of ``agent/``).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "***"
MIN_SECRET_CHARS = 6
"""Shorter values are not masked: they would hit ordinary words and numbers everywhere."""
_STREAM_HOLD_MIN = 3
"""A streamed text ending with this many or more leading characters of a secret holds them back."""

_KNOWN_TOKEN = re.compile(
    r"(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}|xox[abposre]-[\w-]{10,}"
    r"|xapp-[\w-]{10,}|sk-(?:proj-|ant-)?[\w-]{20,}|AKIA[0-9A-Z]{16}|AIza[\w-]{35}"
    r"|:AA[\w-]{33}(?![\w-])|\.[\w-]{6}\.[\w-]{27,38}(?![\w-]))"
)
"""Tokens recognisable by their shape: GitHub, GitLab, Slack, OpenAI/Anthropic, AWS, Google by
their prefix; a Telegram bot token by its ``:AA…`` half (the digits before it are added by
:func:`_shapes`); a Discord token by its two dotted tails (the id part before them likewise). No
leading ``\\b`` in the pattern: it would cost ``sre`` its first-character skip (4x slower), so the
word boundary is checked on the match instead."""
_WORD = re.compile(r"[\w-]")


def _shapes(text: str) -> list[tuple[int, int]]:
    """Spans of token-shaped runs in ``text`` (see :data:`_KNOWN_TOKEN`)."""
    spans: list[tuple[int, int]] = []
    for m in _KNOWN_TOKEN.finditer(text):
        start, end, head = m.start(), m.end(), text[m.start()]
        if head == ":":  # a Telegram token: 6-12 digits of bot id before the colon
            first = start
            while first > 0 and text[first - 1].isdigit() and start - first < 13:
                first -= 1
            if not 6 <= start - first <= 12 or (first and _WORD.match(text[first - 1])):
                continue
            start = first
        elif head == ".":  # a Discord token: the base64 of the bot's id before the dots
            first = start
            while first > 0 and _WORD.match(text[first - 1]) and text[first - 1] != "-":
                first -= 1
            if not 23 <= start - first <= 30:
                continue
            start = first
        elif start and _WORD.match(text[start - 1]):
            continue  # "task-…" is not an "sk-" key
        spans.append((start, end))
    return spans


def encodings(secret: str) -> set[str]:
    """``secret`` as a tool may print it: as-is, URL-quoted, JSON-escaped, inside base64."""
    out = {secret, quote(secret, safe=""), quote_plus(secret, safe=""), json.dumps(secret)[1:-1]}
    raw = secret.encode()
    for pad in range(3):
        # Inside a longer base64 text the secret's bytes start at any of three alignments: the
        # characters that also depend on the bytes around it are dropped at both ends.
        enc = base64.b64encode(b"\0" * pad + raw).decode().rstrip("=")
        start = (pad * 8 + 5) // 6 if pad else 0
        stop = (pad + len(raw)) * 8 // 6
        core = enc[start:stop]
        out.add(core)
        out.add(core.replace("+", "-").replace("/", "_"))
    return {v for v in out if len(v) >= MIN_SECRET_CHARS}


class Redactor:
    """Masks the daemon's secret values (each in its :func:`encodings`) and token-shaped text.

    Call it on a text; :meth:`stream` for a text still being written; :meth:`deep` for a
    JSON-like value; :meth:`data` for a file's bytes. Cheap when there is nothing to mask: one C
    substring search per encoded secret and one regular-expression scan for shapes."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_CHARS}
        self.secrets: tuple[str, ...] = tuple(sorted(values, key=len, reverse=True))
        variants = {v for s in self.secrets for v in encodings(s)}
        self._variants: tuple[str, ...] = tuple(sorted(variants, key=len, reverse=True))
        self._pattern = re.compile("|".join(map(re.escape, self._variants))) if variants else None
        self._bytes = tuple(v.encode() for v in self._variants)
        self._prefixes = frozenset(s[:n] for s in self.secrets for n in range(_STREAM_HOLD_MIN, len(s)))
        self._longest = max(map(len, self.secrets), default=0)

    def __call__(self, text: str) -> str:
        if self._pattern is not None and any(v in text for v in self._variants):
            text = self._pattern.sub(MASK, text)
        spans = _shapes(text)
        if not spans:
            return text
        out, last = [], 0
        for start, end in spans:
            if start >= last:
                out += [text[last:start], MASK]
                last = end
        return "".join(out) + text[last:]

    def stream(self, text: str) -> str:
        """A streamed text so far, masked, without a trailing run that begins a secret (the next
        chunk may complete it; the final text is masked whole)."""
        text = self(text)
        if self._prefixes:
            for n in range(min(self._longest - 1, len(text)), _STREAM_HOLD_MIN - 1, -1):
                if text[-n:] in self._prefixes:
                    return text[:-n]
        return text

    def deep(self, value: Any) -> Any:
        """``value`` with every string in it (dict keys and values, list items) masked; the same
        object when nothing in it needed masking."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            items = [(self.deep(k), self.deep(v)) for k, v in value.items()]
            if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(), strict=True)):
                return value
            return dict(items)
        if isinstance(value, list | tuple):
            out = [self.deep(v) for v in value]
            return value if all(a is b for a, b in zip(out, value, strict=True)) else type(value)(out)
        return value

    def data(self, data: bytes) -> bytes:
        """A file's bytes with each secret value overwritten by as many ``*``: the length stays,
        so an uncompressed format (text, JSON, PDF streams) keeps its structure."""
        for v in self._bytes:
            if v in data:
                data = data.replace(v, b"*" * len(v))
        return data
