"""The ``choices`` table: questions the agent asked with options, posted as buttons
(gateway/turns/choices.py, docs/choices.md).

A mixin of :class:`gateway.store.journal.Store`. One row per asking turn (``key`` is unique, so a
replayed turn finds its first row and posts nothing twice); ``code`` is the short id the buttons
carry (``ask:CODE:n``, within Telegram's 64-byte callback data). What the options are and whether
the question is still open is read from the agent's checkpoint, never from here: the row only maps
a code to the turn that asked and to the message carrying the buttons. Who chose is the journal's:
a press is journaled as the answer's turn, keyed on the buttons message, so the first press wins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.store.connection import Connection
from gateway.store.entries import OPEN_STATES, JournalKind

CHOICE_TABLES = (
    """CREATE TABLE IF NOT EXISTS choices (
    code TEXT PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    conversation TEXT NOT NULL,
    message_id TEXT NOT NULL DEFAULT '',
    closed INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS choices_conversation ON choices(conversation)",
)
"""Created by its schema step (:mod:`gateway.store.schema`)."""


@dataclass(frozen=True, slots=True)
class ChoiceRow:
    code: str
    key: str
    """Journal key of the turn that asked."""
    conversation: str
    message_id: str
    """The message carrying the buttons ('' until it is sent)."""
    closed: bool
    """A turn answered it (a press or a typed answer): its buttons are stale."""
    created: float


_FIELDS = "code, key, conversation, message_id, closed, created"


def _row(row: Any) -> ChoiceRow:
    values = list(row)
    values[4] = bool(values[4])
    return ChoiceRow(*values)


class ChoiceTables:
    _db: Connection

    async def _write(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        raise NotImplementedError  # the Store's

    async def choice_add(self, code: str, key: str, conversation: str) -> ChoiceRow:
        """The row of the turn ``key``: made once; a replay of that turn gets the first one."""
        await self._write(
            "INSERT OR IGNORE INTO choices(code, key, conversation, created) VALUES (?, ?, ?, ?)",
            (code, key, conversation, time.time()),
        )
        async with self._db.execute(f"SELECT {_FIELDS} FROM choices WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        assert row is not None
        return _row(row)

    async def choice_sent(self, code: str, message_id: str) -> None:
        await self._write("UPDATE choices SET message_id = ? WHERE code = ?", (message_id, code))

    async def choice_by_code(self, code: str) -> ChoiceRow | None:
        async with self._db.execute(f"SELECT {_FIELDS} FROM choices WHERE code = ?", (code,)) as cur:
            row = await cur.fetchone()
        return _row(row) if row else None

    async def choice_latest(self, conversation: str) -> ChoiceRow | None:
        """The conversation's newest question with options (an older one's buttons are stale)."""
        async with self._db.execute(
            f"SELECT {_FIELDS} FROM choices WHERE conversation = ? ORDER BY created DESC LIMIT 1",
            (conversation,),
        ) as cur:
            row = await cur.fetchone()
        return _row(row) if row else None

    async def choice_close(self, code: str) -> bool:
        """Mark the question answered; True for the one call that did."""
        return await self._write("UPDATE choices SET closed = 1 WHERE code = ? AND closed = 0", (code,)) == 1

    async def choice_answer_waiting(self, conversation: str, asking_key: str) -> bool:
        """Whether a turn of ``conversation`` other than the asking one is journaled and not yet
        done: a typed answer (or any newer message) already on its way, which a press must not
        race (both would reach the agent as answers)."""
        states = ", ".join("?" for _ in OPEN_STATES)
        async with self._db.execute(
            f"SELECT 1 FROM journal WHERE conversation = ? AND kind = ? AND key != ? AND state IN ({states})"
            " LIMIT 1",
            (conversation, JournalKind.TURN.value, asking_key, *(s.value for s in OPEN_STATES)),
        ) as cur:
            return await cur.fetchone() is not None
