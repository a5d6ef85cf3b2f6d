"""Command menus: what the gateway asks an adapter to publish as the platform's native command list.

The gateway derives a :class:`Menu` from its one command registry (gateway/commands/registry.py,
plus a line per skill) and hands it to :meth:`channels.base.Channel.register_commands` each time the
channel connects and whenever the list changes (a skill installed or removed). Adapters only
publish it: a command chosen from a menu still arrives as the text ``/name args`` in an
:class:`~channels.messages.Inbound`, so it goes through the same registry row, access checks and
journal as a typed command. Nothing here decides who may *run* a command; ``admin`` only keeps a
command out of the menus everyone sees.

Each platform cuts names and descriptions to its own limits with :func:`fit`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME = re.compile(r"[a-z0-9_]{1,32}")
"""A command name every platform accepts (Telegram's rule is the strictest: 1-32 of [a-z0-9_])."""
MAX_DESCRIPTION = 256
"""Telegram's limit; Discord's is 100, Slack's manifest takes about as much as Telegram."""


@dataclass(frozen=True, slots=True)
class MenuCommand:
    """One entry of a command menu."""

    name: str
    """Lower-case ``[a-z0-9_]{1,32}`` (:data:`NAME`); rows whose name does not fit are left out."""
    description: str
    """One line, shown beside the name; already free of control and bidi characters."""
    usage: str = ""
    """The words it takes (``[NAME]``, ``CODE``): Slack shows it as the usage hint."""
    admin: bool = False
    """Only admins may run it: published only where only admins see it (Telegram's admin DMs)."""


@dataclass(frozen=True, slots=True)
class Menu:
    """What one platform should offer."""

    commands: tuple[MenuCommand, ...]
    admin_chats: tuple[str, ...] = ()
    """The platform's chat ids of the admins' direct chats that are known (Telegram: the chat id of
    a private chat is the user id), for a menu scoped to those chats."""

    def public(self) -> tuple[MenuCommand, ...]:
        """The commands everyone may run (what public scopes show)."""
        return tuple(c for c in self.commands if not c.admin)

    def fingerprint(self) -> tuple[object, ...]:
        """Equal for two menus that publish the same thing (no re-publish when nothing changed)."""
        return (self.commands, self.admin_chats)


def fit(text: str, limit: int) -> str:
    """``text`` on one line within ``limit`` characters (an ellipsis marks a cut), never empty:
    every platform refuses an empty description."""
    line = " ".join(text.split())
    if len(line) > limit:
        line = line[: max(limit - 1, 0)].rstrip() + "…"
    return line or "-"
