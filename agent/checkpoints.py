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
the last ``history_cache`` threads it read (at most HISTORY_BYTES in all), the rebuilt history at
the checkpoint it read, and extends it with the writes and checkpoints it puts itself afterwards,
which it keeps as the database will return them (the same serialised bytes, ``INSERT OR IGNORE``
kept). A read of a later checkpoint of that thread is answered from memory when the chain of
checkpoints from it leads back to the one read, through checkpoints this saver put; anything else
(a snapshot, a fork, a re-put id, a subgraph namespace, a failed write, a commit by another
connection to the file) is read from the database as before. The history is handed out as new
lists of message copies whose lists and dicts (content blocks, tool calls and their arguments,
kwargs) are their own, so a middleware that changes a message it was handed (human-in-the-loop
rewrites ``tool_calls``) cannot change what the next turn reads. SQLite only: PostgreSQL
deployments share threads between daemons.

A step's writes go in one transaction (``SqliteSaver`` commits row by row): a batch that fails
halfway on a full disk would leave rows LangGraph then counts as the whole step.
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

from agent.compaction import kept_chain
from compat import langgraph as langgraph_compat

HISTORY_CACHE = 64
"""Threads whose rebuilt history is kept (the most recently read): enough for as many conversations
answered in turn (a cycle over more than this would miss every time)."""
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


