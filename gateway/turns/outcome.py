"""How a turn ended: the label of ``chital_turns_total{outcome=…}`` and what the runner decides on.

An enum rather than bare strings so a misspelt outcome is a type error, not a new metrics series
nobody alerts on. The values are the metric's label values, unchanged."""

from __future__ import annotations

import enum


class TurnOutcome(enum.StrEnum):
    OK = "ok"
    """Answered (also when something after the answer failed: the answer reached the user)."""
    ERROR = "error"
    """Failed with an error reply (or the agent reported a failure)."""
    TIMEOUT = "timeout"
    """Stopped after ``concurrency.turn_timeout``."""
    WAITING = "waiting"
    """Paused for a person's approval; resumed later (gateway/turns/approvals.py)."""
    STOPPED = "stopped"
    """Stopped by /stop."""
    PARKED = "parked"
    """The answer did not reach the chat yet: parked for a retry (gateway/delivery/parking.py)."""
    ABANDONED = "abandoned"
    """Given up after too many attempts (each a restart mid-turn)."""
    FENCED = "fenced"
    """Lost to another daemon meanwhile; that daemon answers (gateway/daemon/cluster.py)."""
