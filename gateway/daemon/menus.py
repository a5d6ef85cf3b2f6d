"""Native command menus, derived from the one command registry and published to each channel.

Why derived: a second list of names would drift from what the parser accepts. The menu is the
registry's rows (gateway/commands/builtin.py) in ``/help`` order, then one entry per skill that
can be called as ``/<skill> text`` (gateway/intake/profiles.py), the same names the parser and
``/skills`` use. A menu only *offers* commands: choosing one sends ``/name`` as text (Telegram) or
arrives as an event the adapter turns into that text (Slack, Discord, Lark), so it meets the same
registry row and the same permission checks as a typed command.

When: at every connect of a channel (a restart, a platform outage), and whenever the menu built
every :data:`RECHECK` seconds differs from the one last published there (a skill installed,
approved or removed in chat or with ``chital skills``; an admin's DM learnt). A failure to publish
is logged (never fatal) and tried again at the next connect: typed commands work without a menu.
A channel whose last publish failed is not retried by the timer, so a platform that refuses the
call is not asked every few seconds.
"""

from __future__ import annotations

import asyncio
import logging

from agent.untrusted import one_line
from channels.base import Channel, ChannelState
from channels.menus import MAX_DESCRIPTION, NAME, Menu, MenuCommand
from gateway.commands.builtin import REGISTRY
from gateway.commands.registry import Who
from gateway.config.schema import Config
from gateway.intake import access, profiles
from gateway.ops.tasks import TaskTracker
from gateway.store.journal import Store

log = logging.getLogger(__name__)

RECHECK = 5.0
"""Seconds between two looks at the skill list and the admins' DMs (the skill catalog's refresh
is throttled stat calls; nothing is sent unless the menu changed)."""
MAX_ENTRIES = 100
"""Telegram shows at most 100 commands (Discord takes 100 global commands): built-ins come first."""


def registry_commands() -> tuple[MenuCommand, ...]:
    """The registry's rows as menu entries, in ``/help`` order (also what Slack's manifest
    declares: scripts/gen_slack_manifest.py)."""
    return tuple(
        MenuCommand(row.name, one_line(row.help, MAX_DESCRIPTION), row.args, row.who is Who.ADMIN)
        for row in REGISTRY.rows
    )


def commands(config: Config) -> tuple[MenuCommand, ...]:
    """The menu's entries: the registry's rows, then the skills callable as commands."""
    out = list(registry_commands())
    for skill in profiles.skills(config):
        name = profiles.command_name(skill.name)
        if skill.drafted or not NAME.fullmatch(name) or REGISTRY.known(name):
            continue  # a draft is not callable; a built-in's name stays the built-in
        about = one_line(f"skill: {skill.description}", MAX_DESCRIPTION)
        out.append(MenuCommand(name, about, "[request]"))
    return tuple(out[:MAX_ENTRIES])


async def admin_dms(config: Config, platform: str, store: Store) -> tuple[str, ...]:
    """The known direct chats of ``platform``'s admins (wildcards name nobody): the DM the admin
    last wrote from, else the user id where that is the DM's id. Configured ``admin_chats`` are
    left out on purpose: they may be groups, where everyone would see the admin commands."""
    out: list[str] = []
    for entry in config.access_for(platform).admins:
        prefix, _, raw = entry.rpartition(":")
        if raw in ("", "*") or (prefix and prefix != platform):
            continue
        chat = await store.dm_chat_get(f"{platform}:{raw}")
        if chat is None and platform in access.DM_IS_USER_ID:
            chat = raw
        if chat and chat not in out:
            out.append(chat)
    return tuple(out)


class Menus:
    """Publishes each watched channel's menu when it connects and when the menu changes."""

    def __init__(self, config: Config, store: Store, tasks: TaskTracker) -> None:
        self._config = config
        self._store = store
        self._tasks = tasks
        self._channels: list[Channel] = []
        self._up: set[str] = set()
        self._published: dict[str, tuple[object, ...]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._watching = False

    def watch(self, channel: Channel) -> None:
        """Publish ``channel``'s menu at each of its connects, and whenever the menu changes."""
        self._channels.append(channel)
        channel.add_status_listener(self._on_state)

    def _on_state(self, channel: Channel) -> None:
        if channel.state is not ChannelState.CONNECTED:
            self._up.discard(channel.name)
            return
        if channel.name in self._up:
            return
        # (Re)connected: publish again, since a restarted daemon cannot know what is published.
        self._up.add(channel.name)
        self._published.pop(channel.name, None)
        self._tasks.spawn(self.publish(channel), f"menu:{channel.name}")
        if not self._watching:
            self._watching = True
            self._tasks.spawn(self._watch(), "menu:watch")

    async def publish(self, channel: Channel) -> None:
        lock = self._locks.setdefault(channel.name, asyncio.Lock())
        async with lock:  # two refreshes at once must not publish out of order
            try:
                menu = Menu(commands(self._config), await admin_dms(self._config, channel.name, self._store))
            except Exception as exc:
                log.warning("%s: could not build the command menu: %s", channel.name, type(exc).__name__)
                return
            if self._published.get(channel.name) == menu.fingerprint():
                return
            try:
                done = await channel.register_commands(menu)
            except Exception as exc:  # typed commands still work: say so and try at the next change
                log.warning("%s: command menu not published (typed commands still work): %s",
                            channel.name, channel.egress(str(exc))[:300])  # fmt: skip
                return
            self._published[channel.name] = menu.fingerprint()
            if done:
                log.info("%s: command menu published: %s", channel.name, done)

    async def _watch(self) -> None:
        """Every :data:`RECHECK` seconds, publish again where the menu changed (a skill came or
        went, an admin wrote to the bot for the first time)."""
        while True:
            await asyncio.sleep(RECHECK)
            for channel in self._channels:
                if channel.name in self._up and channel.name in self._published:
                    await self.publish(channel)

    async def close(self) -> None:
        await self._tasks.close()
