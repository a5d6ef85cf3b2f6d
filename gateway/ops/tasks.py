"""The daemon's background tasks, tracked in one place.

``asyncio.create_task`` keeps only a weak reference to its task, and an exception nobody retrieves
is reported (if at all) as "Task exception was never retrieved" when the task is collected, without
saying which of the daemon's jobs it was. Before this module the Gateway, approvals' timers and
others each kept their own set, and the Gateway's dropped a failed task's exception: a ``resume()``
that failed when a channel reconnected was lost silently. Here every task is held until it ends,
its exception is retrieved and logged once with the task's name, and ``close()`` cancels and awaits
whatever is still running, in one place at shutdown.

The daemon has one root tracker (``Daemon.tasks``, gateway/daemon/app.py). Each part that stops at
its own moment of the shutdown (the background loops, the Gateway, the cluster, each channel's
supervisor) spawns through a :meth:`TaskTracker.child` of it: the child cancels only its own tasks
when its owner stops, and every task is still held by the root, whose ``close()`` at the very end
finds any that outlived their owner. Tasks that a coroutine starts and awaits itself (a reply's
loader and flusher, the usage writer that ``close()`` waits for) are not background tasks: their
owner retrieves their result.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Coroutine, Iterable
from typing import Any

log = logging.getLogger(__name__)

AGAIN_AFTER = 5.0
"""Seconds a background task may take to end after its cancel before it is cancelled again."""


class TaskTracker:
    """Spawns named background tasks, keeps them alive, logs each failure once."""

    def __init__(self, parent: TaskTracker | None = None) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._parent = parent

    def child(self) -> TaskTracker:
        """A tracker for one part of the daemon: its tasks are this tracker's too, and its
        ``close()`` cancels only its own."""
        return TaskTracker(self)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a task named ``name`` (what its failure is logged with). On a closed
        tracker (its owner has stopped) the task is cancelled before it runs: a channel that
        reconnects during shutdown must not start a resume behind a gateway that has closed."""
        task = asyncio.create_task(coro, name=name)
        if self._closed:
            task.cancel()
            log.debug("task %s not started: its owner has stopped", name)
            return task
        self._tasks.add(task)
        task.add_done_callback(self._done)
        if self._parent is not None:
            self._parent.adopt(task)
        return task

    def adopt(self, task: asyncio.Task[Any]) -> None:
        """Hold ``task``, spawned and logged by a child, until it ends (and up the chain)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._parent is not None:
            self._parent.adopt(task)

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

    def __bool__(self) -> bool:
        """A tracker is a tracker even with no task running (``len()`` counts its tasks)."""
        return True

    async def close(self) -> None:
        """Cancel every task still running and wait for them; later spawns are cancelled (shutdown)."""
        self._closed = True
        await self.cancel_running()

    async def cancel_running(self) -> None:
        """Cancel the tasks running now and wait for them; the tracker stays open (a part that
        stops to start again, such as a supervisor whose channel goes send-only)."""
        await cancel_and_wait(self._tasks, again_after=AGAIN_AFTER)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], *, again_after: float | None = None) -> None:
    """Cancel ``tasks`` and wait until each has ended. How each ended (cancelled, failed) is not
    raised here; a cancellation of the *caller* is.

    Why not ``with suppress(CancelledError): await task``: the caller's own cancel arrives as the
    same exception and is swallowed with the task's. A cluster's leader loop, cancelled by the
    daemon's stop while its hook was stopping a channel that way, lived on in its sleep, and the
    stop waited for it for ever (seen in CI as a daemon that never exited on SIGTERM).

    ``again_after``: a task still running that long after its cancel is cancelled again (and
    named in the log). Libraries swallow a cancel too (a shielded clean-up that ends normally
    eats the one that arrived meanwhile), and a background loop that lost its cancel would
    otherwise hold the stop for ever. Not for turns: their clean-up (killing a started command)
    must not itself be cut."""
    if again_after is not None and again_after <= 0:
        raise ValueError("again_after must be positive")
    everything = list(tasks)
    pending = {task for task in everything if not task.done()}
    for task in pending:
        task.cancel()
    try:
        while pending:
            _, pending = await asyncio.wait(pending, timeout=again_after)
            for task in pending:
                log.warning(
                    "%s did not end %gs after its cancel: cancelling it again",
                    where_waiting(task),
                    again_after,
                )
                task.cancel()
    finally:  # also when the caller is cancelled: what has ended is retrieved, never "never retrieved"
        for task in everything:
            if task.done() and not task.cancelled():
                task.exception()


def where_waiting(task: asyncio.Future[Any]) -> str:
    """``name: outer > … > inner (dir/file:line)`` of the coroutines ``task`` is suspended in: what
    a stop that hangs is waiting for, in one line (no locals, so no secret)."""
    if not isinstance(task, asyncio.Task):
        return "a future"
    coro: Any = task.get_coro()
    chain: list[str] = []
    where = ""
    for _ in range(50):  # an object that always answers ``cr_await`` must not loop for ever
        if coro is None:
            break
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            chain.append(frame.f_code.co_qualname.rsplit("<locals>.", 1)[-1])
            where = "/".join(frame.f_code.co_filename.rsplit("/", 2)[-2:]) + f":{frame.f_lineno}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None) or _generator_of(coro)
    if not chain:
        return f"{task.get_name()}: (not started or finished)"
    return f"{task.get_name()}: {' > '.join(chain[-6:])} ({where})"


_ANEXT_TYPES = ("async_generator_asend", "async_generator_athrow")


def _generator_of(awaitable: Any) -> Any:
    """The async generator an ``async for`` waits in: its ``__anext__`` awaitable
    (``async_generator_asend``) names it only to the garbage collector, so without this the chain
    stopped at the loop (a stop waiting in a stream's ``async for`` said only where the loop was)."""
    if type(awaitable).__name__ not in _ANEXT_TYPES:
        return None
    return next((r for r in gc.get_referents(awaitable) if hasattr(r, "ag_frame")), None)


async def report_slow_stop(after: float, every: float = 10.0, most: int = 30) -> None:
    """Cancelled when the stop ends. Until then, ``after`` s into it and every ``every`` s after,
    log which tasks are still waiting and where (at most ``most`` of them): a stop that hangs
    names its culprit in the log instead of waiting silently for the supervisor's SIGKILL."""
    await asyncio.sleep(after)
    me = asyncio.current_task()
    while True:
        waiting = sorted(where_waiting(t) for t in asyncio.all_tasks() if t is not me)
        more = f"; and {len(waiting) - most} more" if len(waiting) > most else ""
        log.warning(
            "the stop is still waiting after %.0fs for: %s%s",
            after,
            "; ".join(waiting[:most]) or "nothing",
            more,
        )
        await asyncio.sleep(every)
        after += every


@contextlib.asynccontextmanager
async def slow_stop_reported(after: float) -> AsyncIterator[None]:
    """:func:`report_slow_stop` from ``after`` s into the block until it ends."""
    reporter = asyncio.create_task(report_slow_stop(after), name="slow-stop")
    try:
        yield
    finally:
        reporter.cancel()
