"""In-process test doubles for the real :class:`gateway.core.Gateway`: a recording Channel (our
stand-in for the platform side) and a tiny harness implementing the gateway's AgentHarness
protocol. The Gateway, Store, TurnQueue and delivery code under test are the real ones."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.events import AgentEvent, Final, OutputFile
from channels.base import (
    Capabilities,
    Channel,
    Inbound,
    InboundSink,
    Rendered,
    ReplyTarget,
)
from gateway.config import Config, parse_config
from gateway.core import Gateway
from gateway.metrics import Metrics
from gateway.store import Store


@dataclass
class Sent:
    target: ReplyTarget
    message_id: str
    text: str


class RecordingChannel(Channel):
    """Records every send and edit; the current text of each message is in :attr:`texts`."""

    capabilities = Capabilities(max_message_len=4096, edit_interval=0.0)

    def __init__(self, name: str = "telegram") -> None:
        super().__init__()
        self.name = name
        self.sent: list[Sent] = []
        self.texts: dict[str, str] = {}
        self._ids = itertools.count(1)
        self.changed = asyncio.Event()

    async def run(self, sink: InboundSink) -> None:  # pragma: no cover - driven by the tests
        await asyncio.Event().wait()

    def render(self, markdown: str) -> Sequence[Rendered]:
        return [Rendered(text=markdown)]

    async def send(self, target: ReplyTarget, part: Rendered, *, idempotency_key: str) -> str:
        mid = str(next(self._ids))
        self.sent.append(Sent(target, mid, part.text))
        self.texts[mid] = part.text
        self.changed.set()
        return mid

    async def edit(self, target: ReplyTarget, message_id: str, part: Rendered) -> None:
        self.texts[message_id] = part.text
        self.changed.set()

    def in_chat(self, chat_id: str) -> list[str]:
        """Current texts of the messages the bot sent into ``chat_id``, in order."""
        return [self.texts[s.message_id] for s in self.sent if s.target.chat_id == chat_id]

    def replies_to(self, message_id: str) -> list[str]:
        return [self.texts[s.message_id] for s in self.sent if s.target.reply_to == message_id]


class FakeHarness:
    """Answers ``echo: <text>``; while :attr:`gate` is clear, turns wait (to fill a queue)."""

    model_name = "fake-model"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        """(thread id, text) of every turn that reached the agent."""
        self.gate = asyncio.Event()
        self.gate.set()

    async def _run(self, thread_id: str, text: str) -> AsyncIterator[AgentEvent]:
        self.seen.append((thread_id, text))
        await self.gate.wait()
        yield Final(text=f"echo: {text}")

    def run(self, thread_id: str, *, user_id: str, message_id: str, text: str, files: Any = ()) -> Any:
        return self._run(thread_id, text)

    async def message_count(self, thread_id: str) -> int:
        return sum(1 for t, _ in self.seen if t == thread_id)

    async def save_upload(self, thread_id: str, name: str, data: bytes) -> str:
        return f"/mnt/user-data/uploads/{name}"

    async def read_output(self, thread_id: str, path: str, max_bytes: int) -> OutputFile:
        raise FileNotFoundError(path)


def make_config(**sections: Any) -> Config:
    """Defaults plus ``sections`` (e.g. ``access={...}``, ``limits={...}``); Telegram on."""
    data: dict[str, Any] = {"channels": {"telegram": {"enabled": True, "token": "1:x"}}}
    data.update(sections)
    return parse_config(data, "test")


async def make_gateway(
    tmp_path: Path, config: Config, harness: FakeHarness | None = None
) -> tuple[Gateway, RecordingChannel, FakeHarness]:
    store = await Store.open(tmp_path / "gateway.sqlite", reserve_bytes=0)
    harness = harness or FakeHarness()
    gw = Gateway(config, store, harness, Metrics())
    channel = RecordingChannel()
    gw.attach(channel)
    return gw, channel, harness


async def close_gateway(gw: Gateway) -> None:
    await gw.close(0.5)
    await gw.store.close()


_mids = itertools.count(1000)


def dm(user: int | str, text: str, *, mid: str | None = None, name: str = "") -> Inbound:
    """A Telegram direct message from ``user`` (its private chat id is the user id)."""
    return Inbound(
        platform="telegram",
        chat_id=str(user),
        message_id=mid or str(next(_mids)),
        sender_id=str(user),
        text=text,
        is_direct=True,
        addressed=True,
        sender_name=name,
    )


async def until(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "") -> Any:
    """Poll ``predicate`` until it is truthy; return its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.01)


async def quiet(seconds: float = 0.3) -> None:
    """Let spawned tasks run (used before asserting that nothing more happened)."""
    await asyncio.sleep(seconds)
