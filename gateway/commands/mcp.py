"""``/mcp``: the MCP servers, their state and their tools; ``/mcp reload`` (admins) re-reads them.

Anyone may list (it shows what the agent can reach, as ``/skills`` does); only an admin of the
bot on that platform may reload. A reload re-reads the ``agent.mcp`` section of the config file
the daemon was started with and applies it to the running agent (agent/tools/mcp.py): servers
added, removed or changed are (re)connected, unchanged ones keep running. SIGHUP does the same
(gateway/daemon/app.py); the rest of the file is not re-applied (that needs a restart).

Server names are the operator's, tool names are the server's: both are shown through
:func:`code_span` (bounded, invisible characters removed, no live Markdown). A failure reason is
Chital's own words, never the server's text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agent.untrusted import code_span, cut
from gateway.config.schema import ConfigError, load_config
from gateway.intake import access

if TYPE_CHECKING:
    from agent.mcp_view import McpServerView
    from gateway.agent_api import AgentHarness
    from gateway.commands.registry import Command, CommandContext
    from gateway.config.schema import Config
    from gateway.store.entries import JournalEntry

log = logging.getLogger(__name__)

TOOLS_SHOWN = 30
"""Tool names listed per server (the rest are counted)."""
USAGE = "Usage: /mcp (list the MCP servers) or /mcp reload (admins: re-read them from the config file)."


async def mcp_command(ctx: CommandContext, entry: JournalEntry, cmd: Command) -> str:
    args = cmd.args.strip().lower()
    if args == "reload":
        inbound = entry.inbound
        if not access.is_admin(ctx.config.access_for(inbound.platform), inbound):
            return "Sorry, only an admin of this bot can use /mcp reload."
        log.info("mcp: reload asked by %s", inbound.user)
        return await reload_mcp(ctx.config, ctx.harness)
    if args:
        return USAGE
    mcp = ctx.harness.mcp
    if mcp is None:
        return "MCP is off (the agent runs without tools or is not set up)."
    return servers_text(mcp.servers())


async def reload_mcp(config: Config, harness: AgentHarness | None) -> str:
    """Re-read ``agent.mcp`` from the config file and apply it; the outcome in words (for the
    chat and for the log of a SIGHUP)."""
    mcp = harness.mcp if harness is not None else None
    if mcp is None:
        return "MCP is off (the agent runs without tools or is not set up): nothing to reload."
    source = config.source
    if source is None:
        return "The daemon runs on built-in defaults (no config file): nothing to reload."
    try:
        fresh = await asyncio.to_thread(load_config, source)
    except ConfigError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"⚠️ Not reloaded: the config file is invalid: {cut(first, 300)}\nThe MCP servers are unchanged."
        )
    views = await mcp.reload(fresh.agent.mcp)
    return "🔄 Reloaded the MCP servers.\n" + servers_text(views)


def servers_text(views: Sequence[McpServerView]) -> str:
    if not views:
        return "No MCP servers are configured (agent.mcp.servers in config.yaml)."
    lines = [f"MCP servers ({len(views)}):"]
    for v in views:
        state = {"connected": "✅ connected", "disabled": "⏸ disabled", "connecting": "… connecting"}.get(
            v.state, f"❌ failed: {cut(v.reason, 200)}"
        )
        lines.append(f"{code_span(v.name)} ({v.transport}) — {state}")
        if v.tools:
            shown = ", ".join(code_span(t) for t in v.tools[:TOOLS_SHOWN])
            more = f" and {len(v.tools) - TOOLS_SHOWN} more" if len(v.tools) > TOOLS_SHOWN else ""
            lines.append(f"  tools: {shown}{more}")
        elif v.state == "connected":
            lines.append("  tools: none")
        lines += [f"  ⚠️ {cut(note, 800)}" for note in v.notes]  # agent/tools/mcp_bounds.py: bounded
    return "\n".join(lines)
