"""What the scale-out tests share: several real ``chital run`` processes on one PostgreSQL
database, which of them leads, waiting for what the chats show, and who holds the journal's leases.

A daemon says in its log which node it is and when it leads or stops leading; the tests read that
rather than asking the daemon, so a daemon frozen or killed mid-test is still told apart.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.daemon import DaemonProcess

LEASE = 3.0
"""The journal lease the clusters run with: short, so a killed daemon's work moves on soon."""


def node_of(d: DaemonProcess) -> str:
    """The node id ``d`` logged at start (its journal leases carry it)."""
    m = re.search(r"this daemon is node (\w+)", d.log_path.read_text(errors="replace"))
    assert m, d.logs()
    return m.group(1)


def is_leader(d: DaemonProcess) -> bool:
    log = d.log_path.read_text(errors="replace")
    return re.search(r"node \w+ is the leader", log) is not None and "no longer the leader" not in log


def alive(d: DaemonProcess) -> bool:
    return d.proc is not None and d.proc.returncode is None


async def find_leader(daemons: list[DaemonProcess], timeout: float = 20.0) -> DaemonProcess:
    """The one living daemon that says it leads (two at once fail the test)."""
    for _ in range(int(timeout * 10)):
        leaders = [d for d in daemons if alive(d) and is_leader(d)]
        if leaders:
            assert len(leaders) == 1, "two leaders at once"
            return leaders[0]
        await asyncio.sleep(0.1)
    raise AssertionError("no leader")


def answer(text: str) -> str | None:
    """The echo in a bot message, past any note above it ("↪️ … replaces it")."""
    return text[text.index("echo:") :] if "echo:" in text else None


async def wait(predicate: Callable[[], Any], timeout: float, what: str, show: Any = None) -> None:
    """Poll ``predicate`` every 0.1 s; fail naming ``what`` (and ``show()``) when it stays false."""
    for _ in range(int(timeout * 10)):
        if predicate():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f": {show()}" if show else ""))


async def start_cluster(
    tmp_path: Path, configs: Iterable[dict[str, Any]], timeout: float = 90
) -> list[DaemonProcess]:
    """A daemon per config (``<tmp_path>/d<n>``), all started; on failure, those started are killed."""
    daemons = []
    for n, cfg in enumerate(configs):
        d = DaemonProcess(tmp_path / f"d{n}", cfg)
        d.workdir.mkdir(parents=True, exist_ok=True)
        daemons.append(d)
    try:
        await asyncio.gather(*(d.start(timeout=timeout) for d in daemons))
    except BaseException:
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)
        raise
    return daemons


def cluster_storage(cfg: dict[str, Any], pg_url: str) -> dict[str, Any]:
    """``cfg`` on the shared database with the short lease, tools off, everyone allowed."""
    cfg["storage"]["url"] = pg_url
    cfg["storage"]["lease_seconds"] = LEASE
    cfg["agent"]["tools"] = False
    cfg["concurrency"]["max_turns"] = 16
    cfg["access"] = {"allow_users": ["*"], "pairing": False}
    return cfg


def in_model_order(requests: list[Any], last_user_text: Callable[[Any], str]) -> dict[str, list[str]]:
    """Per chat, the numbers of the messages ``"<chat> m<n>"`` in the order the model saw them,
    a turn run again after a kill (the same message twice in a row) counted once."""
    seen: dict[str, list[str]] = {}
    for body in requests:
        text = last_user_text(body)
        if " m" in text:
            chat, _, n = text.partition(" m")
            got = seen.setdefault(chat, [])
            if not got or got[-1] != n:
                got.append(n)
    return seen


async def lease_holders(url: str) -> dict[str, int]:
    """Open journal entries per lease owner (``''``: not leased)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT COALESCE(lease_owner, ''), COUNT(*) FROM journal"
            " WHERE state IN ('pending', 'running') GROUP BY 1"
        )
        return {str(o): int(n) for o, n in await cur.fetchall()}
