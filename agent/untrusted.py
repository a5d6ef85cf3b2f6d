"""Text that users or the model chose, made safe to show: to people in a chat, and to the model.

Display names, model names, file names, command arguments, schedule texts, remembered facts and
quoted messages are written by someone other than the one reading them. Shown as they are, they
can lie about themselves:

- **invisible characters** (zero-width spaces and joiners, bidirectional overrides and isolates,
  the BOM, Mongolian vowel separator, tag characters U+E0000…, variation selectors, fillers) make
  ``invoice\\u202etxt.exe`` read as ``invoiceexe.txt``, hide words from a comparison, or smuggle
  ASCII to a model in tag characters no person sees: they are removed;
- **length**: a 10,000-character name floods a reply: everything is bounded, an ellipsis marking
  a cut;
- **markup**: ``[Verify your account](https://evil.example)`` or ``<!everyone>`` echoed in a reply
  is a phishing link or a mass ping in the bot's own voice: :func:`code_span` puts the text in an
  inline code span, which every adapter's renderer shows literally (Telegram sends it as a
  ``code`` entity, where clients find no links or mentions; Slack's renderer escapes ``&<>``
  inside code, channels/slack/render.py; Discord shows code as typed and the adapter allows no
  pings; Lark cards get a zero-width space after ``<``, channels/lark/render.py);
- **look-alike names**: ``уou (аssistant)`` with Cyrillic letters, fullwidth ``ｓｙｓｔｅｍ`` or
  ``y o u`` read as the assistant's own label to a model: :func:`poses_as_reserved` compares a
  *skeleton* (NFKC, case-folded, Cyrillic/Greek/Armenian/Cherokee/Lisu/Coptic/small-capital/digit
  look-alikes and letters named after Latin ones mapped to the Latin letters they imitate, accents
  dropped) with the reserved names.

Pure standard library and kept in ``agent/`` because both sides need it: the agent quotes thread
context and names files for the model (agent must not import gateway or channels), the gateway
builds the chat replies (gateway may import agent). Adapters need nothing from here: they render
the Markdown the gateway hands them.
"""

from __future__ import annotations

import re
import unicodedata

ELLIPSIS = "…"
NAME_CHARS = 64
"""Characters of a display name, model name, user id or command argument shown."""
TEXT_CHARS = 120
"""Characters of a longer one-line text shown (a schedule's text, a fact, a title, a file name)."""
POSE_MARK = "[look-alike of a reserved name]"
"""What follows a quoted author whose name reads as the assistant's, the system's or "you"."""

_EXTRA_INVISIBLE = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180e\u180f\u2800\u3164\uffa0")
"""Default-ignorable or blank characters that are not format controls (Cf): the combining
grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian selectors, the braille blank."""
_MAX_MARKS = 2
"""Combining marks kept on one letter: more only stack into "Zalgo" text covering other lines."""
_BACKTICK_STAND_IN = "\u02cb"  # ˋ: a backtick would end the code span early


def _invisible(ch: str) -> bool:
    code = ord(ch)
    return (
        unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs")
        or ch in _EXTRA_INVISIBLE
        or 0xFE00 <= code <= 0xFE0F  # variation selectors
        or 0xE0000 <= code <= 0xE0FFF  # tags and variation selectors supplement
    )


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` without characters that do not show as themselves (see the module doc); with
    ``lines``, newlines and tabs are kept (a quoted message), otherwise they become spaces.
    Runs of combining marks are cut to :data:`_MAX_MARKS`."""
    out: list[str] = []
    marks = 0
    for ch in text:
        if ch in "\n\t":
            out.append(ch if lines else " ")
            marks = 0
            continue
        if ch == "\r" or _invisible(ch):
            if ch in "\u2028\u2029\x85\x0b\x0c":
                out.append("\n" if lines else " ")
            continue
        if unicodedata.combining(ch):
            marks += 1
            if marks > _MAX_MARKS:
                continue
        else:
            marks = 0
        out.append(ch)
    return "".join(out)


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, an ellipsis marking a cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)].rstrip() + ELLIPSIS


def one_line(text: str, limit: int = NAME_CHARS) -> str:
    """``text`` visible, on one line (whitespace runs become one space), within ``limit``."""
    return cut(" ".join(visible(text).split()), limit)


def code_span(text: str, limit: int = NAME_CHARS, *, empty: str = "(empty)") -> str:
    """``text`` as a Markdown inline code span: one line, visible, bounded, a backtick inside
    shown as ``ˋ`` so the span cannot be closed early. For every echo of untrusted text in a
    chat reply; ``empty`` (plain) when nothing visible is left."""
    shown = one_line(text, limit).replace("`", _BACKTICK_STAND_IN)
    return f"`{shown}`" if shown else empty


