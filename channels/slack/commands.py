"""Slack slash commands: declared in the app manifest from the command registry, received over
Socket Mode as ``slash_commands`` envelopes and turned into the text the gateway parses.

Declared, not registered: Slack has no API that sets an app's slash commands at run time; the
operator pastes ``slack-app-manifest.yaml``. Its ``slash_commands`` block is generated from the
registry (:func:`manifest_entries`, written by scripts/gen_slack_manifest.py and checked by
tests/test_menus_slack.py, so the two cannot drift). Every built-in command is declared under its
own name, except those Slack keeps for itself (:data:`SLACK_BUILTINS`: ``/status`` is Slack's
own), which are declared as ``/chital-<name>``; ``/chital <command> [args]`` reaches every command
and every skill (skills change at run time, a manifest does not).

What arrives: ``command`` (``/model``), ``text`` (``gpt-4o``), ``user_id``, ``channel_id``,
``trigger_id``, ``team_id``, ``response_url``... It becomes an :class:`Inbound` with the text
``/model gpt-4o`` from that user in that channel, so it meets the same registry row, access policy
and admin check as a typed command, and is answered through the normal reply path in that
channel. ``trigger_id`` (unique per invocation) is its message id: a redelivered envelope is the
same journal key. Slack does not offer slash commands inside threads, so the answer goes to the
channel (or the DM) itself.
"""

from __future__ import annotations

from typing import Any

from channels import malformed
from channels.base import Inbound
from channels.menus import MenuCommand, fit

PLATFORM = "slack"
UMBRELLA = "chital"
"""``/chital <command> [args]``: every command and skill under one slash command."""
SLACK_BUILTINS = frozenset(
    {"active", "apps", "archive", "away", "call", "close", "collapse", "dm", "dnd", "expand", "feed",
     "feedback", "invite", "join", "kick", "leave", "me", "msg", "mute", "open", "part", "prefs",
     "remind", "remove", "rename", "search", "shortcuts", "shrug", "star", "status", "topic", "who"}
)  # fmt: skip
"""Slash commands Slack keeps for itself: an app's command of the same name never reaches it."""
MESSAGE_PREFIX = "slash-"
"""Message ids of slash commands (``slash-<trigger_id>``): no post of the user's exists to react to."""
SLASH = "slash"
"""``Inbound.extra`` marker: the message came from a slash command (no ts to react to or read)."""
MAX_DESCRIPTION = 100
MAX_USAGE = 100


def slash_name(command: str) -> str:
    """The manifest's name for a registry command."""
    return f"{UMBRELLA}-{command}" if command in SLACK_BUILTINS else command


def manifest_entries(commands: tuple[MenuCommand, ...]) -> list[dict[str, Any]]:
    """The manifest's ``features.slash_commands`` for ``commands`` (admin ones included: the admin
    check happens when one is run), then ``/chital``."""
    out: list[dict[str, Any]] = [
        {
            "command": f"/{slash_name(c.name)}",
            "description": fit(c.description, MAX_DESCRIPTION),
            **({"usage_hint": fit(c.usage, MAX_USAGE)} if c.usage else {}),
            "should_escape": False,
        }
        for c in commands
    ]
    out.append(
        {
            "command": f"/{UMBRELLA}",
            "description": "run any command or skill: /chital model NAME, /chital house_style text",
            "usage_hint": "COMMAND [args]",
            "should_escape": False,
        }
    )
    return out


def command_text(command: str, text: str) -> str:
    """What the user means, as the gateway reads typed commands: ``/model gpt-4o``.
    ``/chital model gpt-4o`` and ``/chital-status`` mean ``/model gpt-4o`` and ``/status``;
    ``/chital`` alone means ``/help``."""
    name = command.strip().lstrip("/").lower()
    words = text.strip()
    if name == UMBRELLA:
        words = words.lstrip("/")
        return f"/{words}" if words else "/help"
    if name.startswith(f"{UMBRELLA}-"):
        name = name[len(UMBRELLA) + 1 :]
    return f"/{name} {words}".rstrip()


def to_inbound(payload: dict[str, Any], team_id: str | None) -> Inbound:
    """A ``slash_commands`` payload as an :class:`Inbound`; ``ValueError``/``TypeError`` for one
    that is malformed (a missing or mistyped field, another workspace's command)."""
    command, text = payload.get("command"), payload.get("text", "")
    user, channel, trigger = payload.get("user_id"), payload.get("channel_id"), payload.get("trigger_id")
    if not (isinstance(command, str) and command.startswith("/") and 1 < len(command) <= 33):
        raise ValueError("no usable command name")
    if not isinstance(text, str):
        raise TypeError("text is not a string")
    if not (malformed.is_id(user) and malformed.is_id(channel) and malformed.is_id(trigger)):
        raise ValueError("a slash command without a usable user, channel or trigger id")
    claimed = payload.get("team_id")
    if team_id and claimed is not None and claimed != team_id:
        raise ValueError("a slash command of another workspace")
    name = payload.get("user_name")
    return Inbound(
        platform=PLATFORM,
        chat_id=channel,
        message_id=f"{MESSAGE_PREFIX}{trigger}",
        sender_id=user,
        text=command_text(command, text),
        is_direct=channel.startswith("D"),
        addressed=True,  # a slash command is addressed to the app by construction
        thread_id=None,
        sender_name=name if isinstance(name, str) else "",
        extra={SLASH: True},
    )
