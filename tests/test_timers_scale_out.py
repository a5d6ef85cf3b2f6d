"""One owner for the timers with two daemons on one PostgreSQL database (gateway/daemon/timers.py,
docs/scale-out.md "Who owns what").

Two real ``chital run`` processes, one fake Slack app spreading events over both sockets, the fake
model. Which daemon owns the timers, and how many approval timers each holds, is read from each
daemon's own ``/metrics`` (``chital_timers_owned``, ``chital_timers_armed``) and ``chital status``;
what expired or fired is read from the chat and from the approvals counter of each daemon.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.gateway_rig import until
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.slack_server import FakeSlack, Post

pytestmark = pytest.mark.slow

DM = "D0TIMERS"
USER = "U0TIMERS"
TIMED_OUT = "⌛ Timed out: not run"


def _config(
    root: Path, n: int, pg_url: str, model: FakeOpenAI, slack: FakeSlack, timeout: float
) -> dict[str, Any]:
    cfg = base_config(root / f"data-{n}", model.base_url, free_port())
    cfg["storage"]["url"] = pg_url
    cfg["storage"]["lease_seconds"] = 3.0
    cfg["agent"]["memory"] = {"enabled": False}
    cfg["agent"]["approvals"] = {"tools": ["write_file"], "timeout": timeout}
    cfg["channels"]["slack"] = slack.channel_settings()
    cfg["access"] = {"allow_users": ["*"], "pairing": False}
    return cfg


def brain(body: dict[str, Any]) -> Reply:
    """Asks to write a file when told ``write``; schedules when told ``remind NAME in DELAY``;
    answers a firing with ``reminder NAME``; reports what a tool answered."""
    last = body["messages"][-1]
    if last.get("role") == "tool":
        return Reply(text=f"Done: {last.get('content')}")
    text = last_user_text(body)
    fired = re.search(r"\[Scheduled task #\d+.*\n(.*)", text)
    if fired:
        return Reply(text=f"⏰ reminder {fired.group(1).split()[-1]}")
    asked = re.search(r"remind (\w+) in (.+)", text)
    if asked:
        args = {"text": f"Remind about {asked.group(1)}", "delay": asked.group(2)}
        return Reply(tool_calls=[ToolCall("schedule_task", args)])
    if "write" in text:
        return Reply(
            tool_calls=[ToolCall("write_file", {"file_path": "/mnt/user-data/outputs/x.txt", "content": "x"})]
        )
    return Reply(text=f"echo: {text}")


def _sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def _metric(d: DaemonProcess, name: str, **labels: str) -> float:
    return _sample(await d.metrics(), name, **labels)


async def _owner(daemons: list[DaemonProcess]) -> DaemonProcess:
    """The one live daemon that says it owns the timers (waits for one to)."""

    async def owners() -> list[DaemonProcess] | None:
        live = [d for d in daemons if d.proc is not None and d.proc.returncode is None]
        found = [d for d in live if await _metric(d, "chital_timers_owned") == 1.0]
        return found or None

    found = await until(owners, 60, "a daemon owning the timers")
    assert len(found) == 1, "never two owners at once"
    return found[0]


async def _status(d: DaemonProcess) -> dict[str, Any]:
    code, out = await d.cli("status", "--json")
    assert code == 0, out
    return dict(json.loads(out))


def _request(slack: FakeSlack) -> Post | None:
    return next((p for p in slack.posts if p.channel == DM and "Approval needed" in p.text), None)


async def _two_daemons(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, slack: FakeSlack, timeout: float
) -> list[DaemonProcess]:
    daemons = [
        DaemonProcess(tmp_path / f"d{n}", _config(tmp_path, n, pg_url, model, slack, timeout))
        for n in range(2)
    ]
    for d in daemons:
        d.workdir.mkdir(parents=True, exist_ok=True)
    await asyncio.gather(*(d.start(timeout=90) for d in daemons))
    return daemons


@pytest.fixture
async def spread_slack() -> Any:
    slack = FakeSlack()
    slack.spread = True
    await slack.start()
    yield slack
    await slack.stop()


async def test_an_approval_times_out_once_on_the_daemon_that_owns_the_timers(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, spread_slack: FakeSlack
) -> None:
    slack = spread_slack
    model.add_rule(lambda _t: True, brain)
    daemons = await _two_daemons(tmp_path, pg_url, model, slack, timeout=8)
    try:
        owner = await _owner(daemons)
        other = next(d for d in daemons if d is not owner)
        assert (await _status(owner))["timers"]["owner"] == "here"
        assert (await _status(other))["timers"]["owner"] == "the leader"
        assert "timers: owned by the leader" in (await other.cli("status"))[1]
        # Retention prunes on the owner only (its first pass when it took the timers over).
        _, ready = await owner.get("/readyz")
        assert "last_prune_rows" in ready["storage"], ready
        _, ready = await other.get("/readyz")
        assert "last_prune_rows" not in ready["storage"], "the other daemon never pruned"

        await slack.inject_dm(DM, USER, "please write the file")
        request = await slack.wait_for(lambda: _request(slack), timeout=60)
        # Asked on whichever daemon took the message; armed on the owner alone.
        await until(lambda: _armed(owner, 1), 30, "the owner arming the request's timer")
        assert await _metric(other, "chital_timers_armed", kind="approval") == 0
        assert (await _status(other))["timers"]["approvals_armed"] == 0

        await slack.wait_for(lambda: TIMED_OUT in request.text or None, timeout=60)
        await slack.wait_for(lambda: any("Done:" in t for t in slack.texts(DM)) or None, timeout=60)
        await asyncio.sleep(6)  # a second expiry (the other daemon's) would show by now
        assert await _metric(owner, "chital_approvals_total", outcome="timeout") == 1
        assert await _metric(other, "chital_approvals_total", outcome="timeout") == 0
        assert request.buttons() == [] and request.history.count(request.text) == 1, request.history
        assert len([t for t in slack.texts(DM) if "Done:" in t]) == 1, slack.texts(DM)
        assert await _metric(owner, "chital_timers_armed", kind="approval") == 0
    finally:
        await asyncio.gather(*(d.close() for d in daemons), return_exceptions=True)


async def _armed(d: DaemonProcess, n: int) -> bool:
    return await _metric(d, "chital_timers_armed", kind="approval") == n


async def test_the_survivor_of_the_owner_arms_and_expires_its_approval_once(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, spread_slack: FakeSlack
) -> None:
    slack = spread_slack
    model.add_rule(lambda _t: True, brain)
    daemons = await _two_daemons(tmp_path, pg_url, model, slack, timeout=25)
    try:
        owner = await _owner(daemons)
        survivor = next(d for d in daemons if d is not owner)
        await slack.inject_dm(DM, USER, "please write the file")
        request = await slack.wait_for(lambda: _request(slack), timeout=60)
        await until(lambda: _armed(owner, 1), 30, "the owner arming the request's timer")
        assert await _armed(survivor, 0)
        owner.kill9()  # before the deadline
        await owner.wait_exit()
        assert TIMED_OUT not in request.text, "expired before the kill: the machine is too slow for this test"

        assert await _owner(daemons) is survivor
        assert (await _status(survivor))["timers"]["owner"] == "here"
        _, ready = await survivor.get("/readyz")
        assert "last_prune_rows" in ready["storage"], "the new owner runs retention"
        await slack.wait_for(lambda: TIMED_OUT in request.text or None, timeout=90)
        await slack.wait_for(lambda: any("Done:" in t for t in slack.texts(DM)) or None, timeout=60)
        await asyncio.sleep(3)
        assert await _metric(survivor, "chital_approvals_total", outcome="timeout") == 1
        assert len([t for t in slack.texts(DM) if "Done:" in t]) == 1, slack.texts(DM)
    finally:
        await asyncio.gather(*(d.close() for d in daemons), return_exceptions=True)


def _reminders(slack: FakeSlack, name: str) -> list[str]:
    return [t for t in slack.texts(DM) if f"⏰ reminder {name}" in t]


async def test_a_schedule_fires_once_and_the_next_one_on_the_survivor_of_the_owner(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, spread_slack: FakeSlack
) -> None:
    slack = spread_slack
    model.add_rule(lambda _t: True, brain)
    daemons = await _two_daemons(tmp_path, pg_url, model, slack, timeout=600)
    try:
        await _owner(daemons)
        await slack.inject_dm(DM, USER, "remind ALPHA in 5 seconds")
        await slack.wait_for(lambda: any("Scheduled #1" in t for t in slack.texts(DM)) or None, timeout=60)
        await slack.wait_for(lambda: _reminders(slack, "ALPHA") or None, timeout=60)

        owner = await _owner(daemons)
        survivor = next(d for d in daemons if d is not owner)
        await slack.inject_dm(DM, USER, "remind BETA in 30 seconds")
        await slack.wait_for(lambda: any("Scheduled #2" in t for t in slack.texts(DM)) or None, timeout=60)
        owner.kill9()
        await owner.wait_exit()
        assert not _reminders(slack, "BETA"), "fired before the kill: the machine is too slow for this test"

        assert await _owner(daemons) is survivor
        await slack.wait_for(lambda: _reminders(slack, "BETA") or None, timeout=120)
        await asyncio.sleep(3)
        assert len(_reminders(slack, "ALPHA")) == 1 and len(_reminders(slack, "BETA")) == 1, slack.texts(DM)
    finally:
        await asyncio.gather(*(d.close() for d in daemons), return_exceptions=True)
