"""``chital mcp login NAME``: authorize an MCP server whose ``oauth.grant`` is
``authorization_code``, once, from the operator's terminal (agent/tools/mcp_login.py does it).

The daemon has no browser: when such a server has no tokens, or its refresh token is refused
(revoked), ``/mcp`` shows it *failed: authorization revoked or missing: run chital mcp login
NAME* and it is not retried. This command prints the authorization URL, receives the code on a
loopback redirect, stores the tokens in the data directory (0600) and says how many tools the
server then lists. A running daemon notices the new token file within seconds (agent/tools/mcp.py,
``LOGIN_POLL``) and connects with it; no reload is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from gateway.cli.common import add_command, load_config_arg
from gateway.ops.logs import visible


def cmd_mcp_login(args: argparse.Namespace) -> int:
    from agent.tools.mcp_login import LoginFailed, login

    cfg = load_config_arg(args)
    name: str = args.name
    server = cfg.agent.mcp.servers.get(name)
    if server is None:
        print(
            f"chital: mcp login: no MCP server named {visible(name)!r} in agent.mcp.servers", file=sys.stderr
        )
        return 2
    token_dir = cfg.storage.path / "mcp-oauth"
    try:
        count = asyncio.run(login(name, server, token_dir, lambda line: print(line, flush=True)))
    except LoginFailed as exc:
        print(f"chital: mcp login {visible(name)}: {exc}", file=sys.stderr)
        return 1
    print(f"Logged in to MCP server {visible(name)!r}: {count} tool(s). Tokens stored in {token_dir} (0600).")
    print("A running daemon picks them up within a few seconds; /mcp shows the server connected.")
    return 0


def add_parser(sub: Any) -> None:
    mcp = add_command(
        sub,
        "mcp",
        "authorize MCP servers that use OAuth",
        None,
        description="MCP servers (docs/tools-and-mcp.md). 'login NAME' authorizes a server whose"
        " oauth.grant is authorization_code: it prints a URL to open in a browser, receives the"
        " code on http://127.0.0.1:PORT/callback (oauth.redirect_port) and stores the tokens in the"
        " data directory for the daemon.",
    )
    actions = mcp.add_subparsers(title="actions", dest="action", required=True, metavar="ACTION")
    login = add_command(
        actions, "login", "authorize an OAuth MCP server once (authorization code)", cmd_mcp_login
    )
    login.add_argument("name", metavar="NAME", help="the server's name in agent.mcp.servers")
