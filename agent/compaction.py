"""A long thread costs what a short one does: its state stops growing, and so do its checkpoints.

Measured before this (docs/performance.md, issue 27): one thread of 1,000 turns went from 6 to 39 ms
of CPU per turn, and its checkpoint file grew by 30 KB a turn at the end. Three things grew with the
thread, each fixed here with the libraries' own means:

- **The messages in state.** deepagents' summarization (agent/context.py) only cuts what the model
  sees: the raw history stays in state, and every turn hands it out, reduces over it, and snapshots
  it every 50 updates. :func:`drop_summarised` makes the summary step also remove, in the same graph
  step, the messages its summary covers (``RemoveMessage`` by id, so the step's other writes, the
  model's answer among them, keep their order) and moves the summary's cut to match: the model sees
  exactly what it saw before, and the state holds the summary plus the messages since. What is
  never dropped: the message that started the running turn and everything after it, so a turn
  resumed after a crash finds its own message (agent/harness.py), and the messages of the last
  turns the summary keeps (``keep_recent_messages``), so a message retried while it is still
  recent replays its answer.
- **The history file.** deepagents appends what it summarised to ``/conversation_history/<id>.md``
  in the thread's state and rewrites the whole file each time. :class:`BoundedHistoryBackend` keeps
  its newest ``HISTORY_FILE_CHARS`` (whole sections; older ones are in the summary).
- **The checkpoints.** LangGraph keeps every checkpoint of every step. Only the latest is needed to
  resume, plus the ancestors its delta channels are rebuilt from: a thread's messages and files
  live in DeltaChannels, whose value at a checkpoint is the nearest ancestor's snapshot plus the
  writes since. :func:`kept_chain` picks the latest checkpoint and its ancestors back to the nearest
  snapshot of every delta channel it has (the checkpoint's own ``counters_since_delta_snapshot``
  says how far), and the savers delete the rest of the thread's root-namespace checkpoints and
  their writes in one transaction (``InlineSqliteSaver.prune_thread``, ``agent.postgres.prune``).
  Snapshots come every 50 updates of a channel, and, for a channel rarely written (the files), at
  least every :data:`MAX_SUPERSTEPS_SINCE_SNAPSHOT` steps (LangGraph's documented environment
  variable, set in agent/__init__.py), so the kept chain is bounded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AnyMessage, HumanMessage, RemoveMessage

log = logging.getLogger(__name__)

MAX_SUPERSTEPS_SINCE_SNAPSHOT = 200
"""LangGraph's ``LANGGRAPH_DELTA_MAX_SUPERSTEPS_SINCE_SNAPSHOT`` (its default: 5,000): a delta
channel is snapshotted at least this often, so pruning never keeps more than this many steps."""
HISTORY_FILE_CHARS = 64_000
"""The newest part of the summarised-history file kept in state."""
HISTORY_PREFIX = "/conversation_history/"
EVENT_KEY = "_summarization_event"
PRUNE_EVERY = 10
"""Finished turns of a thread between two prunes of its checkpoints (each prune reads the thread's
checkpoint ids and deletes what is not kept: cheap, but not worth doing every turn)."""


# ---- the messages in state ----------------------------------------------------------------------
def _turn_start(message: AnyMessage) -> bool:
    return isinstance(message, HumanMessage) and message.additional_kwargs.get("lc_source") != "summarization"


def drop_summarised(
    update: dict[str, Any], state_messages: Sequence[AnyMessage], seen: Sequence[AnyMessage] | None = None
) -> dict[str, Any]:
    """``update`` (the state update of a summary step: the new ``_summarization_event``, maybe
    ``messages``) with the messages the new summary covers removed from state and the event's
    indices moved to match. Unchanged when nothing can be dropped.

    Dropped: the state's messages before the summary's cut, and never the latest turn's start or
    anything after it (see the module docstring). The cut also stops at a message without an id
    (nothing could remove it), at one the update itself rewrites (deepagents replaces offloaded
    tool results by id: removed first, it would come back at the end), and where ``seen`` (the
    request's messages, which the cut indexes) stops matching the state."""
    event = update.get(EVENT_KEY)
    if not isinstance(event, dict):
        return update
    cutoff = event.get("cutoff_index")
    if not isinstance(cutoff, int) or cutoff <= 0:
        return update
    latest = next((i for i in range(len(state_messages) - 1, -1, -1) if _turn_start(state_messages[i])), 0)
    cut = min(cutoff, latest, len(state_messages))
    tail = update.get("messages")
    tail_list = list(tail) if isinstance(tail, list) else [tail] if tail is not None else []
    rewritten = {getattr(m, "id", None) for m in tail_list} - {None}
    for i in range(cut):
        mid = state_messages[i].id
        if mid is None or mid in rewritten or (seen is not None and (i >= len(seen) or seen[i].id != mid)):
            cut = i
            break
    if cut <= 0:
        return update
    moved = dict(event, cutoff_index=cutoff - cut)
    created = event.get("created_at_index")
    if isinstance(created, int):
        moved["created_at_index"] = max(created - cut, 0)
    removals: list[Any] = [RemoveMessage(id=str(m.id)) for m in state_messages[:cut]]
    messages = removals + tail_list
    return {**update, EVENT_KEY: moved, "messages": messages}


# ---- the summarised-history file ----------------------------------------------------------------
def bounded_history(content: str, limit: int = HISTORY_FILE_CHARS) -> str:
    """``content`` cut to its newest ``limit`` characters, at a section start ("## Summarized at")
    when one lies within them; the newest section is kept whole even when longer."""
    if len(content) <= limit:
        return content
    start = content.find("## Summarized at", len(content) - limit)
    if start < 0:
        start = content.rfind("## Summarized at")
    return content[start:] if start > 0 else content


def bounded_history_backend(limit: int = HISTORY_FILE_CHARS) -> Any:
    """deepagents' StateBackend, with the summarised-history file kept to ``limit`` characters
    (deepagents rewrites it with ``edit(path, old, old + new_section)``)."""
    from deepagents.backends import StateBackend

    class BoundedHistoryBackend(StateBackend):
        def edit(self, file_path: str, old_string: str, new_string: str, *args: Any, **kwargs: Any) -> Any:
            if file_path.startswith(HISTORY_PREFIX):
                new_string = bounded_history(new_string, limit)
            return super().edit(file_path, old_string, new_string, *args, **kwargs)

    return BoundedHistoryBackend()


# ---- the checkpoints ----------------------------------------------------------------------------
def kept_chain(
    latest: str,
    parents: Mapping[str, str | None],
    counters: Mapping[str, Any] | None,
    versioned: Sequence[str],
) -> set[str] | None:
    """The checkpoint ids a thread's latest checkpoint needs: itself and its ancestors back to the
    nearest snapshot of each delta channel in ``versioned`` (the delta channels the latest
    checkpoint has a version of). ``counters``: its metadata's ``counters_since_delta_snapshot``
    (channel -> [updates, steps] since that channel's last snapshot; a channel missing was
    snapshotted in the latest checkpoint itself). None when the chain cannot be followed that far
    (a parent missing, counters unreadable): then nothing is pruned."""
    depth = 0
    for channel in versioned:
        entry = (counters or {}).get(channel)
        if entry is None:
            continue
        try:
            steps = int(entry[1])
        except (TypeError, ValueError, IndexError):
            return None
        depth = max(depth, steps)
    if latest not in parents:
        return None
    kept = {latest}
    cid = latest
    for _ in range(depth):
        parent = parents[cid]
        if parent is None:
            break  # the thread's first checkpoint: its whole chain is kept
        if parent not in parents:
            return None  # the walk would leave the stored checkpoints: keep everything
        kept.add(parent)
        cid = parent
    return kept


class Pruner:
    """Prunes a harness's threads: every ``PRUNE_EVERY`` finished turns of a thread, its checkpoints
    that the latest one does not need go (``InlineSqliteSaver.prune_thread``, ``agent.postgres.prune``).
    Called inside the thread's lock, so no step of the thread runs meanwhile."""

    def __init__(self, saver: Any, graph: Any, *, postgres: bool, threads: int = 4096) -> None:
        from langgraph.channels.delta import DeltaChannel

        self.saver, self.postgres, self.threads = saver, postgres, threads
        self.channels = tuple(name for name, ch in graph.channels.items() if isinstance(ch, DeltaChannel))
        self._unpruned: dict[str, int] = {}
        """Finished turns per thread since its last prune (the most recent ``threads`` threads)."""

    async def after_turn(self, thread_id: str) -> None:
        """Count a finished turn; prune on every ``PRUNE_EVERY``-th. A failure is logged, never the
        turn's: the checkpoints stay for the next try."""
        done = self._unpruned.pop(thread_id, 0) + 1
        if done < PRUNE_EVERY:
            if len(self._unpruned) >= self.threads:
                self._unpruned.pop(next(iter(self._unpruned)))
            self._unpruned[thread_id] = done
            return
        try:
            await self.prune(thread_id)
        except Exception as exc:
            log.warning("thread %s: pruning its checkpoints failed (%s)", thread_id, type(exc).__name__)

    async def prune(self, thread_id: str) -> int:
        """Prune one thread now; the number of checkpoints deleted."""
        if self.postgres:
            from agent.postgres import prune

            return await prune(self.saver, thread_id, self.channels)
        return int(self.saver.prune_thread(thread_id, self.channels))