class InlineSqliteSaver(SqliteSaver):
    """``SqliteSaver`` whose async methods run the sync ones directly (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection, *, history_cache: int = HISTORY_CACHE) -> None:
        super().__init__(conn)
        # Outside the releases its table SQL was verified on, SqliteSaver's own path: no kept
        # history, row-by-row writes (compat/langgraph.py).
        self.own_sql = langgraph_compat.usable()
        self.history_cache = history_cache if self.own_sql else 0
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._kept_bytes = 0
        self._data_version: int | None = None

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
        self._forget_all()
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
        with self.cursor(transaction=False) as cur:
            version = cur.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            # Another connection (another process) committed to the file: what is kept may miss it.
            self._data_version = version
            self._forget_all()
        while self._known and next(iter(self._known.values())).used < now - HISTORY_IDLE:
            self._drop(next(iter(self._known)))
        known = self._known.get(thread)
        if known is not None and known.channels == wanted:
            history = known.advance(target)
            if history is not None:
                known.used = now
                self._known.move_to_end(thread)
                out = _handed_out(history)
                if known.size > HISTORY_BYTES // 4:
                    self._drop(thread)  # grew too big to keep (pictures, long tool output)
                self._trim()
                return out
            if target < known.target:
                # An older checkpoint (the state history, a fork): read it, keep the newer one.
                # Checkpoint ids (uuid6) sort by time; a wrong guess only costs a walk later.
                return super().get_delta_channel_history(config=config, channels=channels)
        self._drop(thread)
        history = dict(super().get_delta_channel_history(config=config, channels=channels))
        size = _size([entry.get("seed") for entry in history.values()]) + sum(
            _size(v) for entry in history.values() for _, _, v in entry["writes"]
        )
        if size > HISTORY_BYTES // 4:
            return history  # too big to keep: read from the database each time, as before
        known = _Known(target, wanted, history, now, size)
        # Writes already stored against the target (a paused or failed step's) are not part of its
        # history, but later checkpoints will chain through it.
        with self.cursor(transaction=False) as cur:
            rows = langgraph_compat.stored_writes(cur, thread, target, with_path=self._task_path())
            stored = {
                (task_id, idx): (path, ch, self.serde.loads_typed((kind, blob)) if ch in wanted else None)
                for task_id, idx, path, ch, kind, blob in rows
            }
        if stored:
            known.writes[target] = stored
        self._known[thread] = known
        self._kept_bytes += size
        out = _handed_out(history)
        self._trim()
        return out

    def _task_path(self) -> bool:
        return langgraph_compat.has_task_path(self)

    def _drop(self, thread: str) -> None:
        known = self._known.pop(thread, None)
        if known is not None:
            self._kept_bytes -= known.size

    def _forget_all(self) -> None:
        self._known.clear()
        self._kept_bytes = 0

    def _trim(self) -> None:
        """Least recently read first, until within ``history_cache`` threads and HISTORY_BYTES."""
        while self._known and (len(self._known) > self.history_cache or self._kept_bytes > HISTORY_BYTES):
            self._drop(next(iter(self._known)))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        found = self._known_for(config)
        try:
            saved = super().put(config, checkpoint, metadata, new_versions)
        except BaseException:
            if found is not None:
                self._drop(found[0])
            raise
        if found is not None:
            thread, known = found
            cid, parent = checkpoint["id"], config["configurable"].get("checkpoint_id")
            values = checkpoint.get("channel_values") or {}
            if cid == known.target or cid in known.parents or any(ch in values for ch in known.channels):
                # A re-put id, or a snapshot the database walk would now seed from: read it there.
                self._drop(thread)
            elif parent is not None:
                known.parents[cid] = parent
        return saved

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """``SqliteSaver.put_writes``, each value serialised once for the database and what is kept,
        so both hold the same bytes even if a node changes the object while this runs (the sync
        graph API calls this from a worker thread while the next step runs)."""
        if not self.own_sql:
            super().put_writes(config, writes, task_id, task_path)
            return
        conf = config["configurable"]
        thread, ns, cid = str(conf["thread_id"]), str(conf["checkpoint_ns"]), str(conf["checkpoint_id"])
        dumps = self.serde.dumps_typed
        rows = [
            (thread, ns, cid, task_id, task_path, WRITES_IDX_MAP.get(ch, idx), ch, *dumps(value))
            for idx, (ch, value) in enumerate(writes)
        ]
        # As SqliteSaver: only the special channels' writes (errors, interrupts...) replace.
        replace = all(ch in WRITES_IDX_MAP for ch, _ in writes)
        try:
            with self.cursor(transaction=False) as cur:
                # One transaction: a batch that fails halfway (a full disk) leaves none of its rows,
                # so LangGraph runs the task again instead of counting it done with half its writes
                # (SqliteSaver's autocommit keeps the rows before the failing one).
                cur.execute("BEGIN IMMEDIATE")
                try:
                    langgraph_compat.insert_writes(cur, rows, replace=replace)
                    cur.execute("COMMIT")
                except BaseException:
                    if self.conn.in_transaction:
                        cur.execute("ROLLBACK")
                    raise
        except BaseException:
            self._drop(thread)
            raise
        found = self._known_for(config)
        if found is None:
            return
        thread, known = found
        if cid in known.folded:
            # A write to a checkpoint already folded into the kept history (it came after a later
            # checkpoint was read): let the database walk place it.
            if any(ch in known.channels for ch, _ in writes):
                self._drop(thread)
            return
        # Writes may also come before their checkpoint's ``put`` (the sync graph API stores both
        # from worker threads): kept by id until a chain reaches it.
        stored = known.writes.setdefault(cid, {})
        path = task_path if self._task_path() else ""
        for _, _, _, _, _, idx, ch, kind, blob in rows:
            key = (task_id, idx)
            if key in stored and not replace:
                continue  # INSERT OR IGNORE: the database keeps the first
            if ch in known.channels:
                stored[key] = (path, ch, self.serde.loads_typed((kind, blob)))
                known.size += len(blob) + 100
                self._kept_bytes += len(blob) + 100
            else:
                stored[key] = (path, ch, None)

    def delete_thread(self, thread_id: str) -> None:
        self._drop(str(thread_id))
        super().delete_thread(thread_id)

    def prune_thread(self, thread_id: str, delta_channels: Sequence[str]) -> int:
        """Delete the thread's checkpoints (root namespace) its latest does not need, and their
        writes, in one transaction (agent/compaction.py); the number deleted. The kept history in
        memory stays valid: it only ever reads the latest checkpoint's chain, which is kept."""
        if not self.own_sql:
            return 0  # outside the releases the table SQL was verified on (compat/langgraph.py)
        thread = str(thread_id)
        latest = self.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        if latest is None:
            return 0
        head = str(latest.config["configurable"]["checkpoint_id"])
        versions = latest.checkpoint.get("channel_versions") or {}
        versioned = [ch for ch in delta_channels if ch in versions]
        counters = (latest.metadata or {}).get("counters_since_delta_snapshot")
        with self.cursor(transaction=False) as cur:
            cur.execute("BEGIN IMMEDIATE")
            try:
                parents = langgraph_compat.checkpoint_parents(cur, thread)
                kept = kept_chain(head, parents, counters, versioned)
                # Only older ids: a checkpoint put since the latest was read is not judged here.
                gone = [] if kept is None else [c for c in parents if c not in kept and c < head]
                if gone:
                    langgraph_compat.delete_checkpoints(cur, thread, gone)
                cur.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    cur.execute("ROLLBACK")
                raise
        return len(gone)

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
