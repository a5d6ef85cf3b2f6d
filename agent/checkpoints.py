"""The LangGraph checkpointer: langgraph-checkpoint-sqlite's ``SqliteSaver``, called inline.

Why not ``AsyncSqliteSaver``: it sends each of a turn's 20-30 checkpoint reads and writes through
aiosqlite's worker thread, and the thread hand-offs cost more CPU than the statements themselves.
In WAL mode with ``synchronous=NORMAL`` a checkpoint write is a few tens of microseconds of local
work with no fsync, so running the sync saver's own methods on the event loop is cheaper and blocks
the loop less than one context switch would. Durability is the same file, the same tables and the
same commit per write as the async saver (a committed write survives ``kill -9``).

**The history of recent threads stays in memory.** deepagents keeps ``messages`` in a LangGraph
``DeltaChannel``: a checkpoint stores the step's new messages, and every run (and every state read)
rebuilds the list by walking the thread's checkpoints back to the last snapshot (every 50 updates)
and deserialising the snapshot and every write since, that is the whole conversation, once per
turn. That cost grows with the thread, without bound (docs/performance.md). This saver keeps, for
the last ``history_cache`` threads it read, the rebuilt history at the checkpoint it read, and
extends it with the writes and checkpoints it puts itself afterwards, which it keeps as the
database will return them (a serialiser round trip, ``INSERT OR IGNORE`` kept). A read of a later
checkpoint of that thread is answered from memory when the chain of checkpoints from it leads back
to the one read, through checkpoints this saver put; anything else (a snapshot, a fork, a re-put
id, a subgraph namespace, a checkpoint another process wrote) is read from the database as before.
The history is handed out with fresh lists and a shallow copy of each message, so a middleware
that reassigns a message's field in the run (human-in-the-loop rewrites ``tool_calls``) cannot
change the kept one. SQLite only: PostgreSQL deployments share threads between daemons.
"""

from __future__ import annotations

import sqlite3
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    writes_sort_key,
)
from langgraph.checkpoint.sqlite import SqliteSaver

HISTORY_CACHE = 64
"""Threads whose rebuilt history is kept (the most recently read): enough for as many conversations
answered in turn (a cycle over more than this would miss every time)."""
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


def _fresh(value: Any) -> Any:
    """``value`` with new lists and a shallow copy of each message (see the module docstring)."""
    if isinstance(value, BaseMessage):
        return value.model_copy()
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


