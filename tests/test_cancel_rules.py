"""Two ways a cancel gets lost, kept out of the code (Python 3.11, what the daemon runs on).

- ``asyncio.wait_for``: when the cancel of the *caller* races the awaited call finishing, 3.11's
  ``wait_for`` returns the result and the cancel is gone (CPython gh-86296, fixed in 3.12). A
  cluster's leader loop lost the daemon's stop that way while connecting for the leader lock, and
  the daemon never exited on SIGTERM (CI). ``async with asyncio.timeout(...)`` keeps it.
- ``with suppress(CancelledError): await task``: the caller's own cancel is the same exception and
  is swallowed with the task's. ``gateway.ops.tasks.cancel_and_wait`` (or ``asyncio.wait``) instead.

Checked on the syntax tree, so a docstring that names them does not count."""

from __future__ import annotations

import ast

from tests.daemon import REPO

ROOTS = ("gateway", "channels", "agent", "compat")
SWALLOWS = {"CancelledError", "BaseException"}
SUPPRESS_ALLOWED = {
    "agent/subagents.py": "a sub-agent cancelled again until it is done; the first cancel is re-raised by the caller",
}


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def _name(node: ast.AST) -> str:
    return ast.unparse(node)


def _sources() -> list[tuple[str, ast.AST]]:
    return [
        (str(path.relative_to(REPO)), ast.parse(path.read_text(), str(path)))
        for root in ROOTS
        for path in sorted((REPO / root).rglob("*.py"))
    ]


def wait_fors(tree: ast.AST) -> list[int]:
    """Lines that call ``asyncio.wait_for``."""
    calls = [c.lineno for c in _calls(tree) if _name(c.func).split(".")[-1] == "wait_for"]
    imports = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        and (n.module or "").startswith("asyncio")
        and any(a.name == "wait_for" for a in n.names)
    ]
    return sorted(calls + imports)


def suppressed_awaits(tree: ast.AST) -> list[int]:
    """Lines of ``with suppress(… CancelledError or BaseException …):`` blocks that await something."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.With | ast.AsyncWith):
            continue
        suppresses = any(
            isinstance(item.context_expr, ast.Call)
            and _name(item.context_expr.func).endswith("suppress")
            and any(_name(arg).split(".")[-1] in SWALLOWS for arg in item.context_expr.args)
            for item in node.items
        )
        if suppresses and any(_waits(n) for stmt in node.body for n in ast.walk(stmt)):
            lines.append(node.lineno)
    return lines


def _waits(node: ast.AST) -> bool:
    """An await, spelled out or not: ``async for`` and ``async with`` await their iterator's
    ``__anext__`` and the manager's ``__aenter__``/``__aexit__``, as an async comprehension does."""
    if isinstance(node, ast.Await | ast.AsyncFor | ast.AsyncWith):
        return True
    return isinstance(node, ast.comprehension) and bool(node.is_async)


def test_no_asyncio_wait_for_in_the_daemon() -> None:
    found = [f"{path}:{line}" for path, tree in _sources() for line in wait_fors(tree)]
    assert not found, f"asyncio.wait_for loses a racing cancel on 3.11; use asyncio.timeout: {found}"


def test_no_cancel_suppressed_around_an_await_but_where_a_reason_is_written() -> None:
    found = [
        f"{path}:{line}"
        for path, tree in _sources()
        if path not in SUPPRESS_ALLOWED
        for line in suppressed_awaits(tree)
    ]
    assert not found, f"a suppressed CancelledError around an await swallows the caller's cancel too: {found}"


def test_the_checks_see_what_they_forbid() -> None:
    """Not vacuous: both shapes are found in a sample, and their right forms are not."""
    tree = ast.parse(
        "async def f(t):\n"
        "    await asyncio.wait_for(t, 1)\n"
        "    with contextlib.suppress(asyncio.CancelledError):\n"
        "        await t\n"
        "    async with asyncio.timeout(1):\n"
        "        await t\n"
        "    with contextlib.suppress(asyncio.CancelledError):\n"
        "        t.cancel()\n"
        "    with suppress(BaseException):\n"
        "        await t\n"
        "    from asyncio import wait_for as wf\n"
        "    await aio.wait_for(t, 1)\n"
        '    """asyncio.wait_for(t, 1) in a docstring"""\n'
        "    with suppress(asyncio.CancelledError):\n"
        "        async for _ in t:\n"
        "            pass\n"
        "    with suppress(asyncio.CancelledError):\n"
        "        async with t:\n"
        "            pass\n"
        "    with suppress(asyncio.CancelledError):\n"
        "        x = [y async for y in t]\n"
        "    with suppress(asyncio.CancelledError):\n"
        "        for _ in t:\n"
        "            pass\n"
    )
    assert wait_fors(tree) == [2, 11, 12]
    assert suppressed_awaits(tree) == [3, 9, 14, 17, 20]
