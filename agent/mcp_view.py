"""What the gateway may see of the MCP servers: one plain record per server.

Kept apart from agent/tools/mcp.py (which pulls in LangChain and the MCP SDK) so the gateway's
seam (gateway/agent_api.py) can name it without importing the agent's stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

McpState = Literal["connected", "failed", "disabled", "connecting"]


@dataclass(frozen=True, slots=True)
class McpServerView:
    """One configured MCP server as ``/mcp`` shows it.

    ``name`` is the operator's key in config.yaml; ``reason`` (when failed) is Chital's own words
    (an exception's type, an HTTP status), never the server's text nor a URL; ``tools`` are the
    names the model calls them by, as the server announced them (untrusted: shown bounded)."""

    name: str
    transport: str
    state: McpState
    reason: str = ""
    tools: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """What the server's last tool listing left out or cut (a schema too large, too many tools,
    a description cut), in Chital's words (agent/tools/mcp_bounds.py)."""
