"""The daemon's background tasks, tracked in one place.

``asyncio.create_task`` keeps only a weak reference to its task, and an exception nobody retrieves
is reported (if at all) as "Task exception was never retrieved" when the task is collected, without
saying which of the daemon's jobs it was. Before this module the Gateway, approvals' timers and
others each kept their own set, and the Gateway's dropped a failed task's exception: a ``resume()``
that failed when a channel reconnected was lost silently. Here every task is held until it ends,
its exception is retrieved and logged once with the task's name, and ``close()`` cancels and awaits
whatever is still running, in one place at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskTracker:
    """Spawns named background tasks, keeps them alive, logs each failure once."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a task named ``name`` (what its failure is logged with)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved: never "exception was never retrieved" later
        if exc is not None and not (self._closed and isinstance(exc, asyncio.CancelledError)):
            log.error("background task %s failed: %s", task.get_name(), exc, exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def running(self) -> frozenset[asyncio.Task[Any]]:
        """The tasks not finished yet."""
        return frozenset(self._tasks)

    async def close(self) -> None:
        """Cancel every task still running and wait for them (shutdown)."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
