"""What the schedule tests share: an in-process rig with the real scheduler and runner driven by a
settable clock, the config they run under, and how to read what the bot posted or answered. One home,
so no test module imports another."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from agent.events import AgentEvent, Final
from agent.provenance import WEB_PAGE, Provenance, Source
from agent.tools.schedule import Caller, ScheduleError, ScheduleInfo, ScheduleRequest
from gateway.config.schema import Config
from gateway.schedules.runner import GatewayScheduler, ScheduleRunner
from tests.fakes.fake_harness import Call
from tests.fakes.gateway_rig import ADMIN, USER, Rig, dm, make_config, until

OTHER = 300


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def schedules_config(**limits: Any) -> Config:
    return make_config(
        access={"admins": [str(ADMIN)], "allow_users": [str(USER), str(OTHER)]},
        delivery={"first_edit_delay": 0.05},
        schedules={"timezone": "Europe/Berlin", **limits},
    )


class Scheduled:
    """A rig with the real scheduler and runner, and a fake agent that schedules on request:
    a message ``schedule <json>`` makes its turn call :meth:`GatewayScheduler.add` with that
    request (as the schedule tool does) and answer with what came back."""

    def __init__(self, rig: Rig, clock: Clock) -> None:
        self.rig, self.clock = rig, clock
        shared = rig.gateway.schedule_clock  # fake_rig(clock=clock): the gateway's reads the test's
        assert shared.now is clock
        self.scheduler = GatewayScheduler(rig.store, rig.gateway.config, shared)
        self.runner = ScheduleRunner(rig.gateway, rig.store, rig.gateway.config, shared, self.scheduler)
        self.calls = 0
        self.firing: Callable[[Call], AsyncIterator[AgentEvent]] | None = None
        """How a firing's turn answers (None: the harness's echo)."""
        rig.harness.scripts = _Scripts(self)

    async def ask(self, user: int, request: dict[str, Any]) -> str:
        inbound = dm(user, "schedule " + json.dumps(request))
        await self.rig.channel.deliver(inbound)

        def answers() -> list[str]:  # a confirmation request replies to the message too
            return [
                str(t) for t in self.rig.channel.replies_to(inbound.message_id) if "Confirm" not in str(t)
            ]

        (answer,) = await until(answers, what="the answer")
        return answer

    async def fire(self) -> int:
        return await self.runner.fire_due()


class _Scripts(dict[str, Callable[[Call], AsyncIterator[AgentEvent]]]):
    def __init__(self, owner: Scheduled) -> None:
        super().__init__()
        self.owner = owner

    def get(self, text: str, default: Any = None) -> Any:  # type: ignore[override]
        if text.startswith("[Scheduled task #") and self.owner.firing is not None:
            return self.owner.firing
        if not text.startswith("schedule "):
            return default
        return self._schedule

    async def _schedule(self, call: Call) -> AsyncIterator[AgentEvent]:
        owner = self.owner
        owner.calls += 1
        asked = json.loads(call.text.removeprefix("schedule "))
        read = asked.pop("after_reading", None)  # as if the model had read that web page first
        request = ScheduleRequest(**asked)
        provenance = Provenance((Source(WEB_PAGE, read),)) if read else Provenance()
        caller = Caller(call.thread_id, call.user_id, call.message_id, f"call-{call.message_id}", provenance)
        try:
            info: ScheduleInfo = await owner.scheduler.add(caller, request)
        except ScheduleError as exc:
            yield Final(f"refused: {exc}")
            return
        yield Final(f"scheduled #{info.id} for {info.next_fire} ({info.timezone})")


def chat_posts(rig: Rig, user: int) -> list[str]:
    """What the bot posted into ``user``'s DM that replies to nothing (the bot's own messages)."""
    return [m.text for m in rig.channel.sent if m.target.chat_id == str(user) and m.target.reply_to is None]


async def command(rig: Rig, user: int, text: str) -> str:
    inbound = dm(user, text)
    await rig.channel.deliver(inbound)
    (answer,) = await until(lambda: rig.channel.replies_to(inbound.message_id), what=text)
    return str(answer)
