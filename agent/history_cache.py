"""The rebuilt message history of recent threads, kept in memory by both checkpointers.

deepagents keeps ``messages`` in a LangGraph ``DeltaChannel``: every run (and every state read)
rebuilds the list by walking the thread's checkpoints back to the last snapshot and deserialising
every write since, the whole conversation, once per read. :class:`KeptHistories` keeps, for the last
threads read, the history at the checkpoint read, and extends it with the writes and checkpoints the
saver puts itself afterwards. A read of a later checkpoint is answered from memory only when the
chain of checkpoints from it leads back to the one read **through checkpoints this saver put**;
anything else (a snapshot, a fork, a re-put id, a subgraph namespace, a failed write, another
process's checkpoint) is read from the database. Used by agent/checkpoints.py ``InlineSqliteSaver``
(the module docstring there says why and how it is bounded) and agent/postgres_saver.py
``KeptPostgresSaver`` (several daemons share a thread: how that stays exact is said there).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    Checkpoint,
    DeltaChannelHistory,
    PendingWrite,
    writes_sort_key,
)

HISTORY_CACHE = 256
"""Threads whose rebuilt history is kept (the most recently read): enough for as many conversations
answered in turn (a cycle over more than this would miss every time). 64 was too few: a burst of
100 chats missed on four turns in five, and on PostgreSQL each miss is three more round trips
(docs/performance.md, "A hundred chats at once"). Memory stays bounded by HISTORY_BYTES and
HISTORY_IDLE, not by this count."""
HISTORY_BYTES = 16 << 20
"""Rough size (text and encoded media) of all kept histories together; the least recently read go
first. A thread whose history alone is over a quarter of it is read from the database each time."""
HISTORY_IDLE = 900.0
"""Seconds after its thread's last read that a kept history is dropped (at the next read of any
thread): threads that went quiet give their memory back."""

_Key = tuple[str, int]
"""A write's identity in its checkpoint, as the writes table's primary key has it: (task_id, idx)."""


@dataclass(slots=True)
class _Known:
    """One thread's delta-channel history at checkpoint ``target``, and what was put after it."""

    target: str
    channels: tuple[str, ...]
    history: dict[str, DeltaChannelHistory]
    used: float = 0.0  # time.monotonic() of the last read
    size: int = 0  # rough bytes held (see _size)
    # Checkpoints put since, by id: their parent's id.
    parents: dict[str, str] = field(default_factory=dict)
    # Writes stored against a checkpoint: {(task_id, idx): (task_path, channel, value)}, every
    # channel's (for INSERT OR IGNORE), values kept for ``channels`` only.
    writes: dict[str, dict[_Key, tuple[str, str, Any]]] = field(default_factory=dict)
    # The checkpoints the last advance folded into ``history``.
    folded: frozenset[str] = frozenset()

    def advance(self, target: str) -> dict[str, DeltaChannelHistory] | None:
        """The history at ``target``, when the checkpoints put since lead from it back to
        ``self.target``; then ``target`` becomes the new base. None otherwise."""
        if target == self.target:
            return self.history
        chain: list[str] = []  # target's ancestors, newest first, down to self.target
        cid = self.parents.get(target)
        while cid is not None and cid != self.target and len(chain) <= len(self.parents):
            chain.append(cid)
            cid = self.parents.get(cid)
        if cid != self.target:
            return None
        chain.append(self.target)
        history: dict[str, DeltaChannelHistory] = {}
        for ch in self.channels:
            base = self.history[ch]
            collected: list[PendingWrite] = list(base["writes"])
            for cid in reversed(chain):  # oldest first, as the contract orders them
                stored = self.writes.get(cid, {})
                for key in sorted(stored, key=lambda k: writes_sort_key(stored[k][0], k[0], k[1])):
                    _, channel, value = stored[key]
                    if channel == ch:
                        collected.append((key[0], ch, value))
            entry: DeltaChannelHistory = {"writes": collected}
            if "seed" in base:
                entry["seed"] = base["seed"]
            history[ch] = entry
        self.target, self.history = target, history
        # What is older than the new base is in its history now. Kept: the writes already stored
        # against the new base (a paused or failed step's, not part of its history; later steps
        # will chain through it) and those of checkpoints not put yet (see put_writes).
        gone = set(chain) | (self.parents.keys() - {target})
        self.writes = {c: w for c, w in self.writes.items() if c not in gone}
        self.parents = {}
        self.folded = frozenset(chain)
        return history


