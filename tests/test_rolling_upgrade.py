"""A rolling upgrade with a schema change, on one PostgreSQL database (docs/scale-out.md, "Upgrading
with no downtime"; gateway/store/schema_compat.py).

Two real ``chital run`` processes of version N answer a fake Telegram bot (polled by the leader)
and a fake Slack app (events spread over every daemon's socket). One is stopped with SIGTERM and a
daemon of version N+1 started in its place: the same code with one more schema step, appended by
the launcher tests/upgraded_daemon.py before its start migrates the database forward. Messages are
sent the whole time; the fakes record every post, and each message must be answered exactly once.

- An **additive** step: the N daemon notices the newer schema on its next lease renewal, says so,
  and goes on answering beside the N+1 one.
- A **breaking** step (``older_writers=False``): the N daemon, the leader, with a turn of its own
  under way, says why it stops, stops taking work, cuts that turn and gives its leases back; the
  N+1 daemon takes the leadership, the Telegram polling and the cut turn, and answers it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.store.schema import SCHEMA_VERSION
from tests.daemon import DaemonProcess, base_config, free_port
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text
from tests.fakes.slack_server import FakeSlack
from tests.fakes.telegram_server import FakeTelegram
from tests.scale_out_support import (
    LEASE,
    answer,
    cluster_storage,
    find_leader,
    lease_holders,
    node_of,
    start_cluster,
    wait,
)

pytestmark = pytest.mark.slow

N = SCHEMA_VERSION
TG_CHATS = (9101, 9102)
SLACK_CHATS = ("D9201", "D9202")
HELD_CHAT = "D9299"


@pytest.fixture
async def spread_slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    fake.spread = True
    await fake.start()
    yield fake
    await fake.stop()


def _config(
    root: Path, n: int, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, slack: FakeSlack
) -> dict[str, Any]:
    cfg = cluster_storage(base_config(root / f"data-{n}", model.base_url, free_port()), pg_url)
    cfg["agent"]["memory"] = {"enabled": False}
    cfg["channels"]["telegram"] = tg.channel_settings(poll_timeout=1)
    cfg["channels"]["slack"] = slack.channel_settings()
    return cfg


async def _upgraded(
    tmp_path: Path, kind: str, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, slack: FakeSlack
) -> DaemonProcess:
    """The daemon of version N+1 (``kind``: additive or breaking), started and ready."""
    d = DaemonProcess(tmp_path / "d-next", _config(tmp_path, 9, pg_url, model, tg, slack))
    d.launcher = ["-m", "tests.upgraded_daemon", kind]
    d.workdir.mkdir(parents=True, exist_ok=True)
    await d.start(timeout=90)
    return d


class Traffic:
    """A message to every chat, round after round, while the upgrade goes on (``<chat> m<n>``)."""

    def __init__(self, tg: FakeTelegram, slack: FakeSlack) -> None:
        self.tg, self.slack = tg, slack
        self.rounds = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            n = self.rounds
            for chat in TG_CHATS:
                self.tg.inject_message(chat, chat, f"t{chat} m{n}")
            for ch in SLACK_CHATS:
                await self.slack.inject_dm(ch, f"U{ch}", f"s{ch} m{n}")
            self.rounds += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.8)

    async def until(self, rounds: int) -> None:
        await wait(lambda: self.rounds >= rounds, 60, f"{rounds} rounds of messages sent")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def _answers(self) -> dict[str, list[str]]:
        got = {f"t{c}": [a for t in self.tg.bot_texts(c) if (a := answer(t))] for c in TG_CHATS}
        got.update({f"s{c}": [a for t in self.slack.texts(c) if (a := answer(t))] for c in SLACK_CHATS})
        return got

    async def answered_once(self) -> None:
        """Every message sent has its answer, and only one (after a lease's time for a double)."""
        expected = {
            chat: sorted(f"echo: {chat} m{n}" for n in range(self.rounds)) for chat in self._answers()
        }

        def short() -> dict[str, int]:
            return {
                c: len(expected[c]) - len(a) for c, a in self._answers().items() if len(a) < len(expected[c])
            }

        await wait(lambda: not short(), 120, "every message answered", short)
        await asyncio.sleep(LEASE)  # a doubled answer would be posted by now
        for chat, got in self._answers().items():
            assert sorted(got) == expected[chat], (chat, got)


def _log(d: DaemonProcess) -> str:
    return d.log_path.read_text(errors="replace")


async def _owners_since(url: str, since: float) -> set[str]:
    """The nodes whose lease is on the entries journaled since ``since`` (who ran them)."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT DISTINCT lease_owner FROM journal WHERE created > %s", (since,))
        return {str(owner) for (owner,) in await cur.fetchall() if owner}


async def test_an_additive_step_keeps_the_older_daemon_answering_beside_the_newer(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, spread_slack: FakeSlack
) -> None:
    configs = [_config(tmp_path, n, pg_url, model, tg, spread_slack) for n in range(2)]
    daemons = await start_cluster(tmp_path, configs)
    old, leaving = daemons
    traffic = Traffic(tg, spread_slack)
    try:
        await find_leader(daemons)
        traffic.start()
        await traffic.until(3)
        assert await leaving.terminate() == 0
        new = await _upgraded(tmp_path, "additive", pg_url, model, tg, spread_slack)
        daemons.append(new)
        assert f"database schema migrated from version {N} to {N + 1}" in _log(new), new.logs()
        await wait(
            lambda: f"database schema version {N + 1} is newer than this daemon's {N}" in _log(old),
            30, "the older daemon noticing the newer schema", old.logs,
        )  # fmt: skip
        noticed = time.time()
        _, body = await old.get("/readyz")
        assert body["ready"], body
        assert body["storage"]["schema"] == {"version": N + 1, "floor": 0, "known": N}
        await traffic.until(traffic.rounds + 3)
        await traffic.stop()
        await traffic.answered_once()
        # The older daemon went on working: it ran messages sent after it noticed, and never refused.
        assert node_of(old) in await _owners_since(pg_url, noticed), "the older daemon stopped working"
        assert "stopping intake" not in _log(old)
        assert tg.poll_conflicts == 0
        assert await old.terminate() == 0 and await new.terminate() == 0
    finally:
        await traffic.stop()
        await asyncio.gather(*(d.close() for d in daemons), return_exceptions=True)


async def test_a_breaking_step_stops_the_older_daemon_writing_and_nothing_is_lost_or_doubled(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, spread_slack: FakeSlack
) -> None:
    # The first request of the held turn waits for the test: it is still running on the older
    # daemon when that one must stop. The retry on the newer daemon is answered at once.
    held = asyncio.Event()
    asked: list[str] = []

    def held_first(body: dict[str, Any]) -> Reply:
        asked.append(last_user_text(body))
        return Reply(text=f"echo: {last_user_text(body)}", hold=held if len(asked) == 1 else None)

    model.add_rule(lambda t: "HELD" in t, held_first)
    configs = [_config(tmp_path, n, pg_url, model, tg, spread_slack) for n in range(2)]
    daemons = await start_cluster(tmp_path, configs)
    traffic = Traffic(tg, spread_slack)
    try:
        old = await find_leader(daemons)  # the leader stays on version N: its polling must move
        leaving = next(d for d in daemons if d is not old)
        traffic.start()
        await traffic.until(2)
        assert await leaving.terminate() == 0
        await spread_slack.inject_dm(HELD_CHAT, "UHELD", "HELD turn")
        await wait(lambda: len(asked) == 1, 30, "the held turn's model call")
        assert (await lease_holders(pg_url)).get(node_of(old), 0) >= 1  # the older daemon runs it

        new = await _upgraded(tmp_path, "breaking", pg_url, model, tg, spread_slack)
        daemons.append(new)
        assert f"database schema migrated from version {N} to {N + 1}" in _log(new), new.logs()
        line = f"database schema version {N + 1} needs Chital ≥ "
        await wait(lambda: line in _log(old), 30, "the older daemon's refusal", old.logs)
        refusal = next(ln for ln in _log(old).splitlines() if line in ln)
        assert f"understands schema {N}: it writes nothing more, stopping intake" in refusal, refusal
        await wait(lambda: "this daemon takes no more work" in _log(old), 30, "its leases given back")
        # It says why wherever the operator looks: /readyz, `chital status`.
        status, body = await old.get("/readyz")
        assert status == 503 and body["why"][0].startswith(f"storage: {line}"), body
        assert body["storage"]["schema"]["floor"] == N + 1
        code, out = await old.cli("status")
        assert line in out, (code, out)
        # Its work went to the newer daemon: leadership and Telegram's polling, the cut turn.
        await find_leader([new], timeout=30)
        await traffic.until(traffic.rounds + 3)
        await traffic.stop()
        await traffic.answered_once()
        assert [t for t in spread_slack.texts(HELD_CHAT) if answer(t)] == ["echo: HELD turn"]
        assert node_of(old) not in await lease_holders(pg_url)
        assert tg.poll_conflicts == 0
        assert await old.terminate() == 0 and await new.terminate() == 0
    finally:
        held.set()
        await traffic.stop()
        await asyncio.gather(*(d.close() for d in daemons), return_exceptions=True)
