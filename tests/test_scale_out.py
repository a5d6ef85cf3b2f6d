"""Several daemons on one PostgreSQL database, one fake Telegram bot and one fake Slack app.

Three real ``chital run`` processes share the database. Telegram's long polling runs on the leader
only (the fake answers a second poller with 409, counted in ``poll_conflicts``); Slack's socket
connections are open on all three and the fake spreads events across them, as Slack does. The
tests count what reaches the chats: every message answered once, in order per chat, also when the
leader or a daemon in the middle of a turn is killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture
async def spread_slack() -> AsyncIterator[FakeSlack]:
    fake = FakeSlack()
    fake.spread = True
    await fake.start()
    yield fake
    await fake.stop()


def _config(
    root: Path, n: int, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, spread_slack: FakeSlack
) -> dict[str, Any]:
    cfg = cluster_storage(base_config(root / f"data-{n}", model.base_url, free_port()), pg_url)
    cfg["channels"]["telegram"] = tg.channel_settings(poll_timeout=1)
    cfg["channels"]["slack"] = spread_slack.channel_settings()
    return cfg


async def _cluster(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, spread_slack: FakeSlack, count: int = 3
) -> list[DaemonProcess]:
    # Readiness needs Slack connected on each; Telegram is "standby" on all but the leader.
    configs = [_config(tmp_path, n, pg_url, model, tg, spread_slack) for n in range(count)]
    return await start_cluster(tmp_path, configs)


def _tg_answers(tg: FakeTelegram, chat: int) -> list[str]:
    return [a for t in tg.bot_texts(chat) if (a := answer(t))]


def _slack_answers(spread_slack: FakeSlack, channel: str) -> list[str]:
    return [a for t in spread_slack.texts(channel) if (a := answer(t))]


async def test_three_daemons_answer_300_messages_once_in_order(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, spread_slack: FakeSlack
) -> None:
    daemons = await _cluster(tmp_path, pg_url, model, tg, spread_slack)
    try:
        await find_leader(daemons)
        tg_chats = [7000 + i for i in range(15)]
        slack_chats = [f"D{i:04d}" for i in range(15)]
        for i in range(10):  # ten rounds; within a chat, each message is sent before any answer
            for chat in tg_chats:
                tg.inject_message(chat, chat, f"t{chat} m{i}")
            for ch in slack_chats:
                await spread_slack.inject_dm(ch, f"U{ch}", f"s{ch} m{i}")

        def all_in() -> bool:
            return all(len(_tg_answers(tg, c)) >= 10 for c in tg_chats) and all(
                len(_slack_answers(spread_slack, c)) >= 10 for c in slack_chats
            )

        def missing() -> str:
            short = {c: 10 - len(_tg_answers(tg, c)) for c in tg_chats if len(_tg_answers(tg, c)) < 10}
            short.update(
                {
                    c: 10 - len(_slack_answers(spread_slack, c))
                    for c in slack_chats
                    if len(_slack_answers(spread_slack, c)) < 10
                }
            )
            texts = {c: tg.bot_texts(c) for c in short if isinstance(c, int)}
            return f"missing per chat {short}; bot texts there: {texts}"

        await wait(all_in, 120, "300 answers", missing)
        await asyncio.sleep(LEASE)  # anything doubled would show up by now
        # Once each: every answer text appears exactly once in its chat (placeholders aside, a
        # "queued" sign is edited into its answer, so positions in the chat are not the order).
        for chat in tg_chats:
            got = sorted(_tg_answers(tg, chat))
            assert got == sorted(f"echo: t{chat} m{i}" for i in range(10)), (chat, got)
        for ch in slack_chats:
            got = sorted(_slack_answers(spread_slack, ch))
            assert got == sorted(f"echo: s{ch} m{i}" for i in range(10)), (ch, got)
        # Every "queued" sign was turned into its answer, none left behind by a daemon that lost
        # the message to another; and no answer says it replaces a cut-off one (nothing was cut).
        posts = [t for c in tg_chats for t in tg.bot_texts(c)] + [
            t for c in slack_chats for t in spread_slack.texts(c)
        ]
        assert not [t for t in posts if t.startswith("⏳")], "a queued sign was left behind"
        assert not [t for t in posts if t.startswith("↪️")], "an answer claims to replace a cut-off one"
        # In order: the model saw each chat's messages one after the other, whichever daemon ran
        # them (a turn starts only once the previous one of its conversation is done).
        seen: dict[str, list[str]] = {}
        for body in model.requests:
            text = last_user_text(body)
            if " m" in text:
                chat, _, n = text.partition(" m")
                seen.setdefault(chat, []).append(n)
        for chat in [f"t{c}" for c in tg_chats] + [f"s{c}" for c in slack_chats]:
            assert seen.get(chat) == [str(i) for i in range(10)], (chat, seen.get(chat))
        assert tg.poll_conflicts == 0, "two daemons polled Telegram at once"
        ran = [len(re.findall(r"picked up", d.log_path.read_text())) for d in daemons]
        assert sum(ran) > 0, "the work stayed on the daemons that received it"
    finally:
        await asyncio.gather(*(d.close() for d in daemons))


async def test_a_leader_stops_cleanly_and_restarts_no_channel_on_its_way_out(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, spread_slack: FakeSlack
) -> None:
    """Stepping down while stopping used to start Telegram again, send-only, after its channel and
    the gateway had closed: a poller left behind a daemon that says it stopped."""
    (d,) = await _cluster(tmp_path, pg_url, model, tg, spread_slack, count=1)
    try:
        await find_leader([d])
        assert await d.terminate() == 0  # fails on a task "still running after shutdown"
        log = d.log_path.read_text(errors="replace")
        after_stop = log[log.index("stopping: draining") :]
        assert "channel telegram: starting" not in after_stop, after_stop
    finally:
        await d.close()


async def test_kill_9_of_the_leader_and_of_a_daemon_mid_turn(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, spread_slack: FakeSlack
) -> None:
    # "LAGGY" answers stream for ~4 s: long enough to kill the daemon writing one.
    model.add_rule(
        lambda t: "LAGGY" in t,
        lambda body: Reply(
            text=f"echo: {last_user_text(body)} " + "and more " * 20, chunks=40, chunk_delay=0.1
        ),
    )
    daemons = await _cluster(tmp_path, pg_url, model, tg, spread_slack)
    try:
        leader = await find_leader(daemons)
        # 1. Kill -9 the leader right after it took a message: another daemon polls within
        # seconds, and that message and the next are each answered once.
        tg.inject_message(8001, 8001, "before the kill")
        await wait(lambda: bool(_tg_answers(tg, 8001)), 30, "first Telegram answer")
        tg.inject_message(8001, 8001, "LAGGY while the leader dies")
        await asyncio.sleep(1.0)  # journaled and streaming on the leader
        leader.kill9()
        await leader.wait_exit()
        survivors = [d for d in daemons if d is not leader]
        await find_leader(survivors, timeout=20)
        tg.inject_message(8001, 8001, "after the kill")
        await wait(
            lambda: any("after the kill" in t for t in _tg_answers(tg, 8001))
            and any("LAGGY while the leader dies" in t and "and more" in t for t in tg.bot_texts(8001)),
            60, "Telegram answers after the leader died", lambda: tg.bot_texts(8001),
        )  # fmt: skip

        # 2. Kill -9 whichever daemon is writing a Slack answer: another one finishes it in the
        # same message once the lease lapses.
        await spread_slack.inject_dm("D9000", "U9000", "LAGGY slack turn")
        holder: DaemonProcess | None = None
        for _ in range(100):
            for d in survivors:
                if "LAGGY slack turn" in d.log_path.read_text(errors="replace"):
                    holder = d
            started = [p for p in spread_slack.texts("D9000")]
            if started:
                break
            await asyncio.sleep(0.05)
        nodes = {node_of(d): d for d in survivors}
        holders = await lease_holders(pg_url)
        owner = next((n for n in holders if n in nodes), None)
        holder = nodes[owner] if owner else holder
        assert holder is not None
        holder.kill9()
        await holder.wait_exit()
        await wait(
            lambda: any("LAGGY slack turn" in t and t.rstrip().endswith("more") for t in spread_slack.texts("D9000")),
            60, "the Slack answer finished by another daemon",
        )  # fmt: skip
        await asyncio.sleep(LEASE)
        slow = [t for t in spread_slack.texts("D9000") if "LAGGY slack turn" in t]
        assert len(slow) == 1, spread_slack.texts("D9000")
        tg_slow = [t for t in tg.bot_texts(8001) if "LAGGY while the leader dies" in t]
        assert len(tg_slow) == 1, tg.bot_texts(8001)
        assert [t for t in _tg_answers(tg, 8001) if "kill" in t and "LAGGY" not in t] == [
            "echo: before the kill",
            "echo: after the kill",
        ]
        assert tg.poll_conflicts == 0
    finally:
        await asyncio.gather(*(d.close() for d in daemons))


async def test_discord_gateway_on_the_leader_only_and_standbys_connected_for_sending(
    tmp_path: Path, pg_url: str, model: FakeOpenAI
) -> None:
    from tests.fakes.discord_server import FakeDiscord

    dc = FakeDiscord(heartbeat_interval=1.0)
    await dc.start()
    daemons: list[DaemonProcess] = []
    try:
        for n in range(2):
            cfg = base_config(tmp_path / f"data-{n}", model.base_url, free_port())
            cfg["storage"]["url"] = pg_url
            cfg["storage"]["lease_seconds"] = LEASE
            cfg["agent"]["tools"] = False
            cfg["channels"]["discord"] = {
                "enabled": True, "token": dc.token, "api_base_url": dc.api_base_url,
                "gateway_url": dc.gateway_url,
            }  # fmt: skip
            cfg["access"] = {"allow_users": ["*"], "pairing": False}
            d = DaemonProcess(tmp_path / f"d{n}", cfg)
            d.workdir.mkdir(parents=True, exist_ok=True)
            daemons.append(d)
        await asyncio.gather(*(d.start(timeout=90) for d in daemons))
        leader = await find_leader(daemons)
        standby = next(d for d in daemons if d is not leader)
        report: dict[str, str] = {}
        for _ in range(100):  # the standby's REST login may finish after /readyz first answers
            _, body = await standby.get("/readyz")
            report = body["channels"]["discord"]
            if "connected for sending" in report["reason"]:
                break
            await asyncio.sleep(0.2)
        assert report["state"] == "standby" and "connected for sending" in report["reason"], report
        assert dc.identifies == 1, "only the leader holds the gateway"
        mid = await dc.inject_dm("424242424242424242", "hello from discord")
        await dc.wait_for(lambda: any(m.reply_to == mid for m in dc.bot_messages()) or None, timeout=30)
        leader.kill9()
        await leader.wait_exit()
        await find_leader([standby], timeout=20)
        await dc.wait_for(lambda: dc.identifies >= 2 or None, timeout=30)
        mid2 = await dc.inject_dm("424242424242424242", "after the failover")
        await dc.wait_for(lambda: any(m.reply_to == mid2 for m in dc.bot_messages()) or None, timeout=30)
        await asyncio.sleep(LEASE)
        texts = [m.content for m in dc.bot_messages()]
        assert texts.count("echo: hello from discord") == 1 and texts.count("echo: after the failover") == 1
    finally:
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)
        await dc.stop()


async def test_a_new_leader_starts_polling_without_cutting_the_telegram_answer_it_is_sending(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, spread_slack: FakeSlack
) -> None:
    """A standby delivering a Telegram answer becomes the leader mid-send: it starts polling on its
    own connection and the answer's send goes on over the sending pool, so it is posted once. (It
    used to stop the whole channel to start it receiving: the send was cut after Telegram had
    taken it, and its retry posted the answer a second time.)"""
    hold_first = asyncio.Event()
    model.add_rule(lambda t: "HOLDA" in t, Reply(text="echo: HOLDA done", hold=hold_first))
    daemons = []
    for n in range(2):
        cfg = _config(tmp_path, n, pg_url, model, tg, spread_slack)
        del cfg["channels"]["slack"]
        # The leader (started first) has one turn at a time: busy, it journals the next message
        # unleased, and the standby's sweep takes it.
        cfg["concurrency"]["max_turns"] = 1 if n == 0 else 4
        daemons.append(DaemonProcess(tmp_path / f"d{n}", cfg))
        daemons[-1].workdir.mkdir(parents=True, exist_ok=True)
    leader, standby = daemons
    try:
        await leader.start(timeout=90)
        assert await find_leader([leader]) is leader
        await standby.start(timeout=90)
        tg.inject_message(8101, 8101, "HOLDA keeps the leader busy")
        await wait(lambda: any("HOLDA" in str(r) for r in model.requests), 30, "the leader's held turn")
        release = tg.hold_answer("sendMessage", lambda p: "STANDBYX" in str(p.get("text", "")))
        tg.inject_message(8102, 8102, "STANDBYX answered by the standby")
        await wait(lambda: tg.holding == 1, 60, "the standby's answer sent, its result held")
        leader.kill9()
        await leader.wait_exit()
        await find_leader([standby], timeout=30)
        await wait(
            lambda: standby.log_path.read_text(errors="replace").count("telegram: connected as") >= 2,
            30, "the new leader connected to poll",
        )  # fmt: skip
        await asyncio.sleep(1.0)  # a cut send fails at once; one that goes on is still waiting
        release.set()
        hold_first.set()
        tg.inject_message(8103, 8103, "after the takeover")
        await wait(lambda: bool(_tg_answers(tg, 8103)), 60, "the new leader polling")
        await wait(lambda: bool(_tg_answers(tg, 8101)), 60, "the held turn finished by the survivor")
        await asyncio.sleep(LEASE)  # a retry of a cut send would have landed by now
        assert _tg_answers(tg, 8102) == ["echo: STANDBYX answered by the standby"], tg.bot_texts(8102)
        assert tg.poll_conflicts == 0
    finally:
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)


async def test_a_new_leader_opens_the_discord_gateway_without_cutting_the_answer_it_is_sending(
    tmp_path: Path, pg_url: str, model: FakeOpenAI
) -> None:
    """The Discord case of the test above: the standby's answer reached Discord, its response is
    held, the leader is killed and the standby opens the gateway on the client it sends with. The
    send comes back over the same HTTP session: one POST (the old code closed the whole client, so
    the send was cut and retried; the fake's nonce check kept the retry from posting twice), and
    at no moment were two gateway sessions open."""
    from tests.fakes.discord_server import FakeDiscord

    hold_first = asyncio.Event()
    model.add_rule(lambda t: "HOLDA" in t, Reply(text="echo: HOLDA done", hold=hold_first))
    dc = FakeDiscord(heartbeat_interval=1.0)
    await dc.start()
    daemons = []
    for n in range(2):
        cfg = cluster_storage(base_config(tmp_path / f"data-{n}", model.base_url, free_port()), pg_url)
        cfg["channels"]["discord"] = dc.channel_settings()
        cfg["concurrency"]["max_turns"] = 1 if n == 0 else 4  # the busy leader leaves the next one
        daemons.append(DaemonProcess(tmp_path / f"d{n}", cfg))
        daemons[-1].workdir.mkdir(parents=True, exist_ok=True)
    leader, standby = daemons

    def dm_answers(user: str) -> list[str]:
        return [a for m in dc.bot_messages(dc.dm_channel(user)) if (a := answer(m.content))]

    try:
        await leader.start(timeout=90)
        assert await find_leader([leader]) is leader
        await standby.start(timeout=90)
        await dc.inject_dm("810000000000000001", "HOLDA keeps the leader busy")
        await wait(lambda: any("HOLDA" in str(r) for r in model.requests), 30, "the leader's held turn")
        release = dc.hold_answer("POST", lambda p: "STANDBYX" in str(p.get("content")))
        await dc.inject_dm("810000000000000002", "STANDBYX answered by the standby")
        await wait(lambda: dc.holding == 1, 60, "the standby's answer sent, its result held")
        leader.kill9()
        await leader.wait_exit()
        await find_leader([standby], timeout=30)
        await dc.wait_for(lambda: dc.identifies == 2 and dc.connected, timeout=30)
        await asyncio.sleep(1.0)  # a cut send fails at once; one that goes on is still waiting
        release.set()
        hold_first.set()
        await dc.inject_dm("810000000000000003", "after the takeover")
        await wait(lambda: bool(dm_answers("810000000000000003")), 60, "the new leader receiving")
        await wait(
            lambda: bool(dm_answers("810000000000000001")), 60, "the held turn finished by the survivor"
        )
        await asyncio.sleep(LEASE)  # a retry of a cut send would have landed by now
        assert dm_answers("810000000000000002") == ["echo: STANDBYX answered by the standby"]
        (sent,) = [m for m in dc.bot_messages() if "STANDBYX" in m.content and m.nonce]
        assert dc.message_posts[str(sent.nonce)] == 1, "the send went on, not cut and retried"
        assert dc.max_open_sessions == 1
    finally:
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)
        await dc.stop()
