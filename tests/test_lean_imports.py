"""What a daemon does not load until it is used (compat/lean_imports.py, installed by the entry
point): the memory store's vector extension, and with it numpy, stays out of a daemon whose memory
has no vector index; the deferred module still gives the real one to whoever uses it. And the hook
is installed only by the entry point, never as a side effect of importing a module."""

from __future__ import annotations

from pathlib import Path

from tests.fresh_python import run_python


def run(code: str) -> str:
    return run_python(code, timeout=120)


def test_memory_keeps_facts_without_loading_numpy(tmp_path: Path) -> None:
    out = run(
        f"""
        import asyncio, sys
        from compat import lean_imports
        lean_imports.install()  # as gateway.cli.main does first
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
        from compat import lean_imports
        lean_imports.install()
        import importlib.util
        import sqlite_vec
        before = "numpy" in sys.modules
        used = callable(sqlite_vec.serialize_float32)
        # The real body ran: it imports numpy where numpy is installed (not a dependency of ours).
        ran = ("numpy" in sys.modules) == (importlib.util.find_spec("numpy") is not None)
        print(before, used, ran, sqlite_vec.__version__ == sqlite_vec.__version_info__[0] + "." + ".".join(sqlite_vec.__version_info__[1:]))
        """
    )
    assert out == "False True True True"


def test_importing_modules_never_installs_the_hook() -> None:
    out = run(
        """
        import sys
        import gateway.daemon.app, gateway.cli, agent.runtime, compat.lean_imports
        print(compat.lean_imports.installed())
        """
    )
    assert out == "False"


def test_the_entry_point_installs_it_first() -> None:
    out = run(
        """
        import sys
        from gateway.cli.main import main
        try:
            main(["pairing", "--help"])
        except SystemExit:
            pass
        from compat import lean_imports
        print(lean_imports.installed(), "openai.types" in sys.modules)
        """
    )
    assert out.splitlines()[-1] == "True False"


def test_the_cli_module_imports_no_library_the_hook_defers() -> None:
    """``python -m gateway.cli`` runs the module's imports before ``main`` installs the hook: they
    must not reach a deferred library (a store module importing langchain-core's messages once
    brought requests and charset_normalizer in for every command)."""
    out = run(
        """
        import sys
        import gateway.cli.main
        from compat.lean_imports import DEFERRED
        early = [m for m in (*DEFERRED, "requests", "langchain_core", "openai", "httpx") if m in sys.modules]
        print(early)
        """
    )
    assert out == "[]"
