"""Durations in words, the one way every message of the bot shows them.

Seconds rounded to whole minutes lied: an approval timeout of 15 seconds read "1 minutes", and 90
seconds read "2 min". :func:`in_words` names each unit that is not zero, singular or plural as it
should be: ``15 seconds``, ``1 minute``, ``2 minutes 30 seconds``, ``1 hour 5 minutes``.
"""

from __future__ import annotations

import math

_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def in_words(seconds: float, parts: int = len(_UNITS)) -> str:
    """``seconds`` as ``2 minutes 30 seconds``: the ``parts`` largest units that are not zero
    (all by default, so a configured value reads exactly; a countdown passes ``parts=2`` and reads
    as "about"). A fraction of a second counts as a whole one, so a wait is never shown as none."""
    if seconds <= 0:
        return "0 seconds"
    left = math.ceil(seconds - 1e-6)  # never shorter than it is; float noise is not a second
    words: list[str] = []
    for name, size in _UNITS:
        count, left = divmod(left, size)
        if count and len(words) < parts:
            words.append(f"{count} {name}" if count == 1 else f"{count} {name}s")
        elif words and len(words) >= parts:
            break
    return " ".join(words) or "1 second"


def about(seconds: float) -> str:
    """A countdown (time left, measured a moment after it started): from two minutes on, whole
    minutes rounded up, so a code valid for an hour reads "1 hour" and not "59 minutes 59 seconds"."""
    if seconds >= 120:
        return in_words(math.ceil(seconds / 60 - 1e-6) * 60, 2)
    return in_words(seconds)