class InlineSqliteSaver(SqliteSaver):
    """``SqliteSaver`` whose async methods run the sync ones directly (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection, *, history_cache: int = HISTORY_CACHE) -> None:
        super().__init__(conn)
        self.history_cache = history_cache
        self._known: OrderedDict[str, _Known] = OrderedDict()

    @classmethod
    def open(cls, path: Path, *, history_cache: int = HISTORY_CACHE) -> InlineSqliteSaver:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        saver = cls(conn, history_cache=history_cache)
        saver.setup()
        return saver

    def close(self) -> None:
        self._known.clear()
        self.conn.close()

    # ---- the kept histories (see the module docstring) -----------------------------------------
    def _known_for(self, config: RunnableConfig) -> tuple[str, _Known] | None:
        conf = config.get("configurable") or {}
        if conf.get("checkpoint_ns", ""):
            return None
        thread = str(conf.get("thread_id"))
        known = self._known.get(thread)
        return None if known is None else (thread, known)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        conf = config["configurable"]
        target = get_checkpoint_id(config)
        wanted = tuple(channels)
        if conf.get("checkpoint_ns", "") or not target or not wanted or self.history_cache <= 0:
            return super().get_delta_channel_history(config=config, channels=channels)
        thread = str(conf["thread_id"])
        now = time.monotonic()
        while self._known and next(iter(self._known.values())).used < now - HISTORY_IDLE:
            self._known.popitem(last=False)
        known = self._known.get(thread)
        if known is not None and known.channels == wanted:
            history = known.advance(target)
            if history is not None:
                known.used = now
                self._known.move_to_end(thread)
                return _handed_out(history)
            if target < known.target:
                # An older checkpoint (the state history, a fork): read it, keep the newer one.
                # Checkpoint ids (uuid6) sort by time; a wrong guess only costs a walk later.
                return super().get_delta_channel_history(config=config, channels=channels)
        self._known.pop(thread, None)
        history = dict(super().get_delta_channel_history(config=config, channels=channels))
        known = _Known(target, wanted, history, now)
        # Writes already stored against the target (a paused or failed step's) are not part of its
        # history, but later checkpoints will chain through it.
        with self.cursor(transaction=False) as cur:
            cur.execute(
                "SELECT task_id, idx, task_path, channel, type, value FROM writes"
                " WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?"
                if self._has_task_path
                else "SELECT task_id, idx, '', channel, type, value FROM writes"
                " WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?",
                (thread, target),
            )
            stored = {
                (task_id, idx): (path, ch, self.serde.loads_typed((kind, blob)) if ch in wanted else None)
                for task_id, idx, path, ch, kind, blob in cur.fetchall()
            }
        if stored:
            known.writes[target] = stored
        self._known[thread] = known
        while len(self._known) > self.history_cache:
            self._known.popitem(last=False)
        return _handed_out(history)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        saved = super().put(config, checkpoint, metadata, new_versions)
        found = self._known_for(config)
        if found is not None:
            thread, known = found
            cid, parent = checkpoint["id"], config["configurable"].get("checkpoint_id")
            values = checkpoint.get("channel_values") or {}
            if cid == known.target or cid in known.parents or any(ch in values for ch in known.channels):
                # A re-put id, or a snapshot the database walk would now seed from: read it there.
                del self._known[thread]
            elif parent is not None:
                known.parents[cid] = parent
        return saved

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """``SqliteSaver.put_writes``, each value serialised once for the database and what is kept,
        so both hold the same bytes even if a node changes the object while this runs (the sync
        graph API calls this from a worker thread while the next step runs)."""
        conf = config["configurable"]
        thread, ns, cid = str(conf["thread_id"]), str(conf["checkpoint_ns"]), str(conf["checkpoint_id"])
        dumps = self.serde.dumps_typed
        rows = [
            (thread, ns, cid, task_id, task_path, WRITES_IDX_MAP.get(ch, idx), ch, *dumps(value))
            for idx, (ch, value) in enumerate(writes)
        ]
        # As SqliteSaver: only the special channels' writes (errors, interrupts...) replace.
        replace = all(ch in WRITES_IDX_MAP for ch, _ in writes)
        with self.cursor() as cur:
            cur.executemany(
                f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO writes (thread_id, checkpoint_ns,"
                " checkpoint_id, task_id, task_path, idx, channel, type, value)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        found = self._known_for(config)
        if found is None:
            return
        thread, known = found
        if cid in known.folded:
            # A write to a checkpoint already folded into the kept history (it came after a later
            # checkpoint was read): let the database walk place it.
            if any(ch in known.channels for ch, _ in writes):
                del self._known[thread]
            return
        # Writes may also come before their checkpoint's ``put`` (the sync graph API stores both
        # from worker threads): kept by id until a chain reaches it.
        stored = known.writes.setdefault(cid, {})
        path = task_path if self._has_task_path else ""
        for _, _, _, _, _, idx, ch, kind, blob in rows:
            key = (task_id, idx)
            if key in stored and not replace:
                continue  # INSERT OR IGNORE: the database keeps the first
            stored[key] = (path, ch, self.serde.loads_typed((kind, blob)) if ch in known.channels else None)

    def delete_thread(self, thread_id: str) -> None:
        self._known.pop(str(thread_id), None)
        super().delete_thread(thread_id)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for item in self.list(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, Any]:
        return self.get_delta_channel_history(config=config, channels=channels)