_MESSAGE_PARTS = ("content", "additional_kwargs", "response_metadata", "tool_calls", "invalid_tool_calls")


def _fresh_message(message: BaseMessage) -> BaseMessage:
    """A copy whose fields, the lists and dicts in them, and the dicts in those (content blocks,
    tool calls) and their ``args`` are its own. ``copy.deepcopy`` would cost more (8 µs a message)
    than reading the message back from the database (6 µs); this costs ~2 µs."""
    copy = message.model_copy()
    fields = copy.__dict__
    for name in _MESSAGE_PARTS:
        part = fields.get(name)
        if isinstance(part, list):
            fields[name] = [_one_level(item) for item in part] if part else []
        elif isinstance(part, dict):
            fields[name] = {k: _one_level(v) for k, v in part.items()} if part else {}
    return copy


def _one_level(item: Any) -> Any:
    if isinstance(item, dict):
        return {k: _own(v) for k, v in item.items()}
    if isinstance(item, list):
        return list(item)
    return item


def _own(item: Any) -> Any:
    if isinstance(item, dict):
        return dict(item)
    if isinstance(item, list):
        return list(item)
    return item


def _size(value: Any, depth: int = 0) -> int:
    """Rough bytes of a kept value: its strings (text, encoded images) and some per object."""
    if isinstance(value, str | bytes):
        return len(value) + 50
    if depth > 8:
        return 50
    if isinstance(value, BaseMessage):
        return 300 + sum(_size(value.__dict__.get(name), depth + 1) for name in _MESSAGE_PARTS)
    if isinstance(value, dict):
        return 60 + sum(_size(v, depth + 1) + 50 for v in value.values())
    if isinstance(value, list | tuple):
        return 60 + sum(_size(v, depth + 1) + 8 for v in value)
    return 30


