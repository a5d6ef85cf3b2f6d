"""Several daemons on one PostgreSQL database behind the newer channels: WhatsApp (webhooks spread
by a load balancer), DingTalk (Stream mode, one websocket per daemon, each message handed to one
of them), WeCom (one long connection per robot: the leader's) and Matrix (one sync: the leader's).

Real ``chital run`` processes and the wire-level fakes. What is asserted is what users see: every
message answered exactly once, each chat's messages reaching the model in the order they were sent,
and nothing posted twice when a daemon is killed with SIGKILL in the middle of a burst, whether it
had acknowledged its deliveries (the journal has them; another daemon runs them once its lease
lapses) or not (the platform gives them to another daemon).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.console_client import TOKEN, Console
from tests.daemon import chat_config, free_port
from tests.fakes.dingtalk_server import FakeDingTalk
from tests.fakes.matrix_server import SERVER, FakeMatrix
from tests.fakes.openai_server import FakeOpenAI, Reply, last_user_text
from tests.fakes.wecom_server import FakeWeCom
from tests.fakes.whatsapp_server import FakeWhatsApp
from tests.scale_out_support import (
    LEASE,
    alive,
    cluster_storage,
    find_leader,
    in_model_order,
    lease_holders,
    node_of,
    start_cluster,
    wait,
)
from tests.webchat_client import WebChat

pytestmark = pytest.mark.slow


def _slow_echo(model: FakeOpenAI) -> None:
    """Each answer streams for about half a second: a kill lands in the middle of turns."""
    model.add_rule(
        lambda t: " m" in t,
        lambda body: Reply(text=f"echo: {last_user_text(body)} done", chunks=5, chunk_delay=0.1),
    )


def _whatsapp_cluster_configs(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, wa: FakeWhatsApp, count: int
) -> list[dict[str, Any]]:
    """A config per daemon, each serving the webhook on its own hooks listener; the fake's load
    balancer spreads deliveries over all of them."""
    configs, urls = [], []
    for n in range(count):
        port = free_port()
        urls.append(f"http://127.0.0.1:{port}/channels/whatsapp/webhook")
        cfg = chat_config(tmp_path / f"n{n}", model.base_url, wa, hooks={"host": "127.0.0.1", "port": port})
        configs.append(cluster_storage(cfg, pg_url))
    wa.webhook_urls = urls
    return configs


async def test_whatsapp_burst_spread_over_three_daemons_one_killed_mid_burst(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, whatsapp: FakeWhatsApp
) -> None:
    _slow_echo(model)
    daemons = await start_cluster(tmp_path, _whatsapp_cluster_configs(tmp_path, pg_url, model, whatsapp, 3))
    victim = daemons[1]
    victim_url = whatsapp.webhook_urls[1]
    users = [f"1555020{i:04d}" for i in range(6)]
    rounds = 8
    sent: dict[str, list[dict[str, Any]]] = {u: [] for u in users}
    killed = asyncio.Event()

    async def user_writes(user: str) -> None:
        # One message after the other, as a person types: the next is delivered once Meta has
        # the previous one's 200 (from whichever daemon took it).
        for i in range(rounds):
            if i == rounds // 2:
                await killed.wait()  # the second half goes to a cluster with a dead member
            msg = whatsapp.message(user, "text", text={"body": f"{user} m{i}"})
            assert await whatsapp.deliver(whatsapp.payload(msg)) == 200
            sent[user].append(msg)

    try:
        writers = asyncio.gather(*(user_writes(u) for u in users))
        # Kill -9 mid-burst, once the victim acknowledged deliveries, while it runs turns if it
        # can be caught at it (the second half of the burst waits for the kill).
        victim_node = node_of(victim)
        await wait(lambda: (victim_url, 200) in whatsapp.attempts, 60, "a delivery the victim took")
        for _ in range(200):
            if (await lease_holders(pg_url)).get(victim_node):
                break
            await asyncio.sleep(0.05)
        victim.kill9()
        await victim.wait_exit()
        killed.set()
        await asyncio.wait_for(writers, 120)
        assert any(url == victim_url and status == 200 for url, status in whatsapp.attempts), (
            "the killed daemon had acknowledged deliveries"
        )
        attempts_after = whatsapp.attempts[[a[0] for a in whatsapp.attempts].index(victim_url) :]
        assert (victim_url, 0) in attempts_after, "a delivery met the dead daemon and went to another"

        def missing() -> list[str]:
            return [m["text"]["body"] for ms in sent.values() for m in ms if not whatsapp.replies_to(m["id"])]

        await wait(lambda: not missing(), 120, "every message answered", missing)
        await asyncio.sleep(LEASE + 1)  # a doubled answer (a rerun, a retried send) shows by now
        for user, msgs in sent.items():
            for m in msgs:
                replies = [r.text for r in whatsapp.replies_to(m["id"])]
                assert replies == [f"echo: {m['text']['body']} done"], (user, m["text"]["body"], replies)
        assert all(r.to in users for r in whatsapp.sent)
        seen = in_model_order(model.requests, last_user_text)
        for user in users:
            assert seen.get(user) == [str(i) for i in range(rounds)], (user, seen.get(user))
        assert any(alive(d) for d in daemons)
    finally:
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)


def _dingtalk_answers(fake: FakeDingTalk, user: str) -> list[str]:
    return [m.text for m in fake.messages_to(user) if m.text.startswith("echo:")]


async def test_dingtalk_burst_over_two_stream_connections_and_a_daemon_killed_before_it_acks(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, dingtalk: FakeDingTalk
) -> None:
    _slow_echo(model)
    configs = [
        cluster_storage(chat_config(tmp_path / f"n{n}", model.base_url, dingtalk), pg_url) for n in range(2)
    ]
    daemons = await start_cluster(tmp_path, configs)
    try:
        await wait(lambda: len(dingtalk.open_connections()) == 2, 30, "a stream connection per daemon")
        users = [f"staff{i:02d}" for i in range(5)]
        rounds = 6

        async def user_writes(user: str) -> None:
            # The next message once DingTalk saw the previous one acknowledged (by either daemon).
            for i in range(rounds):
                data = dingtalk.message("", user, f"{user} m{i}")
                mid = await dingtalk.inject(data)
                await wait(functools.partial(dingtalk.acked, mid), 60, f"the ack of {user} m{i}")

        await asyncio.gather(*(user_writes(u) for u in users))
        first, second = dingtalk.open_connections()
        took = {serial for _, serial in dingtalk.deliveries}
        assert took == {first, second}, "DingTalk gave messages to both daemons"

        # Freeze one daemon (its socket stays open: DingTalk keeps giving it messages it never
        # acknowledges), give each of five more users one message, then kill -9 it.
        victim = daemons[1]
        assert victim.proc is not None
        os.kill(victim.proc.pid, signal.SIGSTOP)
        late = [f"late{i:02d}" for i in range(5)]
        mids = [await dingtalk.inject(dingtalk.message("", u, f"{u} m0")) for u in late]
        victim.kill9()
        await victim.wait_exit()
        await wait(lambda: len(dingtalk.open_connections()) == 1, 30, "the dead daemon's socket closed")
        (kept,) = dingtalk.open_connections()
        dead = ({first, second} - {kept}).pop()
        moved = [m for m in mids if next(s for mm, s in dingtalk.deliveries if mm == m) == dead]
        assert moved, "a message had gone to the killed daemon unacknowledged"

        everyone = users + late
        want = {u: rounds for u in users} | {u: 1 for u in late}

        def short() -> dict[str, list[str]]:
            return {
                u: _dingtalk_answers(dingtalk, u)
                for u in everyone
                if len(_dingtalk_answers(dingtalk, u)) < want[u]
            }

        await wait(lambda: not short(), 120, "every message answered", short)
        await wait(lambda: not dingtalk.pending, 30, "every message acknowledged", lambda: dingtalk.pending)
        await asyncio.sleep(LEASE + 1)
        for m in moved:  # handed again to the daemon still connected
            assert [s for mm, s in dingtalk.deliveries if mm == m] == [dead, kept], dingtalk.deliveries
        handed = collections.Counter(m for m, _ in dingtalk.deliveries)
        assert all(n == 1 for m, n in handed.items() if m not in moved), "a message went to one daemon"
        for u in everyone:
            got = sorted(_dingtalk_answers(dingtalk, u))
            assert got == sorted(f"echo: {u} m{i} done" for i in range(want[u])), (u, got)
        seen = in_model_order(model.requests, last_user_text)
        for u in users:
            assert seen.get(u) == [str(i) for i in range(rounds)], (u, seen.get(u))
    finally:
        for d in daemons:
            if d.proc and d.proc.returncode is None:
                os.kill(d.proc.pid, signal.SIGCONT)
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)


async def test_wecom_connection_on_the_leader_only_and_taken_over_after_its_kill_9(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, wecom: FakeWeCom
) -> None:
    """WeCom keeps one long connection per robot (a second subscription takes it over), so only
    the leader subscribes; its successor subscribes after a kill -9 and answers, once each, the
    turn cut mid-stream and what users wrote while no daemon held the connection."""
    model.add_rule(
        lambda t: "LAGGY" in t,
        lambda body: Reply(
            text=f"echo: {last_user_text(body)} " + "and more " * 20, chunks=40, chunk_delay=0.1
        ),
    )
    configs = [
        cluster_storage(chat_config(tmp_path / f"n{n}", model.base_url, wecom), pg_url) for n in range(2)
    ]
    daemons = await start_cluster(tmp_path, configs)
    try:
        leader = await find_leader(daemons)
        standby = next(d for d in daemons if d is not leader)
        await wecom.wait_connected()
        await standby.wait_channel_state("wecom", "standby")
        before = wecom.inject_text("alice", "before the kill")
        await wecom.wait_for(lambda: _wecom_finished(wecom, before), 30, "the first answer")
        assert wecom.subscribes == 1, "only the leader subscribed"

        cut = wecom.inject_text("alice", "LAGGY cut mid-stream")
        await wecom.wait_for(lambda: wecom.replies_to(cut), 30, "the answer streaming")
        leader.kill9()
        await leader.wait_exit()
        meanwhile = [wecom.inject_text("bob", f"bob m{i}") for i in range(3)]  # no connection: held
        await find_leader([standby], timeout=30)
        await wecom.wait_connected(timeout=30)
        everything = [before, cut, *meanwhile]
        await wait(
            lambda: all(_wecom_finished(wecom, f) for f in everything), 90, "every message answered",
            lambda: [(m.chat, m.text[:40], m.finished) for m in wecom.messages],
        )  # fmt: skip
        await asyncio.sleep(LEASE + 1)
        for frame in everything:
            text = frame["body"]["text"]["content"]
            finals = [m.text for m in wecom.messages if text in m.text and m.finished]
            assert len(finals) == 1, (text, [(m.text[:60], m.finished) for m in wecom.messages])
        assert in_model_order(model.requests, last_user_text).get("bob") == ["0", "1", "2"]
        assert wecom.subscribes == 2, "one subscription per leader, none from a standby"
    finally:
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)


def _wecom_finished(fake: FakeWeCom, frame: dict[str, Any]) -> bool:
    """A finished bot message in the frame's chat carries the answer to it."""
    text = frame["body"]["text"]["content"]
    return any(text in m.text and m.finished for m in fake.bot_messages(frame["body"]["from"]["userid"]))


