"""The LangGraph checkpointer: langgraph-checkpoint-sqlite's ``SqliteSaver``, called inline.

Why not ``AsyncSqliteSaver``: it sends each of a turn's 20-30 checkpoint reads and writes through
aiosqlite's worker thread, and the thread hand-offs cost more CPU than the statements themselves.
In WAL mode with ``synchronous=NORMAL`` a checkpoint write is a few tens of microseconds of local
work with no fsync, so running the sync saver's own methods on the event loop is cheaper and blocks
the loop less than one context switch would. Durability is the same file, the same tables and the
same commit per write as the async saver (a committed write survives ``kill -9``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata, CheckpointTuple
from langgraph.checkpoint.sqlite import SqliteSaver


class InlineSqliteSaver(SqliteSaver):
    """``SqliteSaver`` whose async methods run the sync ones directly (see the module docstring)."""

    @classmethod
    def open(cls, path: Path) -> InlineSqliteSaver:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        saver = cls(conn)
        saver.setup()
        return saver

    def close(self) -> None:
        self.conn.close()

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
