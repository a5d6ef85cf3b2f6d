"""Prometheus metrics of the daemon (served on /metrics). One registry per daemon so tests and the
terminal chat can build several without clashing with prometheus-client's global one."""

from __future__ import annotations

# The submodules, not the package: prometheus_client/__init__ also imports its HTTP exposition
# servers (wsgiref, http.server) and the global registry's collectors, which Chital does not use
# (the package is deferred by compat/lean_imports.py; /metrics imports the exposition when asked).
from prometheus_client.metrics import Counter, Gauge, Histogram
from prometheus_client.registry import CollectorRegistry


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.messages_in = Counter(
            "chital_messages_in", "Inbound messages accepted from users", ["channel"], registry=r
        )
        self.messages_ignored = Counter(
            "chital_messages_ignored",
            "Inbound messages not for the bot or redelivered",
            ["channel", "reason"],
            registry=r,
        )
        self.malformed = Counter(
            "chital_malformed_events",
            "Platform input that could not be read (acknowledged, skipped), by platform and kind: "
            "message, envelope, action, interaction, command; dropped: not even its marker journaled "
            "(docs/channels.md)",
            ["platform", "kind"],
            registry=r,
        )
        self.messages_out = Counter(
            "chital_messages_out", "Messages sent to a platform (edits excluded)", ["channel"], registry=r
        )
        self.hook_deliveries = Counter(
            "chital_hook_deliveries",
            "POST /hooks/<name> deliveries by outcome: accepted, unknown, too_large, timeout, unsigned, "
            "bad_signature, not_json, rate_limited, replay, unavailable (docs/hooks.md)",
            ["outcome"],
            registry=r,
        )
        self.edits = Counter("chital_edits", "Message edits sent to a platform", ["channel"], registry=r)
        self.speech = Counter(
            "chital_speech",
            "Answers spoken (/voice), by outcome: spoken, failed or stopped (by /stop)",
            ["outcome"],
            registry=r,
        )
        self.pushes = Counter(
            "chital_pushes",
            "Push notifications (Bark, ntfy) by target and outcome: sent, retried (an attempt that will"
            " be repeated) or failed (docs/push.md)",
            ["target", "outcome"],
            registry=r,
        )
        self.turns = Counter("chital_turns", "Agent turns finished, by outcome", ["outcome"], registry=r)
        self.turn_seconds = Histogram(
            "chital_turn_seconds",
            "Time from journaled message to final reply",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.errors = Counter("chital_errors", "Errors by channel and kind", ["channel", "kind"], registry=r)
        self.delivery_retries = Counter(
            "chital_delivery_retries", "Replies retried after a transient failure", ["channel"], registry=r
        )
        self.reconnects = Counter(
            "chital_reconnects", "Channel restarts after a failure", ["channel"], registry=r
        )
        self.rate_limited = Counter(
            "chital_platform_429", "Platform rate-limit answers (429 / retry-after)", ["channel"], registry=r
        )
        self.channel_up = Gauge(
            "chital_channel_up", "1 when the channel is connected", ["channel"], registry=r
        )
        self.turns_running = Gauge("chital_turns_running", "Agent turns running now", registry=r)
        self.turns_queued = Gauge("chital_turns_queued", "Messages waiting for their turn", registry=r)
        self.pruned = Counter(
            "chital_pruned_rows", "Rows deleted by retention (storage.retention_days)", ["table"], registry=r
        )
        self.approvals = Counter(
            "chital_approvals",
            "Tool calls that asked for approval, by how they ended (asked, approved, denied, timeout, "
            "cancelled) (docs/approvals.md)",
            ["channel", "outcome"],
            registry=r,
        )
        self.db_bytes = Gauge("chital_db_bytes", "Size of the gateway database and its WAL", registry=r)
        self.ready = Gauge("chital_ready", "1 when /readyz answers ready", registry=r)
        self.timers_owned = Gauge(
            "chital_timers_owned",
            "1 while this daemon runs approval timeouts, schedules, retention",
            registry=r,
        )
        self.timers_armed = Gauge(
            "chital_timers_armed", "Timers held by this daemon now, by kind", ["kind"], registry=r
        )
        self.tokens = Counter(
            "chital_model_tokens",
            "Tokens used by model calls (lead, sub-agents, titles, summaries, memory), by model and kind",
            ["model", "kind"],
            registry=r,
        )
        """``kind``: ``prompt`` or ``completion`` (gateway/turns/usage.py)."""
        self.cost = Counter(
            "chital_model_cost",
            "Cost of model calls whose model has a price (usage.prices), in usage.currency, by model; "
            "a model without a price has no series (its cost is unknown, not 0)",
            ["model", "currency"],
            registry=r,
        )
        self.unpriced = Counter(
            "chital_model_unpriced_tokens",
            "Tokens of model calls whose model has no price in usage.prices (cost unknown), by model",
            ["model"],
            registry=r,
        )
