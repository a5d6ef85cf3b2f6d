"""The one polling loop of the tests and the fakes: wait on state, never on time.

A check is called until it returns something truthy (a coroutine's result is awaited), which is
returned; past the deadline the wait fails with what it waited for and, where the caller says how,
what the fake saw meanwhile (the last messages the bot sent), so a loaded CI machine only makes a
test slower, and a failure says why.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


async def poll(
    check: Callable[[], Any],
    timeout: float,
    what: str = "",
    seen: Callable[[], object] | None = None,
    every: float = 0.01,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            shown = f"; bot sent {seen()}" if seen is not None else ""
            raise AssertionError(f"timed out waiting for {what or check}{shown}")
        await asyncio.sleep(every)
