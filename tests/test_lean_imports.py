"""What a daemon does not load until it is used (agent/tuning.py ``defer_import``): the memory
store's vector extension, and with it numpy, stays out of a daemon whose memory has no vector
index; the stand-in still gives the real module to whoever uses it."""

from __future__ import annotations

from pathlib import Path

from tests.fresh_python import run_python


def run(code: str) -> str:
    return run_python(code, timeout=120)


def test_memory_keeps_facts_without_loading_numpy(tmp_path: Path) -> None:
    out = run(
        f"""
        import asyncio, sys
        from agent.memory.facts import MemorySettings
        from agent.memory.service import MemoryService

        async def main():
            service = MemoryService(MemorySettings(), model=None, db_path={str(tmp_path / "m.sqlite")!r})
            async with service:
                await service.remember("u1", "likes green tea")
                facts = await service.list("u1")
            print([f.text for f in facts], "numpy" in sys.modules)

        asyncio.run(main())
        """
    )
    assert out == "['likes green tea'] False"


def test_the_stand_in_loads_the_real_module_on_use() -> None:
    out = run(
        """
        import sys
        from agent import tuning
        tuning.defer_import("sqlite_vec")
        import sqlite_vec
        before = "numpy" in sys.modules
        print(before, callable(sqlite_vec.serialize_float32), "numpy" in sys.modules)
        """
    )
    assert out == "False True True"
