"""A table-driven generator of malformed platform payloads, shared by the four robustness suites.

Each platform's test lists the paths of a well-formed payload (a Slack envelope, a Telegram update,
a Discord dispatch, a Lark event) with the wrong shapes to put there; :func:`variants` expands the
table into one case per (path, shape), and :func:`put` builds the broken payload. The values carry
:data:`SECRET` where they carry text, so a test can assert that no log line repeats it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from channels.malformed import DROPPED, KINDS

SECRET = "secret words"
"""Text in every malformed payload; it must never reach a log line."""
DROP = object()
"""Put this to remove the key."""

SHAPES: dict[str, Any] = {
    "missing": DROP,
    "null": None,
    "number": 12345,
    "float": 12.5,
    "bool": True,
    "string": SECRET,
    "object": {"secret": SECRET},
    "list": [SECRET],
    "nested nulls": {"id": None, "text": None},
    "huge id": "9" * 5000,
    "huge list": [SECRET] * 5000,
    "many files": [{"id": "F1", "name": "f.txt", "url_private": "https://files.slack.com/f", "size": 1}]
    * 5000,
    "control chars": "U\x00\x1b[31m",
}


@dataclass(frozen=True)
class Case:
    """One malformed variant: where, what, and whether its sender can still be told."""

    path: tuple[str, ...]
    shape: str
    told: bool

    @property
    def id(self) -> str:
        return f"{'.'.join(self.path)}={self.shape}"

    @property
    def value(self) -> Any:
        value = SHAPES[self.shape]
        return value if value is DROP else copy.deepcopy(value)


def variants(table: Mapping[tuple[str, ...], tuple[Iterable[str], bool]]) -> list[Case]:
    """``{path: (shapes, told)}`` → one :class:`Case` per shape; ``told``: the sender and chat are
    still readable, so the user must get the "couldn't read" note (or the refusal) visibly."""
    return [Case(path, shape, told) for path, (shapes, told) in table.items() for shape in shapes]


def put(payload: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``payload`` with ``value`` at ``path`` (:data:`DROP` removes the key)."""
    out = copy.deepcopy(payload)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    if value is DROP:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return out


def leaked(records: Iterable[Any]) -> list[str]:
    """Log lines (with their tracebacks) that repeat :data:`SECRET`."""
    out = []
    for record in records:
        text = record.getMessage() + (record.exc_text or "")
        if SECRET in text or "secret" in text:
            out.append(text[:300])
    return out


def malformed_total(rig: Any, platform: str) -> float:
    """``chital_malformed_events_total`` of ``platform`` over every kind but ``dropped``."""
    return sum(
        rig.metric("chital_malformed_events_total", platform=platform, kind=k) for k in KINDS if k != DROPPED
    )
