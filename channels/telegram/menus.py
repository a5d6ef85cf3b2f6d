"""Telegram's command menu: ``setMyCommands`` per scope, through python-telegram-bot's public API.

Scopes (Telegram picks the most specific one that exists for a chat):

- ``BotCommandScopeAllPrivateChats`` and ``BotCommandScopeAllGroupChats``: the commands everyone
  may run. Admin-only rows are left out, so a stranger's or a member's menu never lists them.
- ``BotCommandScopeChat`` for each admin's private chat the gateway knows: everyone's commands and
  the admin ones. A chat that Telegram does not know (the admin never opened the bot) is skipped
  with a log line; the others are still published.

The menu only offers commands: choosing one sends ``/name`` as an ordinary message, which the
gateway parses and checks like a typed one. The default scope is left alone (an operator may have
set it with BotFather). Names are checked against Telegram's rule (1-32 of ``[a-z0-9_]``),
descriptions cut to 256 characters, at most 100 commands per scope.
"""

from __future__ import annotations

import logging

from telegram import (
    Bot,
    BotCommand,
    BotCommandScope,
    BotCommandScopeAllGroupChats,
    BotCommandScopeAllPrivateChats,
    BotCommandScopeChat,
)
from telegram import error as tg

from channels.menus import NAME, Menu, MenuCommand, fit

log = logging.getLogger(__name__)

MAX_COMMANDS = 100
MAX_DESCRIPTION = 256


def bot_commands(entries: tuple[MenuCommand, ...]) -> list[BotCommand]:
    return [
        BotCommand(c.name, fit(c.description, MAX_DESCRIPTION)) for c in entries if NAME.fullmatch(c.name)
    ][:MAX_COMMANDS]


async def publish(bot: Bot, menu: Menu) -> str:
    """Set each scope's commands; what was set, for the log. A scope Telegram refuses for a
    reason of its own (a chat it does not know) is skipped; a transport error or a 429
    propagates (the gateway logs it and tries again at the next connect or change)."""
    public = bot_commands(menu.public())
    everything = bot_commands(menu.commands)
    scopes: list[tuple[BotCommandScope, list[BotCommand], str]] = [
        (BotCommandScopeAllPrivateChats(), public, "private chats"),
        (BotCommandScopeAllGroupChats(), public, "groups"),
    ]
    for chat in menu.admin_chats:
        if chat.lstrip("-").isdigit():
            scopes.append((BotCommandScopeChat(int(chat)), everything, "an admin's chat"))
    done: list[str] = []
    for scope, commands, what in scopes:
        try:
            await bot.set_my_commands(commands, scope=scope)
        except tg.BadRequest as exc:  # e.g. "chat not found": the admin has not opened the bot yet
            log.warning("telegram: command menu for %s refused: %s", what, exc.message[:200])
            continue
        done.append(f"{len(commands)} for {what}")
    return ", ".join(done)