async def test_matrix_sync_on_the_leader_only_and_the_handover_backlog_answered_once(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, matrix_hs: FakeMatrix
) -> None:
    """Every syncing client gets every event, so only the leader syncs. Its successor never held a
    sync token (that lives in the leader's data directory); what users wrote while no daemon
    synced must still be answered, once, and nothing the old leader answered again."""
    owner, room = f"@owner:{SERVER}", f"!dm:{SERVER}"
    matrix_hs.room(room, owner)
    old = matrix_hs.inject_text(room, owner, "written before any daemon ran")  # history
    configs = [
        cluster_storage(chat_config(tmp_path / f"n{n}", model.base_url, matrix_hs), pg_url) for n in range(2)
    ]
    daemons = await start_cluster(tmp_path, configs)
    try:
        leader = await find_leader(daemons)
        standby = next(d for d in daemons if d is not leader)
        await standby.wait_channel_state("matrix", "standby")
        before = matrix_hs.inject_text(room, owner, "owner m0")
        await wait(lambda: matrix_hs.replies_to(room, before["event_id"]), 30, "the first answer")
        assert matrix_hs.most_syncing == 1, "only the leader syncs"

        leader.kill9()
        await leader.wait_exit()
        meanwhile = [matrix_hs.inject_text(room, owner, f"owner m{i}") for i in range(1, 4)]
        await find_leader([standby], timeout=30)
        events = [before, *meanwhile]

        def unanswered() -> list[str]:
            return [e["content"]["body"] for e in events if not matrix_hs.replies_to(room, e["event_id"])]

        await wait(lambda: not unanswered(), 60, "every message answered", unanswered)
        await asyncio.sleep(LEASE + 1)
        for e in events:
            replies = [m.text for m in matrix_hs.replies_to(room, e["event_id"])]
            assert len(replies) == 1 and f"echo: {e['content']['body']}" in replies[0], (e, replies)
        assert in_model_order(model.requests, last_user_text).get("owner") == ["0", "1", "2", "3"]
        assert not matrix_hs.replies_to(room, old["event_id"]), "history before the cluster is not answered"
    finally:
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)


