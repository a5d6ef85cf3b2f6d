"""Discord interactions the bot cannot take: counted and answered, so the user never sees only
"This interaction failed".

Discord's acknowledgement of an interaction is its answer (a callback within 3 s); there is no
redelivery, but an interaction left unanswered shows as failed to the person who started it. Ours
are button presses (component interactions with our ``custom_id``) and application commands
(channels/discord/appcommands.py). Everything else, and a press or command whose payload cannot be
read, is malformed input (channels/malformed.py): counted by kind and
answered with an ephemeral note only the presser sees. Where discord.py could not even parse the
INTERACTION_CREATE dispatch, the answer goes out on the raw callback route with the id and token
the payload carried, if they are usable.
"""

from __future__ import annotations

import logging
from typing import Any

import discord
import discord.http

from channels import malformed

log = logging.getLogger(__name__)

APPLICATION_COMMAND = 2
"""A slash command (channels/discord/appcommands.py answers those it can read)."""
COMPONENT = 3
"""INTERACTION_CREATE ``type`` of a message component (a button press)."""
AUTOCOMPLETE = 4
"""The one interaction type that cannot be answered with a message."""
EPHEMERAL = 64


def kind_of(interaction_type: Any) -> str:
    """The malformed kind of an interaction we could not turn into an action or a command."""
    if interaction_type == APPLICATION_COMMAND:
        return malformed.COMMAND
    return malformed.ACTION if interaction_type == COMPONENT else malformed.INTERACTION


def note_for(kind: str) -> str:
    if kind == malformed.COMMAND:
        return malformed.COMMAND_UNKNOWN
    return malformed.ACTION_UNREADABLE if kind == malformed.ACTION else malformed.INTERACTION_UNKNOWN


async def refuse(interaction: discord.Interaction[Any]) -> None:
    """Answer a parsed interaction we do not take: an ephemeral note (autocomplete: nothing)."""
    kind = kind_of(interaction.type.value)
    log.warning("discord: %s %s refused", kind, interaction.id)
    if interaction.type is discord.InteractionType.autocomplete:
        return
    try:
        await interaction.response.send_message(note_for(kind), ephemeral=True)
    except (discord.HTTPException, discord.InteractionResponded) as exc:
        log.warning("discord: could not answer interaction %s: %s", interaction.id, type(exc).__name__)


async def refuse_raw(http: discord.http.HTTPClient, data: Any) -> str:
    """Answer an INTERACTION_CREATE discord.py could not parse, from its raw payload; returns its
    kind. Nothing is sent when the payload has no usable id and token."""
    body = data if isinstance(data, dict) else {}
    kind = kind_of(body.get("type"))
    iid, token = body.get("id"), body.get("token")
    usable = isinstance(iid, str) and iid.isdigit() and len(iid) <= 32 and malformed.is_id(token)
    if not usable or body.get("type") == AUTOCOMPLETE:
        return kind
    route = discord.http.Route(
        "POST", "/interactions/{interaction_id}/{token}/callback", interaction_id=iid, token=token
    )
    payload = {"type": 4, "data": {"content": note_for(kind), "flags": EPHEMERAL}}
    try:
        await http.request(route, json=payload)
    except (discord.HTTPException, OSError, TimeoutError) as exc:
        log.warning("discord: could not answer an unreadable interaction: %s", type(exc).__name__)
    return kind
