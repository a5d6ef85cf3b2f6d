"""Discord application (slash) commands: registered from the command registry through the REST
API, answered through interactions.

Registration: one bulk overwrite of the application's **global** commands
(``PUT /applications/{id}/commands``, discord.py's ``HTTPClient.bulk_upsert_global_commands``),
after a ``GET`` shows they differ. Global rather than per guild: the bot answers in every server it
is in *and* in DMs, and guild commands never appear in DMs; a bulk overwrite replaces the whole set
(a removed skill disappears) and is idempotent, so a restart sends nothing when nothing changed.
Every command takes one optional string option (``args``, or ``request`` for a skill) holding what
would follow the name when typed. Admin-only rows carry ``default_member_permissions: "0"``: a
server shows them only to its administrators (in DMs Discord shows every command). That only
hides; the gateway checks the bot's own ``access.admins`` whoever runs it.

Answer: an ``INTERACTION_CREATE`` of type 2 is deferred at once (callback type 5, "thinking…",
inside Discord's 3 s), then handed to the gateway as the text ``/name args`` from the user who
ran it, in that channel or thread. So it meets the same registry row, access policy and admin
check as a typed command, and its answer goes through the normal reply path: the first part edits
the deferred response (``PATCH /webhooks/{app}/{token}/messages/@original``), later parts are
ordinary channel messages. The interaction token lives only in memory (:class:`Pending`) and only
for Discord's 15 minutes: after a restart, or later, the answer is an ordinary channel message.

Malformed: an interaction without a usable name, user or channel, an option that is not a string,
is counted as ``command`` and refused with an ephemeral note; it never reaches the gateway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import discord

from channels import malformed
from channels.base import ChannelError, Inbound, InboundSink, Menu, MenuCommand, Rendered, ReplyTarget
from channels.menus import NAME, fit

if TYPE_CHECKING:
    from .channel import DiscordChannel

log = logging.getLogger(__name__)

PLATFORM = "discord"
INTERACTION = "interaction"
"""``Inbound.extra`` key: the id of the interaction a message stands for (no message to reply to)."""
CHAT_INPUT, STRING = 1, 3
MAX_DESCRIPTION = 100
TOKEN_LIFETIME = 14 * 60.0
"""Seconds an interaction token is used for (Discord's is 15 minutes; a margin for clocks)."""
EPHEMERAL = 64


def payload(menu: Menu) -> list[dict[str, Any]]:
    """The bulk-overwrite body for ``menu`` (at most 100 commands, as Discord allows)."""
    return [_command(c) for c in menu.commands if NAME.fullmatch(c.name)][:100]


def _command(c: MenuCommand) -> dict[str, Any]:
    option = "request" if c.usage == "[request]" else "args"
    body: dict[str, Any] = {
        "name": c.name,
        "type": CHAT_INPUT,
        "description": fit(c.description, MAX_DESCRIPTION),
        "options": [
            {
                "type": STRING,
                "name": option,
                "description": fit(c.usage or "what would follow the command when typed", MAX_DESCRIPTION),
                "required": False,
            }
        ],
        "contexts": [0, 1],  # servers and the bot's DMs
        "integration_types": [0],
    }
    if c.admin:
        body["default_member_permissions"] = "0"
    return body


def _comparable(commands: Any) -> list[tuple[Any, ...]]:
    """What a command set means, in a form a stored set and a payload compare by."""
    out = []
    for c in commands if isinstance(commands, list) else []:
        if isinstance(c, dict):
            raw = c.get("options") or []
            opts = tuple((o.get("name"), o.get("description")) for o in raw if isinstance(o, dict))
            out.append((c.get("name"), c.get("description"), opts, c.get("default_member_permissions")))
    return sorted(out, key=repr)


async def publish(client: discord.Client, menu: Menu) -> str:
    """Overwrite the global commands with ``menu`` unless they are equal already."""
    app_id = client.application_id
    if app_id is None:
        raise ChannelError("Discord application id unknown (not logged in)")
    body = payload(menu)
    current = await client.http.get_global_commands(app_id)
    if _comparable(current) == _comparable(body):
        return f"{len(body)} global commands, unchanged"
    await client.http.bulk_upsert_global_commands(app_id, body)
    return f"{len(body)} global commands"


def to_inbound(interaction: discord.Interaction[Any]) -> Inbound:
    """An application command as the typed command it stands for; ``ValueError``/``TypeError``
    when a field is missing or mistyped."""
    data = interaction.data
    if not isinstance(data, dict):
        raise TypeError("no command data")
    name = data.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError("no usable command name")
    words: list[str] = []
    options = data.get("options") or []
    if not isinstance(options, list):
        raise TypeError("options is not a list")
    for option in options:
        value = option.get("value") if isinstance(option, dict) else None
        if not isinstance(value, str):
            raise TypeError("an option that is not a string")
        words.append(value.strip())
    user, channel_id = interaction.user, interaction.channel_id
    if user is None or channel_id is None or not malformed.is_id(str(user.id)):
        raise ValueError("no user or channel")
    if user.bot:
        raise ValueError("a command from a bot")
    chat_id, thread_id = str(channel_id), None
    channel, parent = interaction.channel, getattr(interaction.channel, "parent_id", None)
    if isinstance(channel, discord.Thread) and parent:
        chat_id, thread_id = str(parent), str(channel_id)
    return Inbound(
        platform=PLATFORM,
        chat_id=chat_id,
        message_id=str(interaction.id),  # a snowflake: unique, never a message's id
        sender_id=str(user.id),
        text=" ".join([f"/{name}", *words]).rstrip(),
        is_direct=interaction.guild_id is None,
        addressed=True,  # a command is addressed to the bot by construction
        thread_id=thread_id,
        sender_name=user.display_name or user.name,
        extra={INTERACTION: str(interaction.id)},
    )


class Pending:
    """Deferred interactions whose token may still answer them, in memory only (a token is a
    credential for 15 minutes; it is never journaled)."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[discord.Interaction[Any], float]] = {}
        self._originals: dict[str, str] = {}  # message id of an original response -> interaction id

    def remember(self, interaction: discord.Interaction[Any]) -> None:
        now = time.monotonic()
        self._open = {k: v for k, v in self._open.items() if v[1] > now}
        self._originals = {m: i for m, i in self._originals.items() if i in self._open}
        self._open[str(interaction.id)] = (interaction, now + TOKEN_LIFETIME)

    def _live(self, iid: str) -> discord.Interaction[Any] | None:
        entry = self._open.get(iid)
        return entry[0] if entry is not None and entry[1] > time.monotonic() else None

    async def send(self, target: ReplyTarget, part: Rendered) -> str | None:
        """The first part of an answer to a deferred command edits its "thinking…" response;
        None when there is none to edit (a later part, an expired token, after a restart)."""
        iid = target.extra.get(INTERACTION)
        interaction = self._live(iid) if isinstance(iid, str) else None
        if interaction is None or iid in self._originals.values():
            return None
        message = await interaction.edit_original_response(content=part.text)
        self._originals[str(message.id)] = str(iid)
        return str(message.id)

    async def edit(self, message_id: str, part: Rendered) -> bool:
        """Edit an original response through its interaction; False when it is not one (or its
        token is spent): the caller edits it as a channel message."""
        iid = self._originals.get(message_id)
        interaction = self._live(iid) if iid is not None else None
        if interaction is None:
            return False
        await interaction.edit_original_response(content=part.text)
        return True


async def receive(
    channel: DiscordChannel,
    interaction: discord.Interaction[Any],
    sink: InboundSink | None,
    lock: asyncio.Lock,
) -> None:
    """Defer, journal as typed text, and let the gateway answer (see the module docstring)."""
    try:
        inbound = to_inbound(interaction)
    except (ValueError, TypeError, AttributeError) as exc:
        channel.count_malformed(malformed.COMMAND)
        log.warning("discord: application command %s could not be read: %s", interaction.id, exc)
        await _note(interaction, malformed.COMMAND_UNKNOWN)
        return
    try:
        await interaction.response.defer(thinking=True)
    except Exception as exc:  # late (3 s passed) or an answer discord.py cannot parse: logged
        log.warning("discord: deferring interaction %s: %s", interaction.id, type(exc).__name__)
    if interaction.response.is_done():  # deferred (even if its answer could not be parsed)
        channel.pending.remember(interaction)  # else the answer is an ordinary channel message
    if sink is None:
        await _edit(interaction, malformed.COMMAND_LATER)
        return
    async with lock:  # in arrival order with the messages around it
        ref = f"interaction {interaction.id}"
        try:
            if malformed.problems(inbound):  # oversized: a marker that still answers the interaction
                await channel.skip_unreadable(
                    sink, ValueError("unusable command text"), ref=ref, chat_id=inbound.chat_id,
                    sender_id=inbound.sender_id, message_id=inbound.message_id, is_direct=inbound.is_direct,
                    thread_id=inbound.thread_id, extra=inbound.extra, kind=malformed.COMMAND,
                )  # fmt: skip
            else:
                await channel.hand_over(sink, inbound, ref=ref)
        except Exception as exc:  # shutting down or the store is down: Discord will not resend it
            log.error("discord: sink failed for interaction %s: %s", interaction.id, type(exc).__name__)
            await _edit(interaction, malformed.COMMAND_LATER)


async def _note(interaction: discord.Interaction[Any], text: str) -> None:
    try:
        await interaction.response.send_message(text, ephemeral=True)
    except (discord.HTTPException, discord.InteractionResponded) as exc:
        log.warning("discord: could not answer interaction %s: %s", interaction.id, type(exc).__name__)


async def _edit(interaction: discord.Interaction[Any], text: str) -> None:
    try:
        await interaction.edit_original_response(content=text)
    except discord.HTTPException as exc:
        log.warning("discord: could not answer interaction %s: %s", interaction.id, type(exc).__name__)
