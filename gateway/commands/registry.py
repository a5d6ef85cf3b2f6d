"""The shape of the chat command registry: one row per command, and what is derived from the rows.

A :class:`CommandSpec` says everything about a command in one place: its name (and aliases), the
words it takes, its line in ``/help``, who may run it, whether its reply is recorded before it is
sent, and its handler. :class:`Registry` derives the rest from the rows: the parser (a ``/word``
is a command exactly when a row names it), the ``/help`` text, the names a surface offers (the
terminal chat's). There is no second list of names to forget when a command is added.

Handlers get a :class:`CommandContext`: the config, the store, the agent and the few callables
commands use, not the Gateway (so a command cannot reach into the daemon's insides, and a test
or the terminal chat can build one). The rows themselves are in gateway/commands/builtin.py.

This module sits low: it imports nothing of the gateway at run time.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from channels.base import Attachment, Button, Inbound
    from gateway.agent_api import AgentHarness
    from gateway.config.schema import Config
    from gateway.intake.limits import SlidingWindow
    from gateway.schedules.confirm import Confirmations
    from gateway.store.entries import JournalEntry
    from gateway.store.journal import Store
    from gateway.turns.background import BackgroundTasks

_COMMAND = re.compile(r"^/([A-Za-z][A-Za-z0-9_]{0,31})(?:@\S+)?(?:\s+(.*))?$", re.DOTALL)
"""``/name``, ``/name@bot`` (Telegram's form in groups), then the arguments."""


class Who(enum.Enum):
    """Who may run a command."""

    ANYONE = "anyone"
    """Anyone the access policy lets talk to the bot."""
    ADMIN = "admin"
    """An admin of the bot on that platform (``access.admins``); others get a refusal."""


@dataclass(frozen=True, slots=True)
class Command:
    """A parsed ``/name args``; ``known`` when a registry row names it (``name`` is then the
    row's name, also when an alias was typed)."""

    name: str
    args: str
    known: bool


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What a command's handler may use. Built by the Gateway for each command
    (``Gateway.command_context``): fields are the narrow parts, not the Gateway itself."""

    config: Config
    store: Store
    harness: AgentHarness
    bad_codes: SlidingWindow
    """Unknown pairing codes per admin (gateway/intake/limits.py): ``/approve`` guesses count."""
    tell: Callable[[str, str, str, str], Awaitable[None]]
    """(platform, chat id, tag, text): send a message unprompted, once per tag (``Gateway.tell``)."""
    stop: Callable[[JournalEntry], Awaitable[str | None]]
    """Stop the current answer for this /stop entry; None when no turn ran (gateway/turns/stopping.py)."""
    cancel_approvals: Callable[[str, str, str], Awaitable[int]]
    """(conversation, platform, why): end the turns waiting for approval there; how many."""
    turn_status: Callable[[str], tuple[object, int]]
    """A conversation's running turn (or None) and how many wait behind it."""
    running_turns: Callable[[], int]
    """Turns running in all chats."""
    sandbox_state: Callable[[], str]
    """The sandbox's state as the agent's start-up probe found it (``ready``, ``failed``, ...)."""
    schedules: Confirmations
    """``/schedules confirm``: settles a confirmation and wakes the runner (gateway/schedules/confirm.py)."""
    download: Callable[[Inbound, Attachment, int], Awaitable[bytes]] | None = None
    """(message, one of its files, byte limit): the file's bytes from its platform, for a command
    that takes a file (``/skills install``); None where there is no platform (a test's context)."""
    buttons: Callable[[Inbound, str, Sequence[Button], str], Awaitable[bool]] | None = None
    """(message, text, buttons, idempotency key): post ``text`` with ``buttons`` in reply to the
    message, once per key; False where the platform has none (the caller says how to answer in
    text instead). ``/skills show`` puts Approve / Reject under a draft."""
    decide_approval: Callable[[str, bool, str], Awaitable[str]] | None = None
    """(approval id, approve, actor): settle a pending tool approval from the console
    (``Approvals.decide_as_operator``); the sentence for the operator."""
    busy_changed: Callable[[str], None] | None = None
    """(conversation): ``/busy`` changed its mode; the daemon reads it again (gateway/turns/busy.py)."""
    background: BackgroundTasks | None = None
    """``/bg``, ``/tasks`` (gateway/turns/background.py); None where there are none (a test's context)."""


Handler = Callable[[CommandContext, "JournalEntry", Command], Awaitable[str]]
"""Runs a command and returns its reply."""


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One command: everything about it in one row."""

    name: str
    help: str
    """Its line in ``/help``."""
    handler: Handler
    who: Who = Who.ANYONE
    recorded: bool = False
    """The reply is recorded (under the journal key) before it is sent, so a re-run after a crash or
    a failed delivery repeats the reply instead of the effect (gateway/commands/builtin.py)."""
    args: str = ""
    """The words it takes, as its usage line writes them: ``CODE``, ``[NAME]`` (for the reader of
    the table and for a platform's command menu; ``/help`` keeps its one line)."""
    aliases: tuple[str, ...] = ()
    terminal: bool = False
    """It means something in ``chital chat`` too (gateway/cli/chat.py answers it there)."""


class Registry:
    """The commands, in their ``/help`` order, and what is derived from them."""

    def __init__(self, rows: Iterable[CommandSpec]) -> None:
        self.rows = tuple(rows)
        self._by_name: dict[str, CommandSpec] = {}
        for row in self.rows:
            for name in (row.name, *row.aliases):
                if not _COMMAND.fullmatch(f"/{name}") or name != name.lower():
                    raise ValueError(f"/{name} cannot be typed as a command (lower-case [a-z0-9_])")
                if name in self._by_name:
                    raise ValueError(f"/{name} is in the registry twice")
                self._by_name[name] = row

    def get(self, name: str) -> CommandSpec | None:
        """The row for ``name`` (a name or an alias, lower-case), or None."""
        return self._by_name.get(name)

    def known(self, name: str) -> bool:
        return name in self._by_name

    def names(self, who: Who | None = None) -> list[str]:
        """The commands' names (not aliases), of ``who`` only when given."""
        return [row.name for row in self.rows if who is None or row.who is who]

    def parse(self, text: str) -> Command | None:
        """``/name args`` → Command; anything else (including paths like ``/usr/bin``) → None."""
        m = _COMMAND.match(text.strip())
        if not m:
            return None
        name = m.group(1).lower()
        row = self._by_name.get(name)
        args = (m.group(2) or "").strip()
        return Command(name=row.name if row else name, args=args, known=row is not None)

    def help_lines(self, admin: bool = False, rows: Iterable[CommandSpec] | None = None) -> list[str]:
        """``/help``'s list: everyone's commands, then (for an admin) the admin ones. ``rows``
        narrows it to what a surface offers (the terminal chat's)."""
        shown = self.rows if rows is None else tuple(rows)
        lines = ["Commands:"]
        lines += [f"/{row.name} — {row.help}" for row in shown if row.who is Who.ANYONE]
        admins = [f"/{row.name} — {row.help}" for row in shown if row.who is Who.ADMIN]
        if admin and admins:
            lines.append("Admin:")
            lines += admins
        return lines
