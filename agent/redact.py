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
_GRAM = 10
"""Window of the prefilter (:meth:`Redactor._maybe`): variants of 19 characters or more are found by
one set look-up per 10 characters of text."""
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
_NESTED = (str, dict, list, tuple)


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
        # The prefilter (see _maybe): long variants by their sampled grams, short ones one by one.
        self._short = tuple(v for v in self._variants if len(v) < 2 * _GRAM - 1)
        self._grams = frozenset(
            v[i : i + _GRAM]
            for v in self._variants
            if len(v) >= 2 * _GRAM - 1
            for i in range(len(v) - _GRAM + 1)
        )
        # Measured (bench figures in docs/security.md): a substring search ~0.2 µs + 0.33 ns a
        # character per variant, a gram look-up ~36 ns a character of text.
        n = len(self._variants)
        self._gram_below = float("inf") if n >= 100 else 0.2 * n / (0.036 - 0.00033 * n)
        self._bytes = tuple(v.encode() for v in self._variants)
        self._prefixes = frozenset(s[:n] for s in self.secrets for n in range(_STREAM_HOLD_MIN, len(s)))
        self._heads = frozenset(s[:_STREAM_HOLD_MIN] for s in self.secrets)
        self._longest = max(map(len, self.secrets), default=0)

    def __call__(self, text: str) -> str:
        if len(text) < MIN_SECRET_CHARS:
            return text  # nothing fits: button values, dict keys, short words
        if self._pattern is not None and self._maybe(text):
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

    def _maybe(self, text: str) -> bool:
        """Whether ``text`` may hold a secret: False is certain, True is checked by the pattern.

        Two ways, whichever is cheaper for this text's length (:attr:`_gram_below`). The substring
        search costs ~0.2 µs per variant plus a little per character; the gram walk a constant per
        ``_GRAM`` characters, whatever the number of secrets (the property of Aho-Corasick, for the
        price of a set of grams). A variant at least ``2 * _GRAM - 1`` long, wherever it sits in
        ``text``, covers one whole window ``text[q : q + _GRAM]`` with ``q`` a multiple of ``_GRAM``,
        and that window is one of its grams: reading every ``_GRAM``-th window finds it. Shorter
        variants (passwords, base64 of short secrets) are few and searched as they are."""
        if len(text) >= self._gram_below:
            return any(v in text for v in self._variants)
        for v in self._short:
            if v in text:
                return True
        grams = self._grams
        for q in range(0, len(text) - _GRAM + 1, _GRAM):
            if text[q : q + _GRAM] in grams:
                return True
        return False

    def stream(self, text: str) -> str:
        """A streamed text so far, masked, without a trailing run that begins a secret (the next
        chunk may complete it; the final text is masked whole)."""
        text = self(text)
        window = len(text) - self._longest
        cut = len(text)
        for head in self._heads:  # a few C searches in the tail, not a slice per length
            i = text.find(head, max(window, 0))
            while i != -1 and i < cut:
                if text[i:] in self._prefixes:
                    cut = i
                    break
                i = text.find(head, i + 1)
        return text[:cut]

    def deep(self, value: Any) -> Any:
        """``value`` with every string in it (dict values, list items) masked; the same object when
        nothing in it needed masking. Dict keys are the structure's (field and channel names) and
        are left alone."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            out: dict[Any, Any] | None = None
            for k, v in value.items():
                new = self.deep(v) if isinstance(v, _NESTED) else v
                if new is not v:
                    if out is None:
                        out = dict(value)
                    out[k] = new
            return value if out is None else out
        if isinstance(value, list | tuple):
            items = [self.deep(v) if isinstance(v, _NESTED) else v for v in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else type(value)(items)
        return value

    def data(self, data: bytes) -> bytes:
        """A file's bytes with each secret value overwritten by as many ``*``: the length stays,
        so an uncompressed format (text, JSON, PDF streams) keeps its structure."""
        for v in self._bytes:
            if v in data:
                data = data.replace(v, b"*" * len(v))
        return data
