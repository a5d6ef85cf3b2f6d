"""``chital pairing``: the operator's side of pairing, from the shell."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from gateway.cli.common import load_existing_config, open_existing_store
from gateway.config.schema import Config
from gateway.ops.logs import visible


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


async def _pairing(cfg: Config, action: str, arg: str | None) -> int:
    """The operator's side of pairing, on the daemon's database (WAL: safe while it runs). Local
    access to the database is the credential here, so no guess limit applies; a stranger is not
    told of a decision made here (the daemon's chat connections are in another process), their next
    message simply gets through (or gets "declined")."""
    store = await open_existing_store(cfg, f"pairing {action}")  # never creates a database
    try:
        if action == "list":
            now = time.time()
            pending = await store.pairing_list()
            approved = await store.approved_list()
            print("pending:" if pending else "pending: none")
            for r in pending:
                state = "denied" if r.denied else ("expired" if r.expired(now) else "pending")
                asked = f"asked {_when(r.created)}; {state} until {_when(r.expires)}"
                print(
                    f"  {r.code}  {visible(r.user)}  {visible(r.name)}  ({asked})"
                )  # names are chosen by strangers
            print("approved:" if approved else "approved: none")
            for user, _ in approved:
                print(f"  {user}")
            return 0
        if action in ("approve", "deny"):
            request = await store.pairing_get(arg or "")
            if request is None or (action == "approve" and request.expired()):
                done = await store.approved_by_code(arg or "") if action == "approve" else None
                if done:
                    print(f"{done} is approved already")
                    return 0
                why = "has expired" if request else "is not pending"
                print(f"chital: pairing code {arg!r} {why}", file=sys.stderr)
                return 1
            if action == "deny":
                ttl = cfg.access_for(request.platform).pairing_code_ttl
                await store.pairing_deny(request.code, ttl)
                print(f"denied {request.user}; no new code for them until {_when(time.time() + ttl)}")
                return 0
            approved_user = await store.pairing_approve(request.code)
            if approved_user is None:
                print(f"chital: pairing code {arg!r} has expired", file=sys.stderr)
                return 1
            print(f"approved {approved_user}")
            return 0
        if action == "revoke":
            user = (arg or "").strip()
            if ":" not in user:
                print("chital: name the user as platform:id, e.g. telegram:12345", file=sys.stderr)
                return 2
            if await store.revoke(user):
                print(f"revoked {user}")
                return 0
            print(f"chital: {user!r} was not approved", file=sys.stderr)
            return 1
    finally:
        await store.close()
    return 2


def cmd_pairing(args: argparse.Namespace) -> int:
    cfg = load_existing_config(args, f"pairing {args.action}")
    if args.action in ("approve", "deny", "revoke") and not args.arg:
        print(f"chital: pairing {args.action} needs an argument", file=sys.stderr)
        return 2
    return asyncio.run(_pairing(cfg, args.action, args.arg))
