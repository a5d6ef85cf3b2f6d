"""The conversation's workspace follows it across daemons: three real ``chital run`` processes on
one PostgreSQL database and one Docker engine, with ``agent.sandbox.docker.shared``; and the same
test with the ``kubernetes`` provider against our fake API server (tests/fakes/kubernetes_server.py,
each pod's execs real bubblewrap sandboxes; no real cluster).

Turn 1 runs on the leader (it polls the fake Telegram bot): the user sends a file, which that
daemon saves in the conversation's volume, and a shell command writes a file and copies the
upload to outputs. The leader is killed with SIGKILL. Turn 2 runs on the daemon that leads next:
it reads the file with the file tool and sends the copied upload back (read through the engine).
Each daemon has its own ``storage.path``, so without the shared mode the second daemon would find
an empty workspace (as docs/scale-out.md used to say).

The Docker variant is skipped when no Docker engine answers, the Kubernetes one without bubblewrap
or root (the fake starts its sandboxes as root); the PostgreSQL pass is ``CHITAL_TEST_POSTGRES=1``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import DaemonProcess, base_config, free_port
from tests.docker_support import DOCKER_MISSING as _WHY_NOT
from tests.docker_support import IMAGE
from tests.fakes.kubernetes_server import FakeKubernetes
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, last_user_text
from tests.fakes.telegram_server import FakeTelegram
from tests.scale_out_support import alive, cluster_storage, find_leader, node_of, start_cluster, wait

pytestmark = [pytest.mark.slow]
_NO_BWRAP = shutil.which("bwrap") is None or os.geteuid() != 0

CHAT = 4242
SECRET = "kumquat-7319"
CSV = b"alpha,beta\n1,2\n"


def _config(
    root: Path, n: int, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, sandbox: dict[str, Any]
) -> dict[str, Any]:
    cfg = cluster_storage(base_config(root / f"data-{n}", model.base_url, free_port()), pg_url)
    cfg["channels"]["telegram"] = tg.channel_settings(poll_timeout=1)
    cfg["agent"]["tools"] = True
    cfg["agent"]["memory"] = {"enabled": False}  # its background model calls are not part of this
    cfg["agent"]["sandbox"] = {"exec_timeout": 60, "limits": {"memory_mb": 256, "pids": 64}, **sandbox}
    return cfg


class _Docker:
    """One dockerd shared by the daemons (``agent.sandbox.docker.shared``); what the test made
    there is removed after it, passed or failed."""

    def __init__(self) -> None:
        self.sandbox: dict[str, Any] = {"provider": "docker", "image": IMAGE, "docker": {"shared": True}}

    async def __aenter__(self) -> _Docker:
        self.before = await asyncio.to_thread(_shared_sandboxes)
        return self

    async def made(self) -> None:
        """Remove what the test made; one container and one volume for the conversation, whichever
        daemons ran it; the start-up probes' (one per daemon) were removed by the daemons
        themselves. The skills (the same on every daemon) are one volume, marked complete by one
        container that never runs."""
        made = await asyncio.to_thread(_remove_new, self.before)
        threads = (
            {c for c in made[0] if c.startswith("chital-sbx-")},
            {v for v in made[1] if v.startswith("chital-ws-")},
        )
        assert (len(threads[0]), len(threads[1])) == (1, 1), made
        skills = {c for c in made[0] if c.startswith("chital-skills-")}
        assert len(skills) == 1 and skills == {v for v in made[1] if v.startswith("chital-skills-")}, made

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(_remove_new, self.before)


class _Kubernetes:
    """Our fake API server; the daemons' kubeconfig points at it."""

    def __init__(self, root: Path) -> None:
        self.fake = FakeKubernetes(root / "k8s", namespace="chital", start_delay=0.1)
        self.sandbox: dict[str, Any] = {}

    async def __aenter__(self) -> _Kubernetes:
        await self.fake.start()
        config = self.fake.write_kubeconfig(self.fake.root / "kubeconfig")
        settings = {"kubeconfig": str(config), "namespace": "chital", "image": "chital-sandbox:test"}
        self.sandbox = {"provider": "kubernetes", "kubernetes": settings}
        return self

    async def made(self) -> None:
        """One pod and one claim for the conversation; the probes' were deleted by the daemons."""
        pods = {name for _, name in self.fake.objects["pods"]}
        claims = {name for _, name in self.fake.objects["persistentvolumeclaims"]}
        assert len(pods) == 1 and {p.replace("-sbx-", "-ws-") for p in pods} == claims, (pods, claims)

    async def __aexit__(self, *exc: object) -> None:
        await self.fake.stop()


