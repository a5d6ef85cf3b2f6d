"""``chital send PLATFORM:CHAT[:THREAD] TEXT``: post a message into a chat from the shell, for cron
jobs and CI hooks (docs/schedules.md).

The message is journaled in the daemon's own database as a notice (SQLite in WAL mode lets this
process write while the daemon runs); the daemon picks it up within a second and delivers it
through the outbox like any reply: once, and retried while the channel is down (for
``delivery.retry_window``). Without a running daemon it waits in the journal and goes out when the
daemon next starts. This command prints the message's key and exits 0 once the message is
journaled; with ``--wait`` it waits until it was delivered.

Decisions: the text is the operator's and is sent as-is, not through the agent. Any chat may be
targeted, with no access check: whoever can run this command can read and write the database and
the bot's tokens anyway. The id must be well-formed for its platform (a typo must not sit in the
journal for hours of retries); whether the bot is in that chat only the platform can tell, and a
refusal shows in the daemon's log and as ``failed`` with ``--wait``.

``push:NAME`` targets a Bark or ntfy target of the config (docs/push.md): journaled the same way,
sent by the daemon over HTTP (gateway/delivery/push.py); a refusal's reason (a revoked token, an
unknown device key) is kept on the entry and printed by ``--wait``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import uuid
from typing import Any

from channels.base import Inbound
from gateway.cli.common import add_command, load_existing_config, open_existing_store
from gateway.config.schema import Config
from gateway.intake.access import STARTED_BY_BOT

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Refused(Exception):
    """Bad input: one line for the operator, exit 2."""


def parse_target(target: str, config: Config) -> tuple[str, str, str | None]:
    """``PLATFORM:CHAT[:THREAD]`` → (platform, chat, thread), checked against the platform's id
    shapes and the config (the channel must be on)."""
    from gateway.config.platforms import PLATFORMS, channel_readiness
    from gateway.config.push import PUSH_PLATFORM

    platform, _, rest = target.partition(":")
    platform = platform.strip().lower()
    if platform == PUSH_PLATFORM:  # a Bark or ntfy target of the config (docs/push.md)
        if rest not in config.push:
            known = ", ".join(f"push:{n}" for n in sorted(config.push)) or "none (the config has no push:)"
            raise Refused(f"unknown push target {rest[:40]!r}; known: {known}")
        return platform, rest, None
    ready = channel_readiness(config)
    if platform not in ready:
        raise Refused(f"unknown platform {platform!r}; use one of {', '.join(sorted(ready))}")
    ok, why = ready[platform]
    if not ok:
        raise Refused(f"channel {platform} is off in this config: {why}")
    row = next(p for p in PLATFORMS if p.name == platform)
    # A Matrix room id holds a colon ("!room:server"): the chat is not simply cut at the first one.
    chat, thread = _split(rest, row.chat_ids.pattern)
    if not re.fullmatch(row.chat_ids.pattern, chat, re.ASCII):
        raise Refused(f"{chat[:80]!r} is not a {platform} chat id: expected {row.chat_ids.said}")
    if not thread:
        return platform, chat, None
    if row.thread_ids is None:
        raise Refused(f"{platform} threads cannot be posted into directly; send to the chat")
    if not re.fullmatch(row.thread_ids.pattern, thread, re.ASCII):
        raise Refused(f"{thread[:80]!r} is not a {platform} thread id: expected {row.thread_ids.said}")
    return platform, chat, thread


def _split(rest: str, chat_pattern: str) -> tuple[str, str]:
    """``CHAT[:THREAD]`` → (chat, thread): all of it when it is a well-formed chat id, else the
    longest prefix ending before a colon that is one, else the text up to the first colon (which
    the caller refuses, naming it)."""
    cuts = [i for i, ch in enumerate(rest) if ch == ":"]
    if not cuts or re.fullmatch(chat_pattern, rest, re.ASCII):
        return rest, ""
    for i in reversed(cuts):
        if re.fullmatch(chat_pattern, rest[:i], re.ASCII):
            return rest[:i], rest[i + 1 :]
    return rest[: cuts[0]], rest[cuts[0] + 1 :]


def push_inbound(platform: str, chat: str, thread: str | None, tag: str, title: str | None = None) -> Inbound:
    """The notice's message: no sender, replying to nothing, marked for the daemon's push loop."""
    from gateway.config.push import PUSH_TITLE
    from gateway.store.schedules import PUSH_MARK

    extra: dict[str, Any] = {STARTED_BY_BOT: True, PUSH_MARK: True}
    if title:
        extra[PUSH_TITLE] = title
    if platform == "slack" and thread:
        extra["thread_ts"] = thread
    from gateway.config.platforms import is_direct

    direct = is_direct(platform, chat)
    return Inbound(platform, chat, f"push-{tag}", "", "", direct, True, thread, extra=extra)


async def _send(config: Config, inbound: Inbound, text: str, wait: float | None) -> int:
    from gateway.store.entries import JournalKind

    # PostgreSQL (docs/scale-out.md): any daemon sharing it picks the push up. SQLite: the
    # daemon's file only; a push into a database no daemon reads would never be delivered.
    store = await open_existing_store(config, "send")
    try:
        if await store.journal_add(inbound, JournalKind.NOTICE, text):
            print(inbound.key)
        else:
            print(f"{inbound.key} (already journaled: not sent again)")
        if not config.storage.database_url:
            # Exit 0 and a key read as "sent" from cron; with no daemon on this SQLite file it is
            # only queued, so say so (stderr: stdout stays the key for scripts). On PostgreSQL any
            # daemon sharing the database may pick it up: nothing to tell from here.
            from gateway.daemon.status import socket_answers, socket_path

            sock = socket_path(config.storage.path)
            if not await asyncio.to_thread(socket_answers, sock):
                print(
                    f"chital: send: queued; no daemon is running on {sock}: it goes out at the next"
                    " start (`chital run`)",
                    file=sys.stderr,
                )
        if wait is None:
            return EXIT_OK
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            state = await store.journal_state(inbound.key)
            if state == "done":
                print("delivered")
                return EXIT_OK
            if state == "failed":
                print(f"chital: {await _failure(store, inbound.key)}", file=sys.stderr)
                return EXIT_FAILED
            await asyncio.sleep(0.2)
        print(
            f"chital: not delivered within {wait:g}s; it stays queued and goes out when the daemon can",
            file=sys.stderr,
        )
        return EXIT_FAILED
    finally:
        await store.close()


async def _failure(store: Any, key: str) -> str:
    """Why ``key`` failed, as the daemon recorded it (a push's reason), else where to look."""
    from gateway.config.push import PUSH_ERROR

    inbound = await store.journal_inbound(key)
    reason = inbound.extra.get(PUSH_ERROR) if inbound is not None else None
    return str(reason) if reason else "the platform refused the message (see the daemon's log)"


def cmd_send(args: argparse.Namespace) -> int:
    config = load_existing_config(args, "send")
    text = sys.stdin.read() if args.text == "-" else args.text
    try:
        platform, chat, thread = parse_target(args.target, config)
        if not text.strip():
            raise Refused("the text is empty")
        try:  # bytes that are not UTF-8 arrive as lone surrogates (argv, a C-locale stdin)
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise Refused(f"the text is not valid UTF-8 (at character {exc.start + 1:,})") from None
        limit = config.limits.max_message_chars
        if len(text) > limit:
            raise Refused(
                f"the text is {len(text):,} characters long; at most {limit:,} (limits.max_message_chars)"
            )
        if args.title is not None and platform != "push":
            raise Refused("--title is for push targets (push:NAME); chats show no title")
        if args.title is not None and not args.title.strip():
            raise Refused("--title is empty")
        if args.key is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", args.key):
            raise Refused("--key takes 1 to 64 letters, digits, '.', '_' or '-'")
    except Refused as exc:
        print(f"chital: send: {exc}", file=sys.stderr)
        return EXIT_USAGE
    inbound = push_inbound(platform, chat, thread, args.key or uuid.uuid4().hex, args.title)
    try:
        return asyncio.run(_send(config, inbound, text, args.timeout if args.wait else None))
    except Exception as exc:  # the database: locked for too long, disk full, unreadable
        print(f"chital: send: could not journal the message: {exc}", file=sys.stderr)
        return EXIT_FAILED


def add_parser(sub: Any) -> None:
    send = add_command(
        sub,
        "send",
        "post a message into a chat (for cron jobs and CI hooks)",
        cmd_send,
        description="Post TEXT into a chat as the bot, as-is (not through the agent). The running"
        " daemon delivers it within a second, retrying while the channel is down; without one it"
        " goes out at the next start. Prints the message's key.",
    )
    send.add_argument(
        "target",
        metavar="PLATFORM:CHAT[:THREAD]",
        help="e.g. telegram:-1001234567890, telegram:-1001234567890:42 (a topic), slack:C0123ABCD"
        " or slack:C0123ABCD:1700000000.123456 (a thread), discord:CHANNEL_ID, lark:oc_...,"
        " push:NAME (a Bark or ntfy target of the config's push: section)",
    )
    send.add_argument("--title", metavar="TITLE", help="push targets only: the notification's title")
    send.add_argument("text", metavar="TEXT", help="the message; '-' reads it from standard input")
    send.add_argument(
        "--wait", action="store_true", help="wait until it was delivered (exit 1 if not within --timeout)"
    )
    send.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="for --wait (60)")
    send.add_argument(
        "--key",
        metavar="KEY",
        help="an id of your own: one KEY is sent once, however often the command runs (a retried CI step)",
    )
