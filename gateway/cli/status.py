"""``chital status``: ask the running daemon how it is doing (channels, queue, recent errors).

It talks to the daemon's Unix socket in the data directory (gateway/daemon/status.py), found through the
same configuration ``chital run`` uses. Exit codes: 0 the daemon answered, 1 no daemon answers (or
it answered something unreadable), 2 the configuration is invalid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from gateway.cli.common import add_command, load_existing_config
from gateway.daemon.status import socket_path

TIMEOUT = 10.0


class NoDaemon(Exception):
    """Nothing answers on the socket; the message is the one line the operator reads."""


async def fetch_status(path: Path, errors: int) -> dict[str, Any]:
    try:
        os.stat(path)  # before the first await: nothing else runs yet
    except FileNotFoundError:
        raise NoDaemon(f"no daemon is running on {path}") from None
    except PermissionError:
        raise NoDaemon(f"cannot reach {path}: permission denied (run as the daemon's user)") from None
    try:
        connector = aiohttp.UnixConnector(path=str(path))
        timeout = aiohttp.ClientTimeout(total=TIMEOUT)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
            session.get("http://chital/status", params={"errors": str(errors)}) as response,
        ):
            response.raise_for_status()
            body = await response.json()
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, PermissionError):
            raise NoDaemon(
                f"cannot reach the daemon on {path}: permission denied (run as the daemon's user)"
            ) from None
        raise NoDaemon(f"no daemon is running on {path} (a stale socket file is left there)") from None
    except TimeoutError:
        raise NoDaemon(f"the daemon on {path} did not answer within {TIMEOUT:.0f}s") from None
    except (aiohttp.ClientError, ValueError) as exc:
        raise NoDaemon(f"the daemon on {path} answered something unreadable: {exc}") from None
    if not isinstance(body, dict):
        raise NoDaemon(f"the daemon on {path} answered something unreadable")
    return body


def _clock(ts: object) -> str:
    if not isinstance(ts, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _ago(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "?"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


STATE_WORDS = {"disabled": "off"}


def render(body: dict[str, Any]) -> str:
    """The readable summary of one status document."""
    out: list[str] = []
    ready = "ready" if body.get("ready") else "NOT ready"
    out.append(
        f"daemon: {body.get('state', '?')}, {ready} (pid {body.get('pid', '?')}, "
        f"up {_ago(body.get('uptime_s'))})"
    )
    for why in body.get("why") or ():
        out.append(f"  - {why}")
    agent = body.get("agent") or {}
    model = agent.get("model", "?")
    agent_line = f"agent: {agent.get('state', '?')}, model {model}"
    if agent.get("state") != "ready" and agent.get("reason"):
        agent_line += f": {agent['reason']}"
    out.append(agent_line)
    sandbox = body.get("sandbox") or {}
    if sandbox:
        word = str(sandbox.get("state", "?"))
        out.append(
            f"sandbox: {word if word in ('ready', 'off') else word.upper()}, {sandbox.get('detail', '')}"
        )
    out.append("channels:")
    channels: dict[str, dict[str, Any]] = body.get("channels") or {}
    for name, info in sorted(channels.items()):
        state = str(info.get("state", "?"))
        word = STATE_WORDS.get(state, state)
        extras = []
        if state != "disabled" and info.get("since") is not None:
            extras.append(f"since {_clock(info.get('since'))} ({_ago(info.get('for_s'))} ago)")
        if info.get("reason"):
            extras.append(str(info["reason"]))
        if info.get("notice"):  # e.g. WhatsApp replies refused outside the 24-hour window
            extras.append(f"NOTE: {info['notice']}")
        out.append(f"  {name:<9} {word:<14}{'  '.join(extras)}".rstrip())
    storage = body.get("storage") or {}
    if storage.get("disk_full"):
        out.append(
            f"storage: the disk under {storage.get('path')} is FULL (the journal lives on its reserve)"
        )
    q = body.get("queue") or {}
    if q.get("error"):
        out.append(f"queue: unknown, {q['error']}")
    out.append(
        f"queue: {q.get('pending', 0)} pending, {q.get('running', 0)} running, "
        f"{q.get('parked', 0)} parked for a delivery retry "
        f"(journal: {q.get('done', 0)} done, {q.get('failed', 0)} failed)"
    )
    out.append(f"  turns in flight: {q.get('turns_running', 0)} running, {q.get('turns_waiting', 0)} waiting")
    traced = body.get("tracing") or {}
    if traced.get("enabled"):
        where = ", ".join(str(x) for x in traced.get("exporters") or ()) or "no exporter (ids only)"
        out.append(f"tracing: on, exported to {where}; errors in a message end with its trace id")
    elif traced:
        out.append("tracing: off (tracing.enabled)")
    timers = body.get("timers") or {}
    if timers.get("owner") == "here":
        armed = timers.get("approvals_armed", 0)
        out.append(
            f"timers: owned here (approval timeouts, schedules, retention); {armed} approval timer(s) armed"
        )
    elif timers:
        out.append(
            "timers: owned by the leader (another daemon runs approval timeouts, schedules, retention)"
        )
    for kind in ("errors", "warnings"):  # apart: a burst of warnings never hides an error
        entries: list[dict[str, Any]] = body.get(kind) or []
        if not entries:
            out.append(f"recent {kind}: none")
            continue
        out.append(f"recent {kind} (last {len(entries)}):")
        for e in entries:
            channel = e.get("channel") or "-"
            line = f"  {_clock(e.get('time'))}  {e.get('level', '?'):<7}  {channel:<9} {e.get('message', '')}"
            if e.get("trace_id"):
                line += f"  trace_id={e['trace_id']}"
            out.append(line)
    return "\n".join(out)


def cmd_status(args: argparse.Namespace) -> int:
    cfg = load_existing_config(args, "status")
    path = socket_path(cfg.storage.path)
    try:
        body = asyncio.run(fetch_status(path, args.errors))
    except NoDaemon as exc:
        print(f"chital: {exc}", file=sys.stderr)
        return 1
    # The daemon masked its secrets already; this process knows the same ones (same config and
    # environment) and masks again, in case the daemon is an older one.
    from gateway.config.secrets import redactor_for

    body = redactor_for(cfg).deep(body)
    if args.json:
        print(json.dumps(body, indent=2, sort_keys=True))
    else:
        print(render(body))
    return 0


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def add_parser(sub: Any) -> None:
    """``chital status`` (registered by gateway/cli/main.py's ``build_parser``)."""
    status = add_command(
        sub,
        "status",
        "ask the running daemon for channel states, queue depth and recent errors",
        cmd_status,
        description="Ask the running daemon, over its socket in the data directory (storage.path),"
        " for channel states, queue depth and recent errors (redacted). Exit 1 when no daemon answers.",
    )
    status.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")
    status.add_argument(
        "-n",
        "--errors",
        type=_count,
        default=10,
        metavar="N",
        help="how many recent errors, and how many warnings, to show (default 10 each)",
    )
