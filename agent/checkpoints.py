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
rewrites ``tool_calls``) cannot change what the next turn reads. The keeping itself is
agent/history_cache.py, shared with the PostgreSQL saver (agent/postgres_saver.py), where several
daemons share a thread; here any commit by another connection to the file drops it all.

A step's writes go in one transaction (``SqliteSaver`` commits row by row): a batch that fails
halfway on a full disk would leave rows LangGraph then counts as the whole step.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
)
from langgraph.checkpoint.sqlite import SqliteSaver

from agent.compaction import kept_chain
from agent.history_cache import HISTORY_BYTES, HISTORY_CACHE, HISTORY_IDLE, OLDER, KeptHistories
from compat import langgraph as langgraph_compat

__all__ = ["HISTORY_BYTES", "HISTORY_CACHE", "HISTORY_IDLE", "InlineSqliteSaver"]


class InlineSqliteSaver(SqliteSaver):
    """``SqliteSaver`` whose async methods run the sync ones directly (see the module docstring)."""

    def __init__(self, conn: sqlite3.Connection, *, history_cache: int = HISTORY_CACHE) -> None:
        super().__init__(conn)
        # Outside the releases its table SQL was verified on, SqliteSaver's own path: no kept
        # history, row-by-row writes (compat/langgraph.py).
        self.own_sql = langgraph_compat.usable()
        self.history_cache = history_cache if self.own_sql else 0
        self.kept = KeptHistories(self.history_cache)
        self._known = self.kept.known  # the kept threads (read by tests)
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
        self.kept.forget_all()
        self.conn.close()

    # ---- the kept histories (agent/history_cache.py) ---------------------------------------------
    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        conf = config["configurable"]
        target = get_checkpoint_id(config)
        wanted = tuple(channels)
        if conf.get("checkpoint_ns", "") or not target or not wanted or self.history_cache <= 0:
            return super().get_delta_channel_history(config=config, channels=channels)
        thread = str(conf["thread_id"])
        with self.cursor(transaction=False) as cur:
            version = cur.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            # Another connection (another process) committed to the file: what is kept may miss it.
            self._data_version = version
            self.kept.forget_all()
        found = self.kept.lookup(thread, target, wanted)
        if found is OLDER:
            return super().get_delta_channel_history(config=config, channels=channels)
        if found is not None:
            return dict(found)
        history = dict(super().get_delta_channel_history(config=config, channels=channels))
        size = self.kept.size_of(history)
        if size is None:
            return history  # too big to keep: read from the database each time, as before
        with self.cursor(transaction=False) as cur:
            rows = langgraph_compat.stored_writes(cur, thread, target, with_path=self._task_path())
            stored = {
                (task_id, idx): (path, ch, self.serde.loads_typed((kind, blob)) if ch in wanted else None)
                for task_id, idx, path, ch, kind, blob in rows
            }
        return self.kept.keep(thread, target, wanted, history, size, stored)

    def _task_path(self) -> bool:
        return langgraph_compat.has_task_path(self)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        found = self.kept.for_config(config)
        try:
            saved = super().put(config, checkpoint, metadata, new_versions)
        except BaseException:
            if found is not None:
                self.kept.drop(found[0])
            raise
        self.kept.put(found, config, checkpoint)
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
            self.kept.drop(thread)
            raise
        found = self.kept.for_config(config)
        if found is None:
            return
        channels = found[1].channels
        kept = [
            (idx, ch, self.serde.loads_typed((kind, blob)) if ch in channels else None)
            for _, _, _, _, _, idx, ch, kind, blob in rows
        ]
        self.kept.put_writes(config, task_id, task_path if self._task_path() else "", kept, replace)

    def delete_thread(self, thread_id: str) -> None:
        self.kept.drop(str(thread_id))
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
