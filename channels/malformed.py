"""Malformed platform input: the one rule every adapter follows, and the small pieces it shares.

The rule (docs/channels.md, "Malformed input"). Every event shape an adapter does not expect (a wrong
type, a missing id, a null payload, an unknown interaction type, an oversized id) is

* acknowledged to the platform where that stops redelivery: a platform retries what it was not
  told about, and an event that can never be read would come back forever and, on Slack, get the
  app's event delivery switched off;
* counted, by platform and kind (:meth:`channels.base.Channel.count_malformed`; the gateway turns
  that into ``chital_malformed_events_total{platform,kind}``);
* logged with ids and the exception type only, never its raw text (it is someone's message);
* answered where the sender is known: a message through the gateway's journaled notice (rate
  limited per sender there), a button press or interaction in the platform's own answer to it
  (a callback toast, an ephemeral reply), at most :data:`REFUSALS_PER_MINUTE` times a minute per
  sender where that answer is a message of its own.

The durability invariant is untouched: a well-formed message is still acknowledged only after the
sink journaled it; a malformed one that cannot even be journaled as a marker is acknowledged all
the same and counted as ``dropped`` (it would fail again on every redelivery).

Kept apart from :mod:`channels.base` so the contract stays small; no platform SDK is imported here.
"""

from __future__ import annotations

import collections
import time
from typing import Any, TypeGuard

MAX_ID_LEN = 256
"""Longest id (chat, message, sender, thread) an adapter accepts. Real ids are under 100 characters;
a longer one is an attack on the journal's keys and the logs, and is refused as malformed."""

MAX_ATTACHMENTS = 50
"""Most files one message may carry. Platforms allow 10 (Slack, Discord) or fewer; a longer list is
a crafted payload that would otherwise make the gateway download each one."""
MAX_TEXT_CHARS = 1_000_000
"""Longest text an adapter hands on. Platforms cap far lower (Slack 40,000, Telegram 4,096); up to
this the gateway answers with its own specific "too long" note, beyond it the event is malformed."""
MAX_NAME_CHARS = 256
"""Sender names and chat titles are cut to this (they reach prompts and notes)."""

# Kinds of malformed input (the ``kind`` label). One word per thing a platform sends.
MESSAGE = "message"
"""A post (Slack event, Telegram message, Discord MESSAGE_CREATE, Lark im.message.receive_v1)."""
ENVELOPE = "envelope"
"""A transport wrapper without a usable body (Slack Socket Mode envelope, Lark frame, a Telegram
update carrying nothing it announced)."""
ACTION = "action"
"""A button press whose payload cannot be read (Slack block_actions, Telegram callback_query,
Discord component interaction, Lark card.action.trigger)."""
INTERACTION = "interaction"
"""An interaction of a type the bot never offered (a Slack shortcut or modal, a Discord modal or
autocomplete)."""
COMMAND = "command"
"""A command from a platform's menu that cannot be read (a Slack slash command or Discord
application command with a missing or mistyped field, another workspace's, a Lark menu event
without an operator or key)."""
DROPPED = "dropped"
"""Counted in addition to the kind: the marker of a malformed event could not be journaled either,
so nobody is told; the event is acknowledged all the same."""

KINDS = (MESSAGE, ENVELOPE, ACTION, INTERACTION, COMMAND, DROPPED)

ACTION_UNREADABLE = "⚠️ I couldn't read that button press; please press it again or answer in words."
INTERACTION_UNKNOWN = "⚠️ I can't handle that here; please write to me in a message instead."
COMMAND_UNKNOWN = (
    "⚠️ I couldn't read that command; please send it again, or write it in a message (e.g. `/help`)."
)
COMMAND_LATER = "⚠️ I'm restarting; please send that command again in a moment."
"""A menu command that arrived while the gateway was shutting down (it is not journaled)."""

REFUSALS_PER_MINUTE = 3
"""Adapter-side refusals (a Slack ephemeral note) per sender per minute; beyond it only counted."""


def is_id(value: Any) -> TypeGuard[str]:
    """``value`` is a usable platform id: a non-empty string of at most :data:`MAX_ID_LEN` printable
    characters (no control characters, which would reach log lines and journal keys)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_ID_LEN
        and value.isprintable()
        and value.strip() == value
    )


def oversized_ids(**ids: Any) -> list[str]:
    """The names of the ids among ``ids`` that are set but not usable (:func:`is_id`)."""
    return [name for name, value in ids.items() if value not in (None, "") and not is_id(value)]


def problems(inbound: Any) -> list[str]:
    """What makes a parsed :class:`~channels.base.Inbound` malformed all the same: unusable ids, a
    text or a file list no platform sends."""
    found = oversized_ids(chat_id=inbound.chat_id, message_id=inbound.message_id,
                          sender_id=inbound.sender_id, thread_id=inbound.thread_id)  # fmt: skip
    if len(inbound.text) > MAX_TEXT_CHARS:
        found.append("text")
    if len(inbound.attachments) > MAX_ATTACHMENTS:
        found.append("attachments")
    return found


class LogLimit:
    """At most ``per_minute`` log lines a minute per kind of malformed input; the lines held back
    are counted and the next line let through says how many. Malformed input comes from whoever
    can reach the adapter (a crafted button press, a hostile frame): without this, each one is a
    line, and a flood of them grows the log at the sender's pace. The metric still counts every
    one (:meth:`channels.base.Channel.count_malformed`)."""

    def __init__(self, per_minute: int = 5) -> None:
        self.per_minute = per_minute
        self._lines: dict[str, collections.deque[float]] = {}
        self._held: collections.Counter[str] = collections.Counter()

    def allow(self, kind: str, now: float | None = None) -> str | None:
        """None when this line is held back; otherwise the suffix to log with it ("" or "; N more
        like it were not logged")."""
        now = time.monotonic() if now is None else now
        lines = self._lines.setdefault(kind, collections.deque(maxlen=self.per_minute))
        while lines and lines[0] <= now - 60.0:
            lines.popleft()
        if len(lines) >= self.per_minute:
            self._held[kind] += 1
            return None
        lines.append(now)
        held = self._held.pop(kind, 0)
        return f"; {held} more like it were not logged" if held else ""


class Refusals:
    """Per-sender limit on the refusals an adapter sends as messages of their own, so a flood of
    malformed presses from one person cannot make the bot flood their chat. Bounded memory: the
    senders seen longest ago are forgotten first."""

    def __init__(self, per_minute: int = REFUSALS_PER_MINUTE, max_keys: int = 10_000) -> None:
        self.per_minute = per_minute
        self.max_keys = max_keys
        self._seen: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()

    def allow(self, sender: str, now: float | None = None) -> bool:
        """True (and counted) when ``sender`` may be answered now."""
        now = time.monotonic() if now is None else now
        events = self._seen.pop(sender, None) or collections.deque(maxlen=self.per_minute)
        while events and events[0] <= now - 60.0:
            events.popleft()
        allowed = len(events) < self.per_minute
        if allowed:
            events.append(now)
        self._seen[sender] = events
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)
        return allowed
