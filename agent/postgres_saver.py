"""LangGraph's ``AsyncPostgresSaver`` keeping recent threads' rebuilt history in memory.

Why: deepagents' ``messages`` is a delta channel, so every state read rebuilds the conversation by
walking the thread's checkpoints back to the last snapshot and deserialising every write since (two
statements and the whole history, per read). A turn reads its thread three times (the harness's
prepare, the graph's own start, the choices check after it), and on one PostgreSQL daemon this
was the largest part of what a message cost beyond a SQLite daemon (docs/scale-out.md, "What
coordination costs"). The SQLite saver has kept the history since issue 18; this keeps it the same
way (agent/history_cache.py).

**Several daemons share a thread.** Memory answers a read only when the chain of checkpoints from
the one read leads back to the kept one through checkpoints *this process* put; a checkpoint another
daemon put is never in that chain, so a turn that ran elsewhere makes the next read here a database
walk. What another process can still add to a chain of ours: writes against our latest checkpoint
(a daemon that took the turn over, stored a step's writes and died before its checkpoint). Those
are not part of the history *at* that checkpoint, but they are of the next one, so every read
served from memory must know the writes stored against its target. LangGraph reads the checkpoint
itself (``aget_tuple``, with its pending writes) just before its history: when that read found no
write this saver does not know of, nothing more is asked; otherwise the writes stored against the
target are read (one statement) and added to what is kept. Two daemons writing the same thread at
once is what the lease fence prevents (docs/scale-out.md); it would corrupt the thread with or
without this.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
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
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from agent.history_cache import HISTORY_CACHE, OLDER, KeptHistories, Stored
from compat import langgraph as langgraph_compat


class _Activity:
    """Writes of one thread begun or ended in this process. A read from the database that saw it
    change (a write landed between its statements) hands its history out without keeping it; a
    write waits for nothing before LangGraph serialises its values (a node may change them)."""

    __slots__ = ("__weakref__", "count")

    def __init__(self) -> None:
        self.count = 0


class KeptPostgresSaver(AsyncPostgresSaver):
    """``AsyncPostgresSaver`` with :class:`agent.history_cache.KeptHistories` (see the module
    docstring). Outside the verified releases of langgraph-checkpoint-postgres (its writes table is
    read with Chital's SQL) nothing is kept: every read walks the database, as the saver does."""

    def __init__(self, conn: Any, *args: Any, history_cache: int = HISTORY_CACHE, **kwargs: Any) -> None:
        super().__init__(conn, *args, **kwargs)
        self.history_cache = history_cache if langgraph_compat.postgres_usable() else 0
        self.kept = KeptHistories(self.history_cache)
        # Per thread, the checkpoint its last tuple read returned and its pending writes'
        # (task_id, channel): used (once) by the history read that follows.
        self._pending: dict[str, tuple[str, frozenset[tuple[str, str]]]] = {}
        self._activity: weakref.WeakValueDictionary[str, _Activity] = weakref.WeakValueDictionary()

    def _writes_of(self, thread: str) -> _Activity:
        """The thread's write counter, alive while a read or a write of the thread holds it."""
        act = self._activity.get(thread)
        if act is None:
            act = self._activity[thread] = _Activity()
        return act

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = await super().aget_tuple(config)
        conf = found.config["configurable"] if found is not None else {}
        if found is not None and not conf.get("checkpoint_ns") and self.history_cache > 0:
            pending = frozenset((str(t), str(ch)) for t, ch, _ in found.pending_writes or ())
            self._pending[str(conf["thread_id"])] = (str(conf["checkpoint_id"]), pending)
            if len(self._pending) > 4 * self.history_cache:
                self._pending.pop(next(iter(self._pending)))
        return found

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        conf = config["configurable"]
        target = get_checkpoint_id(config)
        wanted = tuple(channels)
        if conf.get("checkpoint_ns", "") or not target or not wanted or self.history_cache <= 0:
            return await super().aget_delta_channel_history(config=config, channels=channels)
        thread = str(conf["thread_id"])
        found = self.kept.lookup(thread, target, wanted)
        if found is OLDER:
            return await super().aget_delta_channel_history(config=config, channels=channels)
        if found is not None:
            seen = self._pending.pop(thread, None)
            if seen is None or seen[0] != target or not self.kept.knows(thread, target, seen[1]):
                self.kept.stored_at(thread, target, await self._stored(thread, target, wanted))
            return dict(found)
        activity = self._writes_of(thread)
        before = activity.count
        history = dict(await super().aget_delta_channel_history(config=config, channels=channels))
        size = self.kept.size_of(history)
        if size is None:
            return history  # too big to keep: read from the database each time
        stored = await self._stored(thread, target, wanted)
        if activity.count != before:
            return history  # a write of the thread landed meanwhile: kept at the next read
        return self.kept.keep(thread, target, wanted, history, size, stored)

    async def _stored(self, thread: str, target: str, wanted: tuple[str, ...]) -> Stored:
        """The writes stored against ``target`` (root namespace), delta channels' values loaded."""
        pool: Any = self.conn  # the pool agent/postgres.py opens
        async with pool.connection() as conn:
            cur = await conn.execute(langgraph_compat.PG_STORED_WRITES, (thread, target))
            rows = await cur.fetchall()
        loads = self.serde.loads_typed
        return {
            (str(r["task_id"]), int(r["idx"])): (
                str(r["task_path"] or ""),
                str(r["channel"]),
                loads((r["type"], r["blob"])) if r["channel"] in wanted else None,
            )
            for r in rows
        }

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        activity = self._writes_of(str(config["configurable"]["thread_id"]))
        activity.count += 1
        found = self.kept.for_config(config)
        try:
            saved = await super().aput(config, checkpoint, metadata, new_versions)
        except BaseException:
            if found is not None:
                self.kept.drop(found[0])
            raise
        finally:
            activity.count += 1
        self.kept.put(found, config, checkpoint)
        return saved

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """The saver's own ``aput_writes`` (one statement batch in a pipeline, so all or none of a
        step's rows). What is kept is serialised and read back before the first wait, so it is the
        value the database gets even if a node changes the object while the write is under way."""
        thread = str(config["configurable"]["thread_id"])
        found = self.kept.for_config(config)
        kept: list[tuple[int, str, Any]] = []
        if found is not None:  # before the first wait (see above)
            channels = found[1].channels
            dumps, loads = self.serde.dumps_typed, self.serde.loads_typed
            kept = [
                (WRITES_IDX_MAP.get(ch, idx), ch, loads(dumps(value)) if ch in channels else None)
                for idx, (ch, value) in enumerate(writes)
            ]
        activity = self._writes_of(thread)
        activity.count += 1
        try:
            await super().aput_writes(config, writes, task_id, task_path)
        except BaseException:
            self.kept.drop(thread)
            raise
        finally:
            activity.count += 1
        now = self.kept.for_config(config)
        if (now and now[1]) is not (found and found[1]):
            # A read kept the thread anew while this was under way: it may not have seen it.
            self.kept.drop(thread)
        elif found is not None:
            replace = all(ch in WRITES_IDX_MAP for ch, _ in writes)
            self.kept.put_writes(config, task_id, task_path, kept, replace)

    async def adelete_thread(self, thread_id: str) -> None:
        activity = self._writes_of(str(thread_id))
        activity.count += 1
        self.kept.drop(str(thread_id))
        try:
            await super().adelete_thread(thread_id)
        finally:
            activity.count += 1
            self.kept.drop(str(thread_id))
