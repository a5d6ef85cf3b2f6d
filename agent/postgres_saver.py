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

**Whether anyone else wrote a thread.** A turn on a thread whose last turn finished here needs no
state read to know its message is new (agent/harness.py), if no other daemon touched the thread
since. :meth:`KeptPostgresSaver.unchanged_since_own` answers that with the read the graph's start
makes anyway (the thread's latest checkpoint, with its pending writes): the checkpoint must be
the one this process put last, with nothing stored against it. That read is then handed to the
graph's own ``aget_tuple`` (once, within a second, when this process wrote nothing of the thread
meanwhile), so the check costs no statement of its own.

**A turn's first step.** A run with new input puts the input checkpoint, the input's writes and step
0's checkpoint before its first node runs, then the lead model's writes and step 1's checkpoint
after it: five round trips, with nothing in between that lasts but the model call (no tool has run).
The first three are held in memory, their statements already serialised (``compat/langgraph.py``
``RecordingCursor``), and sent with step 0's checkpoint in one pipeline; the model's writes are held
and sent with step 1's: two round trips, each batch committing together. (Step 0 is not held with
the input: one round trip fewer, but a reader would then see nothing of a turn during its model
call; ``/tasks`` said a running task still waited.) A crash or a failure before a send costs what
one a moment earlier did: the message is still journaled, and the turn starts again (the model is
asked again). Only the model's node (``held_nodes``, which runs alone in its step) has its writes
held: any other node's writes send what is held first, alone, then go as the library sends them (the
tools' at once: several run side by side in one step, and each must be stored as it ends). A later
model step holds its writes the same way, until its step's checkpoint. What is held is sent by the
turn itself: before another write of the thread that cannot join (a subgraph's, writes against
another checkpoint) and when the turn ends before the step does (:meth:`KeptPostgresSaver.scoped`: a
cancel, the model failing); a send that fails keeps it held (a step stored without the input before
it would cut the thread's history there). A task of the turn that outlives its scope holds nothing
(nothing would send it). A reader of the thread meanwhile (``/status``) sees it as before the turn
began. Outside the verified releases of langgraph-checkpoint-postgres nothing is held.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from agent.held_checkpoints import TURN, Held, HeldPut, HeldScope, HeldWrites, in_turn
from agent.history_cache import HISTORY_CACHE, OLDER, KeptHistories, Stored
from compat import langgraph as langgraph_compat

if TYPE_CHECKING:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as _Saver
else:
    _Saver = langgraph_compat.postgres_saver_base()

log = logging.getLogger(__name__)
TurnScope = Callable[[str], contextlib.AbstractAsyncContextManager[Any]]

PEEK_SECONDS = 1.0
"""How long the read :meth:`KeptPostgresSaver.unchanged_since_own` made answers the next
``aget_tuple`` of the thread (the graph's start, milliseconds later). Under the conversation's
lease nobody else writes the thread meanwhile; half the shortest lease a config allows
(``cluster.lease_seconds`` >= 2), so a stalled daemon's read never outlives its lease."""
_OWN_PUTS = 1024
"""Threads whose last checkpoint put by this process is remembered (oldest forgotten)."""
_HELD_MAX = 1024
"""Threads whose input may be held at once (one per running turn); past it, inputs go out at once."""


class _Activity:
    """Writes of one thread begun or ended in this process. A read from the database that saw it
    change (a write landed between its statements) hands its history out without keeping it; a
    write waits for nothing before LangGraph serialises its values (a node may change them)."""

    __slots__ = ("__weakref__", "count")

    def __init__(self) -> None:
        self.count = 0


class KeptPostgresSaver(_Saver):
    """``AsyncPostgresSaver`` with :class:`agent.history_cache.KeptHistories` (see the module
    docstring). Outside the verified releases of langgraph-checkpoint-postgres (its writes table is
    read with Chital's SQL) nothing is kept: every read walks the database, as the saver does."""

    def __init__(
        self,
        conn: Any,
        *args: Any,
        history_cache: int = HISTORY_CACHE,
        held_nodes: Sequence[str] = ("model",),
        **kwargs: Any,
    ) -> None:
        super().__init__(conn, *args, **kwargs)
        self.history_cache = history_cache if langgraph_compat.postgres_usable() else 0
        self.kept = KeptHistories(self.history_cache)
        # Per thread, the checkpoint its last tuple read returned and its pending writes'
        # (task_id, channel): used (once) by the history read that follows.
        self._pending: dict[str, tuple[str, frozenset[tuple[str, str]]]] = {}
        self._activity: weakref.WeakValueDictionary[str, _Activity] = weakref.WeakValueDictionary()
        # Per thread, the id of the last checkpoint this process put (root namespace), and the
        # latest read kept for the next aget_tuple: (tuple, when, activity, its count then).
        self._own: dict[str, str] = {}
        self._peeked: dict[str, tuple[CheckpointTuple, float, _Activity, int]] = {}
        self._held: dict[str, Held] = {}
        self.holds_turns = langgraph_compat.postgres_usable() and isinstance(conn, AsyncConnectionPool)
        """Whether a turn's checkpoints and the model's writes are held at all (see the module docstring)."""
        self.held_nodes = frozenset(held_nodes)
        """Nodes whose writes wait for their step's checkpoint: each runs alone in its step."""

    def _writes_of(self, thread: str) -> _Activity:
        """The thread's write counter, alive while a read or a write of the thread holds it."""
        act = self._activity.get(thread)
        if act is None:
            act = self._activity[thread] = _Activity()
        return act

    async def unchanged_since_own(self, thread_id: str) -> bool:
        """Whether the thread's latest checkpoint in the database is the last one this process put,
        with no writes stored against it: then no other daemon wrote the thread since. The read is
        kept for the thread's next ``aget_tuple`` (see the module docstring)."""
        thread = str(thread_id)
        own = self._own.get(thread)
        self._peeked.pop(thread, None)
        if own is None:
            return False
        activity = self._writes_of(thread)
        count = activity.count
        found = await self.aget_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        if found is None:
            return False
        if activity.count == count and count % 2 == 0:  # no write of ours under way or landed
            self._peeked[thread] = (found, time.monotonic(), activity, count)
            while len(self._peeked) > 64:
                self._peeked.pop(next(iter(self._peeked)))
        return found.checkpoint["id"] == own and not found.pending_writes

    def _take_peek(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The read :meth:`unchanged_since_own` kept, for a read of the thread's latest checkpoint,
        while it is young and this process wrote nothing of the thread since (else None)."""
        conf = config["configurable"]
        if not self._peeked or conf.get("checkpoint_ns", "") or get_checkpoint_id(config):
            return None
        peek = self._peeked.pop(str(conf["thread_id"]), None)
        if peek is None:
            return None
        found, when, activity, count = peek
        if time.monotonic() - when > PEEK_SECONDS or activity.count != count:
            return None
        return found

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = self._take_peek(config)
        if found is None:
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
        thread = str(config["configurable"]["thread_id"])
        root = not config["configurable"].get("checkpoint_ns", "")
        holding = root and self.holds_turns and in_turn(thread) and len(self._held) < _HELD_MAX
        if holding and metadata.get("source") == "input":
            await self.send_held(thread)  # an earlier input whose turn stopped before its step 0
            saved, statements = await self._recorded_put(config, checkpoint, metadata, new_versions)
            self._held[thread] = Held(str(checkpoint["id"]), [HeldPut(config, checkpoint)], statements)
            await self._send_unless_in_turn(thread)
            return saved
        held: Held | None = self._held.pop(thread, None) if self._held else None
        if held is not None and not root:  # a subgraph's checkpoint: the input goes first, alone
            self._held[thread] = held
            await self.send_held(thread)
            held = None
        activity = self._writes_of(thread)
        activity.count += 1
        found = self.kept.for_config(config)
        if root:
            self._own.pop(thread, None)
        try:
            if held is None:
                saved = await super().aput(config, checkpoint, metadata, new_versions)
            else:
                saved, statements = await self._recorded_put(config, checkpoint, metadata, new_versions)
                await self._send(held, statements)
        except BaseException:
            if found is not None:
                self.kept.drop(found[0])
            raise
        finally:
            activity.count += 1
        if held is not None:
            self._kept_held(thread, held)
        self.kept.put(found, config, checkpoint)
        if root:
            self._owned(thread, str(checkpoint["id"]))
        return saved

    async def _recorded_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        versions: ChannelVersions,
    ) -> tuple[RunnableConfig, list[tuple[str, Any, bool]]]:
        """The library's put, its statements recorded (serialised) instead of sent."""
        rec = langgraph_compat.RecordingCursor()
        with langgraph_compat.saver_statements_to(rec):
            saved = await super().aput(config, checkpoint, metadata, versions)
        return saved, rec.statements

    async def _send_unless_in_turn(self, thread: str) -> None:
        """Send what was just held if the turn's scope ended while it was being recorded."""
        if not in_turn(thread):
            await self.send_held(thread)

    def _owned(self, thread: str, checkpoint_id: str) -> None:
        self._own[thread] = checkpoint_id
        if len(self._own) > _OWN_PUTS:
            self._own.pop(next(iter(self._own)))

    async def _send(self, held: Held, then: Sequence[tuple[str, Any, bool]] = ()) -> None:
        """The held statements, then ``then``, in one pipeline on one pooled connection: one round
        trip, and one transaction (no sync in between), as the library's own puts are."""
        pool: Any = self.conn
        async with (
            pool.connection() as conn,
            conn.pipeline(),
            conn.cursor(binary=True, row_factory=dict_row) as cur,
        ):
            await langgraph_compat.run_statements(cur, held.statements)
            await langgraph_compat.run_statements(cur, then)

    def _kept_held(self, thread: str, held: Held) -> None:
        """Bookkeeping of the held checkpoints and writes, now stored, in the order LangGraph made
        the calls (before the checkpoint that followed them)."""
        for item in held.items:
            if isinstance(item, HeldPut):
                self.kept.put(self.kept.for_config(item.config), item.config, item.checkpoint)
            else:
                w = item
                self._kept_writes(thread, w.config, w.task_id, w.task_path, w.writes, w.found, w.kept)

    async def send_held(self, thread_id: str, *, keep: bool = True) -> None:
        """Store what is held of the thread (see :class:`Held`) now, alone: before another write of
        the thread that cannot join it, or when its turn ended before its step did. Only the
        turn's own calls send it (a reader of the thread meanwhile sees it as before the turn,
        the input's message being in its pending writes, not in its values); one that fails keeps
        it held, so what follows in the chain never lands without it (``keep`` False: the turn
        ended, nothing follows, and what could not be sent is dropped, as if never put)."""
        thread = str(thread_id)
        held = self._held.pop(thread, None) if self._held else None
        if held is None:
            return
        activity = self._writes_of(thread)
        activity.count += 1
        self._own.pop(thread, None)
        try:
            await self._send(held)
        except BaseException:
            self.kept.drop(thread)
            if keep:
                self._held.setdefault(thread, held)  # not lost: its turn's next put sends it again
            raise
        finally:
            activity.count += 1
        self._kept_held(thread, held)
        last = held.last_put
        if last is not None:
            self._owned(thread, str(last.checkpoint["id"]))

    def scoped(self, inner: TurnScope | None) -> TurnScope:
        """The harness's per-turn scope (``inner``, if any) that, on leaving, stores what is still
        held of the thread: a turn cancelled between its input and its step 0 leaves the database
        as it did before inputs were held."""

        @contextlib.asynccontextmanager
        async def scope(thread_id: str) -> AsyncIterator[None]:
            turn = HeldScope(str(thread_id))
            token = TURN.set(turn)
            try:
                if inner is None:
                    yield
                else:
                    async with inner(thread_id):
                        yield
            finally:
                turn.live = False
                TURN.reset(token)
                try:
                    await self.send_held(thread_id, keep=False)
                except Exception as exc:  # the turn's own outcome stands; what it held is as if never put
                    log.warning("thread %s: what its turn held could not be stored: %s", thread_id, exc)

        return scope

    def _kept_rows(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]]
    ) -> tuple[tuple[str, Any] | None, list[tuple[int, str, Any]]]:
        """The thread's kept history and the writes' values as the database will return them,
        serialised now (see :meth:`aput_writes`)."""
        found = self.kept.for_config(config)
        if found is None:
            return None, []
        channels = found[1].channels
        dumps, loads = self.serde.dumps_typed, self.serde.loads_typed
        return found, [
            (WRITES_IDX_MAP.get(ch, idx), ch, loads(dumps(value)) if ch in channels else None)
            for idx, (ch, value) in enumerate(writes)
        ]

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """The saver's own ``aput_writes`` (one statement batch in a pipeline, so all or none of a
        step's rows). What is kept is serialised and read back before the first wait, so it is the
        value the database gets even if a node changes the object while the write is under way.
        The writes of a held input checkpoint are held with it."""
        conf = config["configurable"]
        thread = str(conf["thread_id"])
        root = not conf.get("checkpoint_ns", "")
        held = self._held.get(thread) if self._held else None
        new = (
            held is None
            and root
            and self.holds_turns
            and in_turn(thread)
            and len(self._held) < _HELD_MAX
            and langgraph_compat.pulled_node(task_path) in self.held_nodes  # the step's one task
        )
        if new:
            held = Held(str(conf.get("checkpoint_id")))  # registered once its writes are recorded
        rows = None
        if held is not None:
            if root and conf.get("checkpoint_id") == held.target and held.writes < 8:
                rows = found, kept = self._kept_rows(config, writes)
                rec = langgraph_compat.RecordingCursor()
                with langgraph_compat.saver_statements_to(rec):
                    await super().aput_writes(config, writes, task_id, task_path)
                # Still the thread's held (not sent by a put meanwhile), or a new one in a turn
                # still running: they join it; else they are written alone, now.
                current = self._held.get(thread)
                if new and current is None and in_turn(thread):
                    current = self._held[thread] = held
                if current is held:
                    held.items.append(HeldWrites(config, task_id, task_path, list(writes), found, kept))
                    held.statements.extend(rec.statements)
                    return
            else:
                await self.send_held(thread)
        # Before the first wait (see above); a hold that could not take the writes made them already.
        found, kept = rows if rows is not None else self._kept_rows(config, writes)
        activity = self._writes_of(thread)
        activity.count += 1
        try:
            await super().aput_writes(config, writes, task_id, task_path)
        except BaseException:
            self.kept.drop(thread)
            raise
        finally:
            activity.count += 1
        self._kept_writes(thread, config, task_id, task_path, writes, found, kept)

    def _kept_writes(
        self,
        thread: str,
        config: RunnableConfig,
        task_id: str,
        task_path: str,
        writes: Sequence[tuple[str, Any]],
        found: tuple[str, Any] | None,
        kept: list[tuple[int, str, Any]],
    ) -> None:
        now = self.kept.for_config(config)
        if (now and now[1]) is not (found and found[1]):
            # A read kept the thread anew while this was under way: it may not have seen it.
            self.kept.drop(thread)
        elif found is not None:
            replace = all(ch in WRITES_IDX_MAP for ch, _ in writes)
            self.kept.put_writes(config, task_id, task_path, kept, replace)

    async def adelete_thread(self, thread_id: str) -> None:
        self._held.pop(str(thread_id), None)
        activity = self._writes_of(str(thread_id))
        activity.count += 1
        self.kept.drop(str(thread_id))
        self._own.pop(str(thread_id), None)
        self._peeked.pop(str(thread_id), None)
        try:
            await super().adelete_thread(thread_id)
        finally:
            activity.count += 1
            self.kept.drop(str(thread_id))
