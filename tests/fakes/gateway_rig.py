"""An in-process gateway for adapter tests that assert what the user sees.

The real :class:`gateway.core.Gateway` with a real SQLite store and an echo harness instead of the
agent: every turn answers ``echo: <text>`` (plus the names of the files it received). A channel under
test is attached to it and run against its fake platform server, so journaled notes, answers and
metrics are the production ones, without a model or a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from agent.events import Final
from channels.base import Channel, ChannelState
from gateway.config import parse_config
from gateway.core import Gateway
from gateway.metrics import Metrics
from gateway.store import Store


class EchoHarness:
    """Answers each message with ``echo: <text>``; records what it was asked."""

    model_name = "echo"

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[str]]] = []

    async def run(self, thread_id: str, *, user_id: str, message_id: str, text: str, files: Any = ()) -> Any:
        self.seen.append((text, list(files)))
        names = [str(f).rsplit("/", 1)[-1] for f in files]
        yield Final(f"echo: {text}" + (f" [files: {', '.join(names)}]" if names else ""))

    async def message_count(self, thread_id: str) -> int:
        return 0

    async def save_upload(self, thread_id: str, name: str, data: bytes) -> str:
        return f"/mnt/user-data/uploads/{name}"

    async def read_output(self, thread_id: str, path: str, max_bytes: int) -> Any:
        raise FileNotFoundError(path)


class Rig:
    """One gateway with its store, metrics and echo harness."""

    def __init__(self, gateway: Gateway, harness: EchoHarness, metrics: Metrics) -> None:
        self.gateway, self.harness, self.metrics = gateway, harness, metrics

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    def metrics_text(self) -> str:
        return generate_latest(self.metrics.registry).decode()


@contextlib.asynccontextmanager
async def gateway_rig(tmp_path: Path, allow_users: list[str]) -> AsyncIterator[Rig]:
    config = parse_config(
        {
            "access": {"allow_users": allow_users, "pairing": True, "group_policy": "mention"},
            "storage": {"path": str(tmp_path / "data"), "reserve_mb": 0},
            "delivery": {"first_edit_delay": 0.0},
        }
    )
    store = await Store.open(tmp_path / "data" / "gateway.sqlite", reserve_bytes=0)
    metrics, harness = Metrics(), EchoHarness()
    gateway = Gateway(config, store, harness, metrics)
    try:
        yield Rig(gateway, harness, metrics)
    finally:
        await gateway.close(0.5)
        await store.close()


@contextlib.asynccontextmanager
async def running(
    channel: Channel, rig: Rig, *, connect_within: float = 10.0
) -> AsyncIterator[asyncio.Task[None]]:
    """Attach ``channel`` to the rig's gateway, run it until CONNECTED, cancel it on exit."""
    sink = rig.gateway.attach(channel)
    task = asyncio.create_task(channel.run(sink))
    try:
        async with asyncio.timeout(connect_within):
            while channel.state is not ChannelState.CONNECTED:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        with contextlib.suppress(Exception):
            await channel.close()
