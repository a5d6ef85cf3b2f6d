"""The per-user cap's count of background tasks (gateway/store/background.py), at the store."""

from __future__ import annotations

import time
from pathlib import Path

from gateway.store.background import UNJOURNALED_GRACE
from gateway.store.journal import Store


async def test_a_task_row_never_journaled_stops_counting_against_the_cap(tmp_path: Path) -> None:
    """kill -9 between the task's row and its journal entry, and an asking turn that never runs
    again: the row must not hold its owner's cap forever, while a fresh one (journaled in a
    moment) still counts, so two quick /bg cannot both slip under the cap."""
    store = await Store.open(tmp_path / "g.sqlite", 0)
    try:
        await store.background_add(origin="telegram:1:10", conversation="telegram:1", owner="u", text="a")
        assert await store.background_running("u") == 1, "young and not journaled yet: counts"
        await store.background_add(origin="telegram:1:11", conversation="telegram:1", owner="u", text="b")
        assert await store.background_running("u") == 2
        old = time.time() - UNJOURNALED_GRACE - 1
        await store._write("UPDATE background_tasks SET created = ? WHERE origin = ?", (old, "telegram:1:10"))
        assert await store.background_running("u") == 1, "the orphan no longer counts"
        assert await store.background_running("someone else") == 0
    finally:
        await store.close()
