"""What intake's per-turn helpers use of the daemon, stated as a protocol.

Fetching attachments, reading the thread a message was written in, choosing the images a model may
see and the conversation's profile need a few things the daemon holds: the config, the store, the
agent seam, the metrics, the attached channels, the slow lane for transcriptions and a way to give
the turn's slot back while waiting on it. They are declared here, so these modules depend on this
short list, not on the Gateway (a higher layer, gateway/daemon/gateway.py), which satisfies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from channels.base import Channel
    from gateway.agent_api import AgentHarness
    from gateway.config.schema import Config
    from gateway.intake.slow_lane import FairLane
    from gateway.ops.metrics import Metrics
    from gateway.store.journal import Store


class SlotLender(Protocol):
    """The turn queue, as intake sees it: a running turn may lend its global slot out."""

    def released(self) -> AbstractAsyncContextManager[None]: ...


class IntakeHost(Protocol):
    """The daemon's parts intake's per-turn helpers read."""

    @property
    def config(self) -> Config: ...

    @property
    def store(self) -> Store: ...

    @property
    def harness(self) -> AgentHarness: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def channels(self) -> Mapping[str, Channel]: ...

    @property
    def slow_lane(self) -> FairLane: ...

    @property
    def turns(self) -> SlotLender: ...