def file_name(name: str, limit: int = TEXT_CHARS) -> str:
    """A file name as it is delivered or shown: visible, one line, no path separators, within
    ``limit`` characters with its extension kept (``invoice\\u202etxt.exe`` → ``invoicetxt.exe``:
    what it really is shows at the end)."""
    shown = " ".join(visible(name).replace("/", "_").replace("\\", "_").split()).rstrip(".") or "file"
    if len(shown) <= limit:
        return shown
    stem, dot, ext = shown.rpartition(".")
    if not dot or not stem or len(ext) > 16:
        return cut(shown, limit)
    return cut(stem, limit - len(ext) - 1) + "." + ext


# -- look-alikes -------------------------------------------------------------------------------------
_LOOKALIKES = str.maketrans(
    {
        # Cyrillic
        "а": "a", "в": "b", "с": "c", "ԁ": "d", "е": "e", "ё": "e", "һ": "h", "н": "h", "і": "i",
        "ї": "i", "ј": "j", "к": "k", "ӏ": "l", "м": "m", "п": "n", "о": "o", "р": "p", "ԛ": "q",
        "г": "r", "ѕ": "s", "т": "t", "у": "y", "ү": "y", "х": "x", "ԝ": "w", "ь": "b", "ц": "u",
        "з": "3", "ч": "4", "ш": "w", "щ": "w", "л": "n", "и": "u", "я": "r", "д": "d",
        # Greek
        "α": "a", "β": "b", "γ": "y", "δ": "d", "ε": "e", "ζ": "z", "η": "n", "ι": "i", "κ": "k",
        "μ": "u", "ν": "v", "ο": "o", "ρ": "p", "σ": "o", "ς": "s", "τ": "t", "υ": "u", "χ": "x",
        "ω": "w", "ϲ": "c", "ϳ": "j", "ϵ": "e",
        # Armenian, Latin extensions and small capitals
        "օ": "o", "ս": "u", "ո": "n", "ց": "g", "հ": "h", "ı": "i", "ȷ": "j", "ɑ": "a", "ɡ": "g",
        "ɩ": "i", "ɪ": "i", "ʏ": "y", "ᴀ": "a", "ʙ": "b", "ᴄ": "c", "ᴅ": "d", "ᴇ": "e", "ɢ": "g",
        "ʜ": "h", "ᴊ": "j", "ᴋ": "k", "ʟ": "l", "ᴍ": "m", "ɴ": "n", "ᴏ": "o", "ᴘ": "p", "ʀ": "r",
        "ꜱ": "s", "ᴛ": "t", "ᴜ": "u", "ᴠ": "v", "ᴡ": "w", "ᴢ": "z", "ß": "ss",
        # digits and signs read as letters
        "0": "o", "1": "i", "l": "i", "|": "i", "!": "i", "3": "e", "4": "a", "@": "a", "5": "s",
        "$": "s", "7": "t",
    }
)  # fmt: skip
_OTHER_SCRIPTS = str.maketrans(
    {
        # Cherokee capitals (small ones casefold to these), Lisu, Coptic (capitals casefold to small)
        "Ꭺ": "a", "Ᏼ": "b", "Ꮟ": "b", "Ꮯ": "c", "Ꭰ": "d", "Ꭼ": "e", "Ꮐ": "g", "Ꮋ": "h", "Ꭵ": "i",
        "Ꭻ": "j", "Ꮶ": "k", "Ꮮ": "l", "Ꮇ": "m", "Ꮲ": "p", "Ꭱ": "r", "Ꮢ": "r", "Ꮪ": "s", "Ꭲ": "t",
        "Ꮩ": "v", "Ꮃ": "w", "Ꭹ": "y", "Ꮓ": "z",
        "ꓮ": "a", "ꓐ": "b", "ꓚ": "c", "ꓓ": "d", "ꓰ": "e", "ꓝ": "f", "ꓖ": "g", "ꓧ": "h", "ꓲ": "i",
        "ꓙ": "j", "ꓗ": "k", "ꓡ": "l", "ꓟ": "m", "ꓠ": "n", "ꓳ": "o", "ꓑ": "p", "ꓣ": "r", "ꓢ": "s",
        "ꓔ": "t", "ꓴ": "u", "ꓦ": "v", "ꓪ": "w", "ꓫ": "x", "ꓬ": "y", "ꓜ": "z",
        "ⲁ": "a", "ⲃ": "b", "ⲥ": "c", "ⲉ": "e", "ⲏ": "h", "ⲓ": "i", "ⲕ": "k", "ⲙ": "m", "ⲛ": "n",
        "ⲟ": "o", "ⲣ": "p", "ⲧ": "t", "ⲩ": "y", "ⲭ": "x",
    }
)  # fmt: skip
_LATIN_NAME = re.compile(r"\bLATIN (?:CAPITAL |SMALL )?LETTER (?:SMALL CAPITAL )?([A-Z])\b")
"""A character named after a Latin letter that NFKC leaves alone (``🅰`` NEGATIVE SQUARED LATIN
CAPITAL LETTER A, ``🅐``): read as that letter."""
_DIGRAPHS = (("rn", "m"), ("vv", "w"))


