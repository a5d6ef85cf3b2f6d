"""A channel's health: the states /readyz and the metrics show, and the one object that holds them.

The supervisor (gateway/ops/supervisor.py) is the only writer of a :class:`ChannelStatus`. Adapters
report through :meth:`~channels.base.Channel.report_connected` and
:meth:`~channels.base.Channel.report_trouble` and never set a state, so a reconnecting adapter
cannot overwrite what the supervisor decided (its backoff reason, FAILED, STOPPED).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from channels.base import Channel


class ChannelState(enum.StrEnum):
    DISABLED = "disabled"
    STARTING = "starting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    FAILED = "failed"
    STOPPED = "stopped"


StatusListener = Callable[["Channel"], None]

Report = Callable[[str | None], None]
"""How an adapter tells its supervisor about its connection: ``None`` when it is live, a reason
when it is in trouble and reconnecting on its own. Everything else an adapter says by returning or
raising from :meth:`Channel.run`."""


class ChannelStatus:
    """State, reason and since when, with listeners called on every change (see module docstring)."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self.state = ChannelState.STOPPED
        self.reason: str | None = None
        self.since = time.time()
        self._listeners: list[StatusListener] = []

    def add_listener(self, listener: StatusListener) -> None:
        self._listeners.append(listener)

    def set(self, state: ChannelState, reason: str | None = None) -> None:
        if state is self.state and reason == self.reason:
            return
        self.state, self.reason, self.since = state, reason, time.time()
        for listener in self._listeners:
            listener(self._channel)
