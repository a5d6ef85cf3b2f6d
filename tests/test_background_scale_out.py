"""A background task with two daemons on one PostgreSQL database and one fake Slack app that spreads
events across their connections (docs/background-tasks.md, docs/scale-out.md).

The task is a journal entry like a message, so the journal's lease gives it to exactly one daemon:
while it works, the other daemon never asks the model for it; when the daemon running it is killed
with SIGKILL, the other takes it over once the lease lapses, and the chat gets its result once.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.gateway_rig import daemon_rows, until
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text
from tests.fakes.slack_server import FakeSlack

pytestmark = pytest.mark.slow

LEASE = 3.0
DM = "D0BG"
USER = "U0BG"


def _config(root: Path, n: int, pg_url: str, model: FakeOpenAI, slack: FakeSlack) -> dict[str, Any]:
    cfg = base_config(root / f"data-{n}", model.base_url, free_port())
    cfg["storage"]["url"] = pg_url
    cfg["storage"]["lease_seconds"] = LEASE
    cfg["agent"]["tools"] = False
    cfg["agent"]["memory"] = {"enabled": False}
    cfg["channels"]["slack"] = slack.channel_settings()
    cfg["access"] = {"allow_users": ["*"], "pairing": False}
    return cfg


def _node(d: DaemonProcess) -> str:
    m = re.search(r"this daemon is node (\w+)", d.log_path.read_text(errors="replace"))
    assert m, d.logs()
    return m.group(1)


def _asked(model: FakeOpenAI) -> int:
    return sum("PGJOB" in last_user_text(r) for r in model.requests)


async def test_a_task_runs_on_one_daemon_and_moves_once_when_that_one_is_killed(
    tmp_path: Path, pg_url: str, model: FakeOpenAI
) -> None:
    slack = FakeSlack()
    slack.spread = True
    await slack.start()
    held = asyncio.Event()
    model.add_rule(lambda t: "PGJOB" in t, Reply(text="PG result: 7 shards checked.", hold=held))
    daemons = [
        DaemonProcess(tmp_path / f"d{n}", _config(tmp_path, n, pg_url, model, slack)) for n in range(2)
    ]
    for d in daemons:
        d.workdir.mkdir(parents=True, exist_ok=True)
    try:
        await asyncio.gather(*(d.start(timeout=90) for d in daemons))
        await slack.inject_dm(DM, USER, "/bg PGJOB check every shard")
        await slack.wait_for(lambda: any("Started background task #1" in t for t in slack.texts(DM)) or None)
        await until(lambda: _asked(model) >= 1, 60, "the task's model call")
        await slack.inject_dm(DM, USER, "still there?")  # the chat is free on whichever daemon
        await slack.wait_for(lambda: any("echo: still there?" in t for t in slack.texts(DM)) or None)

        storage = daemons[0].config["storage"]
        sql = "SELECT lease_owner FROM journal WHERE key LIKE ?"
        (owner,) = await until(
            lambda: [r[0] for r in daemon_rows(storage, sql, ("%:bg-1",)) if r[0]], 60, "the task's lease"
        )
        running = next(d for d in daemons if _node(d) == owner)
        other = next(d for d in daemons if d is not running)
        assert _asked(model) == 1, "one daemon runs the task; the other never asked the model for it"

        running.kill9()
        await running.wait_exit()
        held.set()
        await slack.wait_for(
            lambda: any("PG result: 7 shards checked." in t for t in slack.texts(DM)) or None, timeout=60
        )
        await asyncio.sleep(LEASE)  # a second answer from anywhere would show by now
        results = [p for p in slack.posts if p.channel == DM and "PG result" in p.text]
        assert len(results) == 1 and results[0].text.startswith("🧵 Background task #1:")
        assert _asked(model) == 2, "the survivor resumed it once"

        def finished() -> list[tuple[Any, ...]] | None:  # marked done a moment after its answer is sent
            rows = daemon_rows(storage, "SELECT state FROM journal WHERE key LIKE ?", ("%:bg-1",))
            return rows if rows and all(r[0] not in ("pending", "running") for r in rows) else None

        (state,) = await until(finished, 30, "the task's entry finished")
        assert state == ("done",)
        assert other.proc is not None and other.proc.returncode is None
    finally:
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)
        await slack.stop()