@pytest.fixture(
    params=[
        pytest.param(
            "docker",
            marks=[pytest.mark.docker, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")],
        ),
        pytest.param(
            "kubernetes",
            marks=pytest.mark.skipif(_NO_BWRAP, reason="the fake Kubernetes needs bubblewrap, as root"),
        ),
    ]
)
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[_Docker | _Kubernetes]:
    """Where the conversations' sandboxes live, shared by the daemons."""
    async with _Docker() if request.param == "docker" else _Kubernetes(tmp_path) as e:
        yield e


def _tool_results(model: FakeOpenAI) -> list[str]:
    return [
        str(body["messages"][-1].get("content"))
        for body in model.requests
        if body["messages"][-1].get("role") == "tool"
    ]


def _shared_sandboxes() -> tuple[set[str], set[str]]:
    """Names of the sandboxes' containers and volumes on the engine now."""
    import docker

    client = docker.from_env()
    try:
        label = {"label": "chital.sandbox=1"}  # the threads' and the skills'
        containers = {c.name for c in client.containers.list(all=True, filters=label)}
        volumes = {v.name for v in client.volumes.list(filters=label)}
    finally:
        client.close()
    return containers, volumes


def _remove_new(before: tuple[set[str], set[str]]) -> tuple[set[str], set[str]]:
    """Remove the containers and volumes made since ``before``; returns what was removed."""
    import docker

    containers, volumes = _shared_sandboxes()
    client = docker.from_env()
    try:
        for name in containers - before[0]:
            client.containers.get(name).remove(force=True)
        for name in volumes - before[1]:
            client.volumes.get(name).remove(force=True)
    finally:
        client.close()
    return containers - before[0], volumes - before[1]


async def test_a_file_written_on_one_daemon_is_read_on_another_after_kill_9(
    tmp_path: Path, pg_url: str, model: FakeOpenAI, tg: FakeTelegram, engine: _Docker | _Kubernetes
) -> None:
    def reply(body: dict[str, Any]) -> Reply:
        text = last_user_text(body)
        if body["messages"][-1].get("role") != "tool":
            if "remember it" in text:  # turn 1: a file by shell, and the user's upload copied out
                command = (
                    f"mkdir -p notes && echo {SECRET} > notes/secret.txt && "
                    "cp /mnt/user-data/uploads/data.csv /mnt/user-data/outputs/back.csv && echo ok"
                )
                return Reply(tool_calls=[ToolCall("execute", {"command": command})])
            path = "/mnt/user-data/workspace/notes/secret.txt"
            return Reply(tool_calls=[ToolCall("read_file", {"file_path": path})])
        results = [str(m.get("content")) for m in body["messages"] if m.get("role") == "tool"]
        if "remember it" in text:
            return Reply(text="written")
        if SECRET in results[-1]:  # turn 2: send back the file turn 1 made from the upload
            paths = ["/mnt/user-data/outputs/back.csv"]
            return Reply(tool_calls=[ToolCall("present_files", {"paths": paths, "caption": "back"})])
        said = next(r for r in reversed(results) if SECRET in r)
        return Reply(text=f"the file says: {said.strip()}")

    model.add_rule(lambda text: "remember it" in text or text == "what does it say?", reply)
    configs = [_config(tmp_path, n, pg_url, model, tg, engine.sandbox) for n in range(3)]
    daemons: list[DaemonProcess] = await start_cluster(tmp_path, configs)
    try:
        a = await find_leader(daemons)
        upload = tg.add_file(CSV, file_name="data.csv", mime_type="text/csv")
        tg.inject_message(CHAT, CHAT, "remember it", document=upload)
        await wait(lambda: "written" in tg.bot_texts(CHAT), 90, "turn 1's answer", lambda: tg.bot_texts(CHAT))
        assert any("ok" in r for r in _tool_results(model)), _tool_results(model)
        # Turn 1 ran on the leader, which took the message from Telegram: nobody picked it up.
        assert not [d for d in daemons if "picked up" in d.logs()], [d.logs() for d in daemons]

        a.kill9()
        await a.wait_exit()
        b = await find_leader([d for d in daemons if d is not a], timeout=60)
        assert alive(b) and node_of(b) != node_of(a)
        tg.inject_message(CHAT, CHAT, "what does it say?")
        await wait(
            lambda: any("the file says" in t for t in tg.bot_texts(CHAT)),
            120,
            "turn 2's answer",
            lambda: (tg.bot_texts(CHAT), b.logs()[-3000:]),
        )
        (said,) = [t for t in tg.bot_texts(CHAT) if "the file says" in t]
        assert SECRET in said, said
        # The model saw the file's content in the read_file tool result, on the second daemon.
        assert any(SECRET in r for r in _tool_results(model)[1:]), _tool_results(model)

        # The user's upload, saved by the first daemon, copied to outputs by its turn, is sent
        # back by the second one, read through the engine (or the API server).
        def docs() -> list[Any]:
            return [m for m in tg.bot_messages(CHAT) if m.document]

        await wait(lambda: docs(), 60, "the file sent back", lambda: (_tool_results(model), b.logs()[-3000:]))
        (doc,) = docs()
        assert tg.file_bytes(doc.document["file_id"]) == CSV
        # No daemon's own storage holds the files: they live in the engine's volume (the claim).
        for n in range(3):
            data = tmp_path / f"data-{n}"
            assert not [p for p in data.rglob("*") if p.name in ("secret.txt", "back.csv")], n
    finally:
        await asyncio.gather(*(d.close() for d in daemons))
    await engine.made()
