"""Memory settings, the ``Fact`` record, and ``FactStore``: Chital's facts on a LangGraph store.

Layout in the store (one SQLite file, ``InlineSqliteStore``, agent/memory/store.py):

- ``("memory", <user>)`` / ``<fact id>`` -> ``{"text", "created_at", "updated_at", "source"}``
- ``("memory_pending", <user>)`` / ``<thread id>|<message id>`` -> one finished turn waiting for
  extraction: ``{"thread_id", "message_id", "lines": [[role, text], ...], "at"}``

The timestamps live in the value, not in the store's own columns: SQLite's ``INSERT OR REPLACE``
resets ``created_at`` on every update and keeps whole seconds only, and retention must mean "not
confirmed for N days", which is our ``updated_at``. Pending turns are rows rather than memory
state so that a restart resumes them, and ``forget`` can erase them with the facts.
"""

from __future__ import annotations

import builtins
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import BaseStore, Op, PutOp

from agent.settings import MemorySettings  # noqa: F401 - re-exported

FACTS = "memory"
PENDING = "memory_pending"
_PAGE = 500


@dataclass(frozen=True, slots=True)
class Fact:
    """One small, atomic thing known about a user."""

    id: str
    text: str
    created_at: datetime
    updated_at: datetime
    source: str = ""
    """Thread id of the conversation it was last learned from."""


@dataclass(frozen=True, slots=True)
class PendingTurn:
    """A finished turn not yet through extraction."""

    key: str
    thread_id: str
    message_id: str
    lines: tuple[tuple[str, str], ...]
    at: datetime


def now_utc() -> datetime:
    return datetime.now(UTC)


def user_label(user: str) -> str:
    """A namespace label for a user id: LangGraph forbids '.' (and empty labels) in labels."""
    if not user:
        raise ValueError("empty user id")
    return user.replace("%", "%25").replace(".", "%2E").replace("\x00", "%00")


def user_from_label(label: str) -> str:
    return label.replace("%2E", ".").replace("%00", "\x00").replace("%25", "%")


def _time(value: Any) -> datetime:
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return datetime.fromtimestamp(0, UTC)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def fact_value(fact: Fact) -> dict[str, Any]:
    return {
        "text": fact.text,
        "created_at": fact.created_at.isoformat(),
        "updated_at": fact.updated_at.isoformat(),
        "source": fact.source,
    }


class FactStore:
    """Typed access to memory rows on any LangGraph ``BaseStore`` (SQLite now, Postgres later).

    Facts are cached per user and the entry dropped on every write through this object: injection
    reads the facts on each model call, and a store query costs a few ms of thread hops where the
    cache costs nothing. This is exact while one process writes the store; daemons sharing a
    Postgres store would need a short TTL on the cache.
    """

    def __init__(self, store: BaseStore, *, cache_users: int = 1024) -> None:
        self.store = store
        self._cache: OrderedDict[str, builtins.list[Fact]] = OrderedDict()
        self._cache_users = cache_users
        self._version: dict[str, int] = {}
        """Per user, bumped by each write: a read that raced a write does not fill the cache."""

    async def _all(self, namespace: tuple[str, ...]) -> builtins.list[Any]:
        items: builtins.list[Any] = []
        while True:
            page = await self.store.asearch(namespace, limit=_PAGE, offset=len(items))
            items.extend(page)
            if len(page) < _PAGE:
                return items

    async def facts(self, user: str) -> builtins.list[Fact]:
        """The user's facts, most recently updated first."""
        cached = self._cache.get(user)
        if cached is not None:
            self._cache.move_to_end(user)
            return list(cached)
        version = self._version.get(user, 0)
        facts = [
            Fact(
                id=item.key,
                text=str(item.value.get("text", "")),
                created_at=_time(item.value.get("created_at")),
                updated_at=_time(item.value.get("updated_at")),
                source=str(item.value.get("source", "")),
            )
            for item in await self._all((FACTS, user_label(user)))
        ]
        facts.sort(key=lambda f: f.updated_at, reverse=True)
        if self._version.get(user, 0) == version:
            self._cache[user] = facts
            if len(self._cache) > self._cache_users:
                self._cache.popitem(last=False)
        return list(facts)

    async def pending(self, user: str) -> builtins.list[PendingTurn]:
        """The user's turns waiting for extraction, oldest first."""
        turns = []
        for item in await self._all((PENDING, user_label(user))):
            value = item.value
            lines = tuple(
                (str(pair[0]), str(pair[1]))
                for pair in value.get("lines", ())
                if isinstance(pair, list | tuple) and len(pair) == 2
            )
            turns.append(
                PendingTurn(
                    key=item.key,
                    thread_id=str(value.get("thread_id", "")),
                    message_id=str(value.get("message_id", "")),
                    lines=lines,
                    at=_time(value.get("at")),
                )
            )
        turns.sort(key=lambda t: t.at)
        return turns

    async def add_pending(self, user: str, turn: PendingTurn) -> None:
        value = {
            "thread_id": turn.thread_id,
            "message_id": turn.message_id,
            "lines": [list(line) for line in turn.lines],
            "at": turn.at.isoformat(),
        }
        await self.store.abatch([PutOp((PENDING, user_label(user)), turn.key, value, index=False)])

    async def users_with_pending(self) -> builtins.list[str]:
        return await self._users(PENDING)

    async def users_with_facts(self) -> builtins.list[str]:
        return await self._users(FACTS)

    async def _users(self, root: str) -> builtins.list[str]:
        users: builtins.list[str] = []
        while True:
            page = await self.store.alist_namespaces(
                prefix=(root,), max_depth=2, limit=_PAGE, offset=len(users)
            )
            users.extend(user_from_label(ns[1]) for ns in page if len(ns) > 1)
            if len(page) < _PAGE:
                return users

    async def write(
        self,
        user: str,
        *,
        put: Iterable[Fact] = (),
        delete: Iterable[str] = (),
        done_pending: Iterable[str] = (),
    ) -> None:
        """Apply changes of one user in one batch (one SQLite transaction)."""
        label = user_label(user)
        put, delete = builtins.list(put), builtins.list(delete)
        if put or delete:
            self._cache.pop(user, None)
            self._version[user] = self._version.get(user, 0) + 1
        ops: builtins.list[Op] = [PutOp((FACTS, label), f.id, fact_value(f), index=False) for f in put]
        ops += [PutOp((FACTS, label), key, None) for key in delete]
        ops += [PutOp((PENDING, label), key, None) for key in done_pending]
        try:
            if ops:
                await self.store.abatch(ops)
        finally:
            if put or delete:  # again: a read that ran while the write was queued saw old rows
                self._cache.pop(user, None)
                self._version[user] += 1

    async def erase(self, user: str) -> int:
        """Delete every fact and pending turn of ``user``; returns the number of facts deleted."""
        facts = await self._all((FACTS, user_label(user)))
        pending = await self._all((PENDING, user_label(user)))
        await self.write(
            user, delete=[item.key for item in facts], done_pending=[item.key for item in pending]
        )
        return len(facts)


def trim_to_limit(facts: Sequence[Fact], limit: int) -> tuple[builtins.list[Fact], builtins.list[str]]:
    """Keep the ``limit`` most recently updated facts; return (kept, ids to drop)."""
    ordered = sorted(facts, key=lambda f: f.updated_at, reverse=True)
    return ordered[:limit], [f.id for f in ordered[limit:]]
