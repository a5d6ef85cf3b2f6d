"""The ``chital`` command: run, check, chat, pairing.

Exit codes: 0 fine, 1 the daemon could not start or ``check`` found a problem, 2 the configuration
is invalid or the command line is wrong. A failure is one ``chital: ...`` line on stderr, never a
traceback: the operator reads it in ``journalctl`` or ``docker logs``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time

from .cli_chat import cmd_chat
from .cli_common import config_path, load_config_arg
from .cli_pairing import cmd_pairing


# -- run ---------------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from .app import Daemon
    from .lifecycle import StartupError
    from .logs import setup_logging
    from .registry import channel_readiness

    cfg = load_config_arg(args)
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

    cfg = load_config_arg(args)
    print(f"config: {config_path(args.config) or '(built-in defaults)'} is valid")
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
