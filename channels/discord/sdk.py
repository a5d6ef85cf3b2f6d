"""The adapter's reaches into discord.py's internals, and nothing else.

- ``Client._connection.parsers``: the one dict of dispatch parsers every websocket of a client
  reads (``ws._discord_parsers``). discord.py parses each dispatch inside its websocket's receive
  loop, so a payload it cannot parse would tear the connection down (and a RESUME would replay
  it); the adapter wraps each parser so a failure is skipped and reported instead.
- ``http.Route.BASE`` and ``gateway.DiscordWebSocket.DEFAULT_GATEWAY``: discord.py has no
  per-client base URL; both are process-wide class attributes, read when a request or a
  websocket is made. Set before login; one Discord bot per process.
  (``discord.http._set_api_version()`` would reset Route.BASE; it is never called.)
- ``VoiceClient.warn_nacl`` / ``warn_dave``: class flags that silence the one-time "voice will NOT
  be supported" warnings (Chital never uses voice).
- ``Client.ws``: the gateway websocket, closed apart from the HTTP session. discord.py's public
  ``Client.close()`` closes both (and the client for good); a leadership change must drop only the
  gateway, so that sends and edits under way on the same HTTP session go on (docs/scale-out.md).

No public fallback for the parsers (outside :data:`compat.versions.VERIFIED`'s ``discord.py``
set the daemon refuses to start): without the guard one unreadable event would drop the
connection and everything in flight on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import discord
import discord.gateway
import discord.http
import yarl

Parser = Callable[[Any], None]


def set_endpoints(api_base_url: str, gateway_url: str) -> None:
    """Point discord.py's REST calls and gateway websocket at these URLs (process-wide)."""
    discord.http.Route.BASE = api_base_url
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)


def quiet_voice_warnings() -> None:
    """discord.py's one-time voice warnings off (no voice here)."""
    discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False


def guard_parsers(
    client: discord.Client, wrap: Callable[[str, Parser], Parser], *, keep: Iterable[str] = ()
) -> None:
    """Replace each of ``client``'s dispatch parsers (event name -> parser) but those in ``keep``
    by ``wrap(event, parser)``."""
    parsers: dict[str, Parser] = client._connection.parsers
    kept = set(keep)
    for event, parse in list(parsers.items()):
        if event not in kept:
            parsers[event] = wrap(event, parse)


GATEWAY_CLOSE_TIMEOUT = 10.0
"""How long closing the gateway websocket may wait for Discord's close frame (aiohttp waits 30 s)."""


async def close_gateway(client: discord.Client) -> None:
    """Close ``client``'s gateway websocket with 1000 (Discord ends the session: no events go to it
    any more), leaving its HTTP session open. Call once the task running ``client.connect()`` has
    ended (cancelled): that loop would otherwise open a new one.

    A connection cut before discord.py hands it to the client (``Client.ws`` is set once IDENTIFY is
    sent) is not reached here: cut before HELLO, it is closed as it is dropped (nothing holds it);
    cut in the instant between HELLO and IDENTIFY's return, its heartbeat thread holds it until
    the heartbeat timeout closes it (no events are read from it)."""
    ws: Any = client.ws
    if ws is not None and ws.open:  # DiscordWebSocket.close also stops its heartbeat thread
        with contextlib.suppress(Exception):
            async with asyncio.timeout(GATEWAY_CLOSE_TIMEOUT):
                await ws.close(code=1000)
