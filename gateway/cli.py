"""The ``chital`` command: run, check, chat, pairing.

Exit codes: 0 fine, 1 the daemon could not start or ``check`` found a problem, 2 the configuration
is invalid or the command line is wrong. A failure is one ``chital: ...`` line on stderr, never a
traceback: the operator reads it in ``journalctl`` or ``docker logs``.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys
import threading
import time
from pathlib import Path

from .config import Config, ConfigError, load_config

DEFAULT_CONFIG = "config.yaml"


def _config_path(arg: str | None) -> Path | None:
    if arg:
        return Path(arg)
    env = os.environ.get("CHITAL_CONFIG")
    if env:
        return Path(env)
    return Path(DEFAULT_CONFIG) if Path(DEFAULT_CONFIG).exists() else None


def _load(args: argparse.Namespace) -> Config:
    path = _config_path(args.config)
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"chital: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


# -- run ---------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from .app import Daemon
    from .lifecycle import StartupError
    from .logs import setup_logging
    from .registry import channel_readiness

    cfg = _load(args)
    setup_logging(cfg)
    for name, (ok, why) in channel_readiness(cfg).items():
        print(f"  {name:<9} {'on ' if ok else 'off'}  {why}", file=sys.stderr)
    code = 0
    try:
        asyncio.run(Daemon(cfg).run_forever())
    except StartupError as exc:
        print(f"chital: {exc}", file=sys.stderr, flush=True)
        code = 1
    _exit_if_threads_linger(code)
    return code


def _exit_if_threads_linger(code: int, wait: float = 3.0) -> None:
    """Every resource was released, so no thread should be left; should a library still hold a
    non-daemon thread, the interpreter would wait for it forever at exit (the hang operators saw).
    Give such threads ``wait`` seconds, then leave anyway with ``code``."""
    deadline = time.monotonic() + wait
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            print(
                f"chital: thread {thread.name!r} did not finish; exiting anyway", file=sys.stderr, flush=True
            )
            os._exit(code)


# -- check -------------------------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    """Validate the config, build each model, say which channels are ready; with ``--online`` also
    ask each service whether the credentials work. Non-zero when anything would fail at run time."""
    from .probes import model_key, model_problems, run_probes
    from .registry import channel_readiness

    cfg = _load(args)
    print(f"config: {_config_path(args.config) or '(built-in defaults)'} is valid")
    spec = cfg.model_spec()
    kwargs = spec.kwargs()
    print(
        f"model: {spec.name} → {spec.use} model={kwargs.get('model', '?')} "
        f"base_url={kwargs.get('base_url') or '(default)'} "
        f"api_key={'set' if model_key(kwargs) else 'MISSING'}"
    )
    problems = model_problems(cfg)
    for problem in problems:
        print(f"  FAILED {problem}")
    print(f"storage: {cfg.storage.path} (journal kept {cfg.storage.retention_days:g} days)")
    if cfg.storage.retention_days < 1:
        print(
            "  WARNING storage.retention_days is under 1: Telegram redelivers an unconfirmed update for"
            " up to 24 h, which would then be answered twice (docs/durability.md)"
        )
    print("channels:")
    ready = 0
    for name, (ok, why) in channel_readiness(cfg).items():
        ready += ok
        print(f"  {name:<9} {'ready' if ok else 'off  '}  {why}")
    if not ready:
        print("no chat channel is ready: `chital run` still starts; `chital chat` talks to the agent here")
    failed = len(problems)
    if args.online:
        print("online:")
        for outcome in asyncio.run(run_probes(cfg)):
            print(outcome.line())
            failed += outcome.ok is False
    if failed:
        print(f"chital: check failed: {failed} problem(s)", file=sys.stderr)
        return 1
    return 0


# -- chat --------------------------------------------------------------------------------------------
async def _chat(cfg: Config) -> int:
    from agent.events import Clarification, Final, StatusUpdate, TextDelta, ToolProgress, TurnFailed

    from .app import open_harness
    from .store import Store

    store = await Store.open(cfg.storage.path / "gateway.sqlite", cfg.storage.reserve_mb << 20)
    harness = await open_harness(cfg)
    conversation = f"cli:{getpass.getuser()}"
    thread_id = await store.thread_for(conversation)
    print(f"chital chat — model {harness.model_name}. /new starts over, /quit (or Ctrl-D) leaves.")
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                line = await loop.run_in_executor(None, lambda: input("you> "))
            except (EOFError, KeyboardInterrupt):
                print()
                break
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                break
            if text == "/new":
                thread_id = await store.new_thread(conversation)
                print("(fresh conversation)")
                continue
            print("chital> ", end="", flush=True)
            streamed = False
            async for ev in harness.run(
                thread_id, user_id=conversation, message_id=f"cli-{time.time_ns()}", text=text
            ):
                if isinstance(ev, TextDelta):
                    streamed = True
                    print(ev.text, end="", flush=True)
                elif isinstance(ev, ToolProgress) and ev.phase == "start":
                    print(f"\n  [tool {ev.name}]", flush=True)
                elif isinstance(ev, StatusUpdate):
                    print(f"\n  [{ev.text}]", flush=True)
                elif isinstance(ev, Clarification):
                    print(f"? {ev.question}", end="")
                elif isinstance(ev, Final) and not streamed:
                    print(ev.text, end="")
                elif isinstance(ev, TurnFailed):
                    print(f"⚠ {ev.message}", end="")
            print()
    finally:
        await harness.close()
        await store.close()
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    import logging

    cfg = _load(args)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(_chat(cfg))


# -- pairing -----------------------------------------------------------------------------------------
def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


async def _pairing(cfg: Config, action: str, arg: str | None) -> int:
    """The operator's side of pairing, on the daemon's database (WAL: safe while it runs). Local
    access to the database is the credential here, so no guess limit applies; a stranger is not
    told of a decision made here (the daemon's chat connections are in another process), their next
    message simply gets through (or gets "declined")."""
    from .store import Store

    store = await Store.open(cfg.storage.path / "gateway.sqlite", cfg.storage.reserve_mb << 20)
    try:
        if action == "list":
            now = time.time()
            pending = await store.pairing_list()
            approved = await store.approved_list()
            print("pending:" if pending else "pending: none")
            for r in pending:
                state = "denied" if r.denied else ("expired" if r.expired(now) else "pending")
                asked = f"asked {_when(r.created)}; {state} until {_when(r.expires)}"
                print(f"  {r.code}  {r.user}  {r.name}  ({asked})")
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
    cfg = _load(args)
    if args.action in ("approve", "deny", "revoke") and not args.arg:
        print(f"chital: pairing {args.action} needs an argument", file=sys.stderr)
        return 2
    return asyncio.run(_pairing(cfg, args.action, args.arg))


def build_parser() -> argparse.ArgumentParser:
    help_ = "path to config.yaml (default: $CHITAL_CONFIG or ./config.yaml)"
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-c", "--config", help=help_)
    parser = argparse.ArgumentParser(prog="chital", description="A self-hosted agent in your team's chats.")
    parser.add_argument("-c", "--config", dest="config_top", help=help_)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", parents=[common], help="run the daemon").set_defaults(func=cmd_run)
    check = sub.add_parser(
        "check", parents=[common], help="validate config, build the model, report which channels are ready"
    )
    check.add_argument(
        "--online", action="store_true", help="also ask each service whether the credentials work"
    )
    check.set_defaults(func=cmd_check)
    sub.add_parser("chat", parents=[common], help="talk to the agent in this terminal").set_defaults(
        func=cmd_chat
    )
    pairing = sub.add_parser("pairing", parents=[common], help="approve users who asked for access")
    pairing.add_argument("action", choices=["list", "approve", "deny", "revoke"])
    pairing.add_argument("arg", nargs="?", help="the CODE to approve or deny, or the platform:user to revoke")
    pairing.set_defaults(func=cmd_pairing)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.config = args.config or args.config_top
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