def _fresh(value: Any) -> Any:
    """``value`` with new lists and a copy of each message (see the module docstring)."""
    if isinstance(value, BaseMessage):
        return _fresh_message(value)
    if isinstance(value, list):
        return [_fresh(v) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_replace") and hasattr(value, "value"):
        return value._replace(value=_fresh(value.value))  # a _DeltaSnapshot seed
    return value


def _handed_out(history: Mapping[str, DeltaChannelHistory]) -> dict[str, DeltaChannelHistory]:
    out: dict[str, DeltaChannelHistory] = {}
    for ch, entry in history.items():
        copy: DeltaChannelHistory = {"writes": [(t, c, _fresh(v)) for t, c, v in entry["writes"]]}
        if "seed" in entry:
            copy["seed"] = _fresh(entry["seed"])
        out[ch] = copy
    return out


OLDER = object()
"""What :meth:`KeptHistories.lookup` answers for a checkpoint older than the one kept (the state
history, a fork): the caller reads it from the database and the newer history stays kept."""

Stored = dict[_Key, tuple[str, str, Any]]
"""Writes stored against one checkpoint: {(task_id, idx): (task_path, channel, value)}, value kept
for the delta channels only (None for the others)."""


class KeptHistories:
    """The kept histories of one saver: which threads, how much, and the bookkeeping of its puts.
    Not thread-safe; each saver calls it from one thread (the event loop)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.known: OrderedDict[str, _Known] = OrderedDict()
        self.kept_bytes = 0

    def for_config(self, config: RunnableConfig) -> tuple[str, _Known] | None:
        conf = config.get("configurable") or {}
        if conf.get("checkpoint_ns", ""):
            return None
        thread = str(conf.get("thread_id"))
        known = self.known.get(thread)
        return None if known is None else (thread, known)

    def lookup(self, thread: str, target: str, wanted: tuple[str, ...]) -> Any:
        """A copy of the history of ``thread`` at ``target`` from memory; None when it must be read
        from the database (then :meth:`keep` it), :data:`OLDER` when it must be read but not kept."""
        now = time.monotonic()
        while self.known and next(iter(self.known.values())).used < now - HISTORY_IDLE:
            self.drop(next(iter(self.known)))
        known = self.known.get(thread)
        if known is not None and known.channels == wanted:
            history = known.advance(target)
            if history is not None:
                known.used = now
                self.known.move_to_end(thread)
                out = _handed_out(history)
                if known.size > HISTORY_BYTES // 4:
                    self.drop(thread)  # grew too big to keep (pictures, long tool output)
                self.trim()
                return out
            if target < known.target:
                # Checkpoint ids (uuid6) sort by time; a wrong guess only costs a walk later.
                return OLDER
        self.drop(thread)
        return None

    @staticmethod
    def size_of(history: Mapping[str, DeltaChannelHistory]) -> int | None:
        """The rough size of a history read from the database; None when too big to keep."""
        size = _size([entry.get("seed") for entry in history.values()]) + sum(
            _size(v) for entry in history.values() for _, _, v in entry["writes"]
        )
        return None if size > HISTORY_BYTES // 4 else size

    def keep(
        self,
        thread: str,
        target: str,
        wanted: tuple[str, ...],
        history: dict[str, DeltaChannelHistory],
        size: int,
        stored: Stored,
    ) -> dict[str, DeltaChannelHistory]:
        """Keep a history read from the database (``stored``: the writes already stored against
        ``target``, a paused or failed step's: not part of its history, but later checkpoints will
        chain through it); a copy of it to hand out."""
        known = _Known(target, wanted, history, time.monotonic(), size)
        if stored:
            known.writes[target] = stored
        self.drop(thread)
        self.known[thread] = known
        self.kept_bytes += size
        out = _handed_out(history)
        self.trim()
        return out

    def stored_at(self, thread: str, target: str, stored: Stored) -> None:
        """What the database holds against ``target``, read after a :meth:`lookup` served it:
        added to what this saver wrote there (the database's row wins for a key both have)."""
        known = self.known.get(thread)
        if known is None or known.target != target:
            return
        mine = known.writes.get(target, {})
        merged = {**mine, **stored}
        if merged:
            known.writes[target] = merged

    def knows(self, thread: str, target: str, writes: frozenset[tuple[str, str]]) -> bool:
        """Whether every write in ``writes`` ((task_id, channel) stored against ``target``, as a
        read of the checkpoint returned them) is among those kept against it."""
        known = self.known.get(thread)
        if known is None or known.target != target:
            return False
        if not writes:
            return True
        mine = {(task_id, ch) for (task_id, _), (_, ch, _) in known.writes.get(target, {}).items()}
        return writes <= mine

    def drop(self, thread: str) -> None:
        known = self.known.pop(thread, None)
        if known is not None:
            self.kept_bytes -= known.size

    def forget_all(self) -> None:
        self.known.clear()
        self.kept_bytes = 0

    def trim(self) -> None:
        """Least recently read first, until within ``capacity`` threads and HISTORY_BYTES."""
        while self.known and (len(self.known) > self.capacity or self.kept_bytes > HISTORY_BYTES):
            self.drop(next(iter(self.known)))

    def put(self, found: tuple[str, _Known] | None, config: RunnableConfig, checkpoint: Checkpoint) -> None:
        """Bookkeeping of a checkpoint put (``found``: :meth:`for_config` before the put)."""
        if found is None:
            return
        thread, known = found
        cid, parent = checkpoint["id"], config["configurable"].get("checkpoint_id")
        values = checkpoint.get("channel_values") or {}
        if cid == known.target or cid in known.parents or any(ch in values for ch in known.channels):
            # A re-put id, or a snapshot the database walk would now seed from: read it there.
            self.drop(thread)
        elif parent is not None:
            known.parents[cid] = parent

    def put_writes(
        self,
        config: RunnableConfig,
        task_id: str,
        path: str,
        rows: Sequence[tuple[int, str, Any]],
        replace: bool,
    ) -> None:
        """Bookkeeping of a step's writes stored (rows of (idx, channel, value as the database
        will return it)). ``replace``: every channel is a special one (the saver upserts)."""
        found = self.for_config(config)
        if found is None:
            return
        thread, known = found
        cid = str(config["configurable"]["checkpoint_id"])
        if cid in known.folded:
            # A write to a checkpoint already folded into the kept history (it came after a later
            # checkpoint was read): let the database walk place it.
            if any(ch in known.channels for _, ch, _ in rows):
                self.drop(thread)
            return
        # Writes may also come before their checkpoint's ``put`` (the sync graph API stores both
        # from worker threads): kept by id until a chain reaches it.
        stored = known.writes.setdefault(cid, {})
        for idx, ch, value in rows:
            key = (task_id, idx)
            if key in stored and not replace:
                continue  # insert-or-ignore: the database keeps the first
            if ch in known.channels:
                stored[key] = (path, ch, value)
                grown = _size(value)
                known.size += grown
                self.kept_bytes += grown
            else:
                stored[key] = (path, ch, None)