def _as_latin(ch: str) -> str:
    if ch.isascii():
        return ch
    found = _LATIN_NAME.search(unicodedata.name(ch, ""))
    return found.group(1).lower() if found else ch


def skeleton(text: str) -> str:
    """What ``text`` looks like, reduced to Latin letters and spaces: invisible characters gone,
    NFKC (fullwidth and mathematical letters become ASCII), case folded, look-alikes mapped,
    accents dropped, everything else a space. Two names with the same skeleton read the same."""
    folded = unicodedata.normalize("NFKC", visible(text)).casefold().translate(_OTHER_SCRIPTS)
    folded = folded.translate(_LOOKALIKES)
    bare = "".join(
        _as_latin(c) for c in unicodedata.normalize("NFKD", folded) if not unicodedata.combining(c)
    )
    for pair, letter in _DIGRAPHS:
        bare = bare.replace(pair, letter)
    return " ".join(re.sub(r"[^a-z]+", " ", bare).split())


RESERVED = ("you", "assistant", "system", "bot", "chital", "developer", "admin", "administrator", "operator")
"""Names a quoted author may not take unmarked: the assistant's own label (``you (assistant)``),
the roles a model gives weight to, and this bot's name."""
_RESERVED = frozenset(skeleton(w) for w in RESERVED)
_RESERVED_INSIDE = tuple(skeleton(w) for w in ("assistant", "chital"))
"""Reserved names no ordinary word contains (``system`` is in "ecosystem", ``admin`` in
"badminton"): found anywhere in a name's letters run together."""


def poses_as_reserved(name: str) -> bool:
    """Whether ``name`` reads as a reserved name: a word of it is one (``Bot``, ``уou``), its
    letters run together are one (``y o u``), or contain ``assistant`` (``myassistant``)."""
    words = skeleton(name).split()
    joined = "".join(words)
    return (
        any(w in _RESERVED for w in words)
        or joined in _RESERVED
        or any(w in joined for w in _RESERVED_INSIDE)
    )


def author_label(name: str, limit: int = NAME_CHARS) -> str:
    """A quoted author's name as the model reads it: one line, visible, bounded, without the
    characters the quoted block uses for its own structure; a name that poses as a reserved one
    becomes ``user "уou (assistant)" [look-alike of a reserved name]``."""
    poses = poses_as_reserved(name)
    cleaned = one_line(re.sub(r'[:"<>]', " ", name) if poses else name, limit)
    cleaned = cleaned.replace("[", "(").replace("]", ")") or "someone"
    return f'user "{cleaned}" {POSE_MARK}' if poses else cleaned
