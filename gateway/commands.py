"""Chat commands: parsing and the help text. Their effects live in :mod:`gateway.core`."""

from __future__ import annotations

import re
from dataclasses import dataclass

COMMANDS: dict[str, str] = {
    "new": "start a fresh conversation (the agent forgets this chat's history)",
    "stop": "cancel the answer being worked on",
    "status": "show this conversation's thread, model and queue",
    "memory": "show what I remember about you (in a direct message)",
    "forget": "erase everything I remember about you",
    "help": "list the commands",
}

_COMMAND = re.compile(r"^/([A-Za-z][A-Za-z0-9_]{0,31})(?:@\S+)?(?:\s+(.*))?$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    args: str
    known: bool


def parse_command(text: str) -> Command | None:
    """``/name args`` → Command; anything else (including paths like ``/usr/bin``) → None."""
    m = _COMMAND.match(text.strip())
    if not m:
        return None
    name = m.group(1).lower()
    return Command(name=name, args=(m.group(2) or "").strip(), known=name in COMMANDS)


def help_text() -> str:
    lines = ["Commands:"]
    lines += [f"/{name} — {what}" for name, what in COMMANDS.items()]
    lines.append("Anything else you write goes to the agent.")
    return "\n".join(lines)


def unknown_text(name: str) -> str:
    return f"Unknown command /{name}. " + help_text()