async def test_web_chat_served_by_every_daemon_and_a_turn_finished_after_its_daemons_kill_9(
    tmp_path: Path, pg_url: str, model: FakeOpenAI
) -> None:
    """The web chat's messages live in the shared database: a page on daemon B follows a chat
    written on daemon A (its own login there), and when A is killed with SIGKILL while streaming the
    answer, B finishes the turn and the page shows one answer, not two."""
    model.add_rule(
        lambda t: "LAGGY" in t,
        lambda body: Reply(
            text=f"echo: {last_user_text(body)} " + "and more " * 20, chunks=40, chunk_delay=0.1
        ),
    )
    configs = []
    for n in range(2):
        cfg = cluster_storage(chat_config(tmp_path / f"n{n}", model.base_url), pg_url)
        cfg["console"] = {"token": TOKEN}
        configs.append(cfg)
    daemons = await start_cluster(tmp_path, configs)
    pages = [Console(d.port) for d in daemons]
    try:
        for page in pages:
            assert (await page.login())[0] == 303
        on_a = await WebChat.new(pages[0])
        on_b = WebChat(pages[1], on_a.chat)
        on_b.listen()
        status, body = await on_a.send("LAGGY web m0")
        assert status == 200, body
        await on_b.wait(
            lambda: any("echo: LAGGY web m0" in m["text"] for m in on_b.bot()), "the answer streaming"
        )
        daemons[0].kill9()
        await daemons[0].wait_exit()
        # The whole answer: A's partial text can end with "and more" at a chunk's edge too (B then
        # runs the turn again into the same message, from its first chunk).
        final = await on_b.wait(
            lambda: next((m for m in on_b.bot() if m["text"].count("and more") == 20), None),
            "the whole answer, finished by B",
            timeout=90,
        )
        await asyncio.sleep(LEASE + 1)
        answers = [m for m in on_b.bot() if "echo: LAGGY web m0" in m["text"]]
        assert [m["id"] for m in answers] == [final["id"]], [m["text"][:80] for m in on_b.bot()]
        assert [m["text"] for m in on_b.latest().values() if m["role"] == "user"] == ["LAGGY web m0"]
    finally:
        await asyncio.gather(*(p.close() for p in pages), return_exceptions=True)
        await asyncio.gather(*(d.close() for d in daemons if d.proc), return_exceptions=True)
